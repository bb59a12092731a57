"""/v1/rollouts: submit, look up, long-poll, cancel, page through and export jobs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Response, status
from fastapi.responses import StreamingResponse
from pydantic import Field

from raas.api.errors import ErrorBody, responses
from raas.api.routes.submission import shown, status_of, submit
from raas.api.state import ServiceState, service
from raas.api.tenants import Caller, caller
from raas.store.dashboard import SEARCH_CHARS, SEARCH_ROWS, JobFilter
from raas.store.export import stream_jsonl
from raas.wire import (
    BatchRequest,
    BatchSubmitted,
    ExportedResult,
    FinalStateName,
    JobStatus,
    ResultPage,
    RolloutRequest,
    RunningJob,
    RunningPage,
    Submitted,
)

router = APIRouter(prefix="/v1", tags=["rollouts"])
Service = Annotated[ServiceState, Depends(service)]
Who = Annotated[Caller, Depends(caller)]
MAX_WAIT_S = 300.0
# Every cursor or row id a query takes is compared with an SQLite INTEGER (signed 64-bit): a
# larger one would overflow there (a 500), so it is a 422 here, and the document says the bound.
MAX_CURSOR = 2**63 - 1
Cursor = Annotated[int, Field(ge=0, le=MAX_CURSOR)]


async def finished_filter(
    who: Who,
    state: Annotated[
        FinalStateName | None,
        Query(description="Only jobs in this state (a final one: only finished jobs are here)."),
    ] = None,
    data_source: Annotated[str | None, Query(description="Only jobs of this data_source.")] = None,
    error_type: Annotated[str | None, Query(description="Only jobs that failed so.")] = None,
    min_reward: Annotated[
        float | None, Query(allow_inf_nan=False, description="Only jobs rewarded this or more.")
    ] = None,
    max_reward: Annotated[
        float | None, Query(allow_inf_nan=False, description="Only jobs rewarded this or less.")
    ] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=SEARCH_CHARS,
            description="Only jobs with this text (case aside, ASCII) in their job id, instance_id,"
            " data_source, task, error type or message, or the judge's note on a reward below a"
            " pass; `%` and `_` are themselves, not wildcards. Among the newest"
            f" {SEARCH_ROWS:,} finished jobs of the server (a search reads each one's result).",
        ),
    ] = None,
) -> JobFilter:
    """Which finished jobs a read takes: the dashboard's job list and the export filter alike
    (one definition, so that an export is the list a person filtered), the caller's own only."""
    return JobFilter(
        state=state,
        data_source=data_source,
        error_type=error_type,
        min_reward=min_reward,
        max_reward=max_reward,
        tenant=who.tenant,
        search=q or None,
    )


FinishedFilter = Annotated[JobFilter, Depends(finished_filter)]


# A branch's parent is looked up, not validated: a job the server does not know is a 404.
NO_PARENT = {
    "model": ErrorBody,
    "description": "A `branch` names a job this server does not know: nothing was accepted.",
}


@router.post(
    "/rollouts",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=Submitted,
    responses={
        200: {"model": Submitted, "description": "The job_id is known: that job."},
        404: NO_PARENT,
        **responses(409, 429, 503),
    },
)
async def submit_rollout(
    req: RolloutRequest, svc: Service, who: Who, response: Response
) -> Submitted:
    """Submit one job; resubmitting a known ``job_id`` returns that job (200, created false)."""
    (view,) = await submit(svc.pipeline, [req], batch=False, who=who)
    if not view.created:
        response.status_code = status.HTTP_200_OK
    return Submitted(job_id=who.show(view.job_id), state=view.state.value, created=view.created)


@router.post(
    "/rollouts:batch",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=BatchSubmitted,
    responses={404: NO_PARENT, **responses(409, 429, 503)},
)
async def submit_batch(req: BatchRequest, svc: Service, who: Who) -> BatchSubmitted:
    """Submit many jobs: all are accepted, or none (429 when the INIT queue lacks room)."""
    views = await submit(svc.pipeline, req.jobs, batch=True, who=who)
    return BatchSubmitted(
        jobs=[
            Submitted(job_id=who.show(v.job_id), state=v.state.value, created=v.created)
            for v in views
        ]
    )


