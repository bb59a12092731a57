"""What goes to an inference backend and what comes back, whatever its protocol."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# A strict integer: Annotated[int, Field(strict=True, ...bounds), WHOLE]. A JSON 2.5, true or "2"
# is never silently turned into an int (and ints stay exact), but 2.0 is 2, as JSON Schema's
# integer (what the document says) reads it; the bounds before WHOLE, so the document gives them.
WHOLE = BeforeValidator(_whole)


# The largest seed every backend takes (a signed 64-bit integer: vLLM, SGLang, torch).
MAX_SEED = 2**63 - 1
Seed = Annotated[int, Field(strict=True, ge=0, le=MAX_SEED), WHOLE]
TokenId = Annotated[int, Field(strict=True, ge=0), WHOLE]
# The bounds of each sampling key, shared by SamplingParams and the OpenAI requests that set them.
# StrictFloat takes ints (JSON 1 is an int) but not bools or strings.
Temperature = Annotated[StrictFloat, Field(ge=0.0)]
TopP = Annotated[StrictFloat, Field(gt=0.0, le=1.0)]
MaxTokens = Annotated[int, Field(strict=True, ge=1), WHOLE]


class SamplingParams(BaseModel):
    """How to sample one generation: the one list of sampling keys, with their bounds.

    A request's ``sampling_params`` is validated through this model (or a task's extension of
    it, see raas.agent.loop.LoopParams), so an unknown key or a value out of range is an error
    naming that key, and what reaches a backend is always in range and finite.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: Annotated[int, Field(strict=True, ge=-1), WHOLE] = Field(
        default=-1, description="-1: no top-k cut"
    )
    max_tokens: MaxTokens = Field(default=512, description="new tokens per generation")
    stop_token_ids: tuple[TokenId, ...] = ()
    seed: Seed | None = None


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token or EOS) or "length"
    backend: str = ""
    cached_tokens: int = 0  # prompt tokens the backend served from its prefix cache
    latency_s: float = 0.0
    # The policy (weight) version each token was sampled under, as the backend said; None where
    # it said nothing (vLLM, verl), or nothing raas can order (an SGLang version that is no
    # integer, such as its default "default").
    policy_versions: list[int] | None = None


# A streamed generation that sends nothing for this long has stalled (no first token, or no next
# one): the request fails as the backend's fault, and is retried or moved. Generous, because a
# busy vLLM may queue a request for minutes before its first token (setting llm_stall_timeout_s).
STALL_TIMEOUT_S = 300.0


@dataclass
class Heard:
    """When (``time.monotonic()``) a token of a session's model calls last came; None: none
    yet, of the calls in flight and those that overlapped them."""

    at: float | None = None


@dataclass
class LiveCall:
    """A model call in flight, as the pool sees it: the backend it went to (the last, where it
    moved), since when (``time.monotonic()``), and the tokens streamed so far. A backend that
    streams counts each token as it comes; one that answers whole (SGLang, verl here) counts
    nothing until it answers, so ``tokens == 0`` means "no token yet", never "stalled" alone."""

    backend: str
    started: float
    tokens: int = 0
    streaming: bool = False  # the backend streams this call: tokens are counted as they come
    # When a token of the session's calls last came, shared by the calls of one session that
    # overlap (an agent behind the gateway may make several at once): a call that waits while
    # its siblings get tokens waits on its own session, not on a stalled backend.
    heard: Heard = field(default_factory=Heard)
    # When the backend it went to last sent anything, to any session (an answer, a token): a
    # backend that answers whole and answered others while this call waited is alive, and the
    # wait is this call's own long generation, not a stall.
    backend_heard: Heard | None = None

    def count(self, tokens: int) -> None:
        """``tokens`` more came (streamed, or a whole answer's)."""
        self.tokens += tokens
        if tokens:
            self.heard.at = time.monotonic()
            if self.backend_heard is not None:
                self.backend_heard.at = self.heard.at

    def silent_s(self, now: float) -> float:
        """How long the call has gone with no sign that its backend serves it: since it began,
        or since its session's last token (an agent behind the gateway may make several calls
        at once: one that waits while its siblings get tokens waits on its own session, not on
        a stalled backend); and, where the backend answers whole (so says nothing of a call
        until it ends), since the backend last answered anyone (one that did is alive, and the
        wait is this call's own long generation)."""
        silent = now - self.started
        if self.heard.at is not None:
            silent = min(silent, now - self.heard.at)
        answered = self.backend_heard.at if self.backend_heard is not None else None
        if not self.streaming and answered is not None and answered > self.started:
            silent = min(silent, now - answered)
        return silent


class BackendError(Exception):
    """A backend failed. ``transient`` errors are worth retrying (on it, or on another)."""

    def __init__(
        self,
        backend: str,
        message: str,
        transient: bool = True,
        retry_after_s: float | None = None,  # what the backend asked for (Retry-After)
    ) -> None:
        super().__init__(f"{backend}: {message}")
        self.backend = backend
        self.transient = transient
        self.retry_after_s = retry_after_s


class NoBackendAvailable(Exception):
    pass
