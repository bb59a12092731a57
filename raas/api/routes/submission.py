"""Turning wire requests into jobs and jobs into wire answers (the /v1 routes; /process builds
its request from ProRL's terms in raas.api.prorl_compat)."""

from __future__ import annotations

from collections.abc import Sequence

from raas.api.errors import field_error
from raas.api.tenants import Caller
from raas.pipeline import JobRequest, JobView, Pipeline, RequestRejected
from raas.wire import JobStatus, RolloutRequest, RolloutResult


async def submit(
    pipeline: Pipeline, reqs: Sequence[RolloutRequest], batch: bool, who: Caller
) -> list[JobView]:
    """Submit all or none, as ``who``'s jobs; bad input becomes a FieldError naming the field
    (``jobs.3.instance``)."""
    try:
        return await pipeline.submit([JobRequest(r, who.submits_as) for r in reqs])
    except RequestRejected as e:
        raise field_error(e.cause, ["jobs", e.index] if batch else []) from e


def status_of(view: JobView, who: Caller) -> JobStatus:
    return JobStatus(
        job_id=who.show(view.job_id),
        state=view.state.value,
        stage=view.stage.value if view.stage and not view.state.finished else None,
        result=shown(view.result, who) if view.result is not None else None,
    )


def shown(result: RolloutResult, who: Caller) -> RolloutResult:
    """``result`` as ``who`` sees it: under the id its tenant knows the job by."""
    job_id = who.show(result.job_id)
    return result if job_id == result.job_id else result.model_copy(update={"job_id": job_id})