@router.get("/rollouts/{job_id}", response_model=JobStatus, responses=responses(404))
async def get_rollout(
    job_id: str,
    svc: Service,
    who: Who,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            allow_inf_nan=False,
            description="Long-poll: wait up to this many seconds.",
        ),
    ] = 0.0,
) -> JobStatus:
    view = await svc.pipeline.wait(who.key(job_id), wait)
    if view is None:
        raise no_job(job_id)
    return status_of(view, who)


def no_job(job_id: str) -> HTTPException:
    """The answer for a job the caller does not know (another tenant's too: 404, not 403)."""
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with job_id {job_id!r}")


@router.post("/rollouts/{job_id}/cancel", response_model=JobStatus, responses=responses(404))
async def cancel_rollout(job_id: str, svc: Service, who: Who) -> JobStatus:
    """Cancel a job; answers once its cleanup has run (or with its state so far, if slow)."""
    return await cancel_job(svc, who.key(job_id), who)


async def cancel_job(svc: ServiceState, key: str, who: Caller) -> JobStatus:
    """Cancel the job of ``key`` (``who``'s: ``who.key`` made it)."""
    job = svc.pipeline.cancel(key)
    if job is not None:
        settle_s = svc.settings.pipeline.cancel_grace_s + 5.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(job.done.wait(), timeout=settle_s)
    view = await svc.pipeline.lookup(key)
    if view is None:
        raise no_job(who.show(key))
    return status_of(view, who)


@router.get("/rollouts:running", response_model=RunningPage)
async def list_running(
    svc: Service, who: Who, limit: Annotated[int, Query(ge=1, le=10000)] = 1000
) -> RunningPage:
    """Jobs in flight, oldest first: their stage, turns and tokens so far, time since submission."""
    now = time.time()
    jobs = []
    mine = [j for j in svc.pipeline.in_flight() if who.tenant in (None, j.request.tenant)]
    for job in mine[:limit]:
        prompt, response = job.tokens_so_far()
        jobs.append(
            RunningJob(
                job_id=who.show(job.id),
                data_source=job.data_source,
                instance_id=job.instance_id,
                task=job.task,
                state=job.state.value,
                stage=job.stage.value if job.stage is not None else None,
                turns=len(job.partial_trajectory().turns),
                prompt_tokens=prompt,
                response_tokens=response,
                elapsed_s=now - job.timing.submitted_at,
                attempts=job.attempts,
            )
        )
    return RunningPage(jobs=jobs)


@router.get("/rollouts", response_model=ResultPage)
async def list_results(
    svc: Service,
    who: Who,
    # Only finished jobs are listed; a Literal, so a bad state is FastAPI's own 422 and the
    # OpenAPI document lists the values.
    state: Annotated[
        FinalStateName | None,
        Query(
            description="Only results in this state (a final one: only finished jobs are listed)."
        ),
    ] = None,
    since: Annotated[Cursor, Query(description="Cursor: next_since of the previous page.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ResultPage:
    """Finished results in the order they finished, including those from before a restart."""
    page = await svc.pipeline.store.finished(
        JobFilter(state=state, tenant=who.tenant), since, limit
    )
    results = [shown(r.result, who) for r in page.records if r.result is not None]
    return ResultPage(results=results, next_since=page.next_since)


class JsonLines(StreamingResponse):
    media_type = "application/x-ndjson"


# Formats a server streams. Parquet is written where the rows arrive (`raas export --server`):
# its footer comes last, so a Parquet stream could not be read until it was whole.
ExportFormat = Literal["jsonl"]


@router.get(
    "/rollouts:export",
    response_class=JsonLines,
    responses={
        200: {
            "model": ExportedResult,
            "description": "A result a line (JSON lines), in the order the jobs finished.",
        }
    },
)
async def export_results(
    svc: Service,
    where: FinishedFilter,
    # One format so far: taken (and checked) so that a client names what it reads.
    fmt: Annotated[
        ExportFormat, Query(alias="format", description="The rows' format: `jsonl`.")
    ] = "jsonl",
) -> JsonLines:
    """Every result that had finished when the request came (those from before a restart too)
    and that the filters take (those of GET /v1/dashboard/jobs), streamed: a tenant's key gets
    its own jobs', the admin's every job's. Each row is under the id its tenant knows the job
    by, with that tenant named in ``tenant`` (null for the admin's own jobs, so for every job
    of a server without tenants): ``raas export --server URL``."""
    return JsonLines(stream_jsonl(svc.pipeline.store, where))
