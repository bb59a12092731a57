"""What the pipeline tells its observers (metrics, usage, the dashboard's series)."""

from __future__ import annotations

from typing import Protocol

from raas.pipeline.job import Job
from raas.pipeline.states import JobState, Stage


class PipelineObserver(Protocol):
    """Hooks for metrics; called on the event loop, so they must not block."""

    def job_submitted(self, job: Job) -> None: ...

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None: ...

    def job_finished(self, job: Job, state: JobState) -> None: ...
