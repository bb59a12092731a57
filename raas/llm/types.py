"""What goes to an inference backend and what comes back, whatever its protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> SamplingParams:
        """Only the sampling keys; unknown keys are the caller's to reject."""
        values = {k: params[k] for k in SAMPLING_KEYS if params.get(k) is not None}
        if "stop_token_ids" in values:
            values["stop_token_ids"] = tuple(int(t) for t in values["stop_token_ids"])
        return cls(**values)


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token or EOS) or "length"
    backend: str = ""
    cached_tokens: int = 0  # prompt tokens the backend served from its prefix cache
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class BackendError(Exception):
    """A backend failed. ``transient`` errors are worth retrying (on it, or on another)."""

    def __init__(self, backend: str, message: str, transient: bool = True) -> None:
        super().__init__(f"{backend}: {message}")
        self.backend = backend
        self.transient = transient


class NoBackendAvailable(Exception):
    pass
