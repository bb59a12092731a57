"""The states a job goes through and the stages that do the work."""

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
