"""What a trainer does with a sample that is not a plain one: a job that failed, and a response
that the trainer sees cut. One definition, used by ``to_batch``, the verl agent loop and the TRL
adapter (each says which of the choices its trainer can honour).

A failed job (state other than ``done``, or no reward) has no outcome: counting it in its group's
mean and std as reward 0 would tell GRPO the policy did badly where the infrastructure did.
``failed`` says what happens to it:

``"drop"`` (the default)
    it is no sample: out of its group's statistics, no row;
``"mask"``
    it is a row that carries no gradient (loss mask 0, advantage 0), out of its group's
    statistics;
``"drop_group"``
    a group with a member that failed for an infrastructure reason (error kind ``infra``) is
    dropped whole, so no group's statistics are over the survivors of an outage; other
    failures are dropped as with ``"drop"``.

A truncated sample is one the trainer sees shorter than what raas judged (``to_batch``'s
``max_length``, verl's ``response_length``, TRL's ``max_completion_length``): its reward was
earned by tokens the trainer does not see. ``truncated`` says what it gets:

``"mask"`` (the default)
    no gradient (loss mask 0), and its reward still counts in its group's statistics: it is a
    real outcome of the policy, so the baseline stays unbiased, but the tokens the trainer
    sees are not credited with what the unseen ones earned;
``"penalise"``
    the reward ``truncated_reward`` (default 0.0) instead of its own, in its group's statistics
    and on its tokens (DAPO's overlong punishment, as a constant);
``"keep"``
    its own reward, on the tokens the trainer sees (what a trainer did before this choice).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import Literal, TypeVar

from raas.wire import RolloutResult

FailedChoice = Literal["drop", "mask", "drop_group"]
TruncatedChoice = Literal["mask", "penalise", "keep"]
FAILED_CHOICES: tuple[FailedChoice, ...] = ("drop", "mask", "drop_group")
TRUNCATED_CHOICES: tuple[TruncatedChoice, ...] = ("mask", "penalise", "keep")
DEFAULT_FAILED: FailedChoice = "drop"
DEFAULT_TRUNCATED: TruncatedChoice = "mask"

Choice = TypeVar("Choice", bound=str)
log = logging.getLogger(__name__)


def check_choice(name: str, value: object, choices: tuple[Choice, ...]) -> Choice:
    """``value`` if it is one of ``choices``, else a ValueError naming the option and them."""
    for choice in choices:
        if value == choice:
            return choice
    raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def check_truncated_reward(value: object) -> float:
    """``truncated_reward`` as a float, or a ValueError where it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"truncated_reward must be a finite number; got {value!r}")
    return float(value)


def truncated_outcome(
    reward: float, truncated: TruncatedChoice, truncated_reward: float
) -> tuple[float, bool]:
    """The reward a truncated sample gets, and whether its tokens are masked (see the module
    docstring)."""
    if truncated == "penalise":
        return truncated_reward, False
    return reward, truncated == "mask"


def failed_by_infra(result: RolloutResult) -> bool:
    """Whether a result failed for an infrastructure reason (``"drop_group"``'s test)."""
    return result.state != "done" and result.error is not None and result.error.kind == "infra"


class NoGradient(RuntimeWarning):
    """A whole batch whose loss masks are all 0: the trainer's loss and gradient are 0."""


class GradientWatch:
    """Says once, loudly (a warning and the log), when a batch carries no gradient at all: on
    a small model every rollout may hit the length cap and be masked, and a trainer then shows
    a loss and grad norm of 0 and nothing else. ``cap``: the trainer's name for its length
    limit (``max_completion_length=64``)."""

    def __init__(self) -> None:
        self.said = False

    def check(self, masks: Sequence[Sequence[int]], cut: int, failed: int, cap: str | None) -> None:
        if self.said or not masks or any(any(mask) for mask in masks):
            return
        self.said = True
        why = f"{cut} of {len(masks)} completions cut"
        why += f" to {cap} and masked" if cap else " and masked"
        message = (
            f"raas: no token of this batch carries a gradient (every loss mask is all 0: {why},"
            f" {failed} failed), so its loss and gradient are 0. Raise the length cap, or pass"
            " truncated='penalise' or 'keep'. (Said once.)"
        )
        log.warning(message)
        warnings.warn(message, NoGradient, stacklevel=3)
