"""The trajectory of one rollout, as the trainer receives it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Trajectory:
    """What a rollout produced so far.

    A task appends to it as it goes, so that a job that is cancelled or runs out of time still
    returns everything produced before that point. Token-level fields stay empty for tasks that
    need no model (the scripted countdown task).
    """

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    # 1 on tokens the policy generated, 0 on tokens the environment inserted.
    loss_mask: list[int] = field(default_factory=list)
    # Aligned with response_ids; 0.0 wherever loss_mask is 0.
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
