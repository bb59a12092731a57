"""What a caller may see of a job, alive (its Job) or long finished (its record)."""

from __future__ import annotations

from dataclasses import dataclass

from raas.pipeline.job import Job
from raas.pipeline.states import JobState, Stage
from raas.store.records import JobRecord
from raas.wire import RolloutResult


@dataclass(frozen=True)
class JobView:
    """What a caller may see of a job, alive or long finished."""

    job_id: str
    state: JobState
    stage: Stage | None
    result: RolloutResult | None
    created: bool = False  # True when this submission created the job (not a resubmission)


def view_of(job: Job, created: bool = False) -> JobView:
    return JobView(job.id, job.state, job.stage, job.result, created)


def record_view(record: JobRecord) -> JobView:
    return JobView(record.job_id, JobState(record.state), None, record.result)
