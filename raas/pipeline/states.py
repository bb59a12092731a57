"""The states a job goes through, the stages that do the work, and who holds a job (its phase)."""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
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


FINAL_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED})


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
