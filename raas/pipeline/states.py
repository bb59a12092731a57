"""The states a job goes through, the stages that do the work, and who holds a job (its phase)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, get_args

from raas import wire
from raas.wire import JobStateName, StageName


class Stage(StrEnum):
    """wire.StageName as an enum (checked below), in the order a job goes through them."""

    INIT = "init"
    RUN = "run"
    EVAL = "eval"

    @property
    def next(self) -> Stage | None:
        order = list(Stage)
        i = order.index(self)
        return order[i + 1] if i + 1 < len(order) else None

    @property
    def previous(self) -> Stage | None:
        order = list(Stage)
        i = order.index(self)
        return order[i - 1] if i > 0 else None


class JobState(StrEnum):
    """wire.JobStateName as an enum (checked below)."""

    QUEUED = "queued"
    INIT = "init"
    RUN = "run"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINAL_STATES


def _spelled_as(names: Any, enum: type[StrEnum]) -> None:
    """The wire's literal ``names`` is the one spelling: ``enum`` (named for the type checker)
    must hold its values, in its order."""
    values = tuple(member.value for member in enum)
    if values != get_args(names):
        raise TypeError(f"{enum.__name__} {values} is not the wire's {get_args(names)}")


_spelled_as(StageName, Stage)
_spelled_as(JobStateName, JobState)
FINAL_STATES = frozenset(JobState(name) for name in wire.FINAL_STATES)


class Phase(StrEnum):
    """Who holds a job in flight, so who finishes it (a cancel asks that one)."""

    QUEUED = "queued"  # waits in a stage queue, held by no one: a cancel takes it out, finishes it
    HELD = "held"  # a worker holds it (in a stage, or handing it on), or a rerun waits for room
    RETRYING = "retrying"  # a failed attempt's context is being released; the next one follows
    FINISHING = "finishing"  # being cleaned up and its result written: nothing may end it now
    FINISHED = "finished"


# The phases a job may go to from each (Job.move raises on any other step).
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.HELD, Phase.FINISHING}),
    Phase.HELD: frozenset({Phase.QUEUED, Phase.RETRYING, Phase.FINISHING}),
    Phase.RETRYING: frozenset({Phase.HELD, Phase.FINISHING}),
    Phase.FINISHING: frozenset({Phase.FINISHED}),
    Phase.FINISHED: frozenset(),
}

# A job in these is being finished, or is: no one else may end it, or finish it again.
ENDED = frozenset({Phase.FINISHING, Phase.FINISHED})


class BadTransition(RuntimeError):
    """A job was moved to a phase its own may not go to: a bug of the pipeline's."""
