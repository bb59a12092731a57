"""Turning wire requests into jobs and jobs into wire answers (the /v1 routes; /process builds
its request from ProRL's terms in raas.api.prorl_compat)."""

from __future__ import annotations

from collections.abc import Sequence

from raas.api.errors import field_error
from raas.pipeline import JobRequest, JobView, Pipeline, RequestRejected
from raas.wire import JobStatus, RolloutRequest


def job_request(req: RolloutRequest) -> JobRequest:
    return JobRequest(
        req.instance,
        req.sampling_params,
        req.job_id,
        req.timeout_s,
        priority=req.priority,
        group=req.group,
        branch=req.branch,
    )


async def submit(pipeline: Pipeline, reqs: Sequence[RolloutRequest], batch: bool) -> list[JobView]:
    """Submit all or none; bad input becomes a FieldError naming the field (``jobs.3.instance``)."""
    try:
        return await pipeline.submit([job_request(r) for r in reqs])
    except RequestRejected as e:
        raise field_error(e.cause, ["jobs", e.index] if batch else []) from e


def status_of(view: JobView) -> JobStatus:
    return JobStatus(
        job_id=view.job_id,
        state=view.state.value,
        stage=view.stage.value if view.stage and not view.state.finished else None,
        result=view.result,
    )
