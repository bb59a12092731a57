"""Routes with the names and bodies ProRL Agent's clients already use.

``/process`` takes what ProRL Agent's trainer integration and NeMo Gym's prorl agent send (see
raas.api.prorl_compat) and answers a ProRLResult: the fields their code reads, built from the
job's RolloutResult. Every /process call is a new rollout, as on ProRL's server: its job_id is
a name for /cancel (NeMo Gym sends the instance id, the same for every rollout of an instance),
not an idempotency key as on /v1. The job gets the name itself when no job has it yet, else the
name plus ``@`` and a unique suffix; the answer says which. ``/start``, ``/stop`` and the LLM
server routes act on the whole server: with a tenants file they need the admin's key.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends

from raas.api.errors import FieldError, field_error, responses
from raas.api.prorl_compat import ProRLCall, prorl_call, prorl_result
from raas.api.routes.rollouts import cancel_job
from raas.api.routes.submission import shown
from raas.api.routes.system import service_status
from raas.api.state import ServiceState, service
from raas.api.tenants import ADMIN_ONLY, Caller, caller
from raas.llm.pool import NotInferenceServer
from raas.pipeline import JobIdConflict, JobRequest, JobView, Pipeline, RequestRejected
from raas.wire import (
    Ack,
    CancelRequest,
    JobStatus,
    LLMServerRequest,
    ProcessRequest,
    ProRLResult,
    ServiceStatus,
)

router = APIRouter(tags=["prorl-compatible"])
Service = Annotated[ServiceState, Depends(service)]
Who = Annotated[Caller, Depends(caller)]
SUFFIX = 12  # hex digits after the '@' of a named /process job's id
MAX_JOB_ID = 200


def process_job_id(name: str | None) -> str:
    """A fresh job id; under ``name`` (for /cancel) when the client gave one."""
    suffix = uuid.uuid4().hex
    if name is None:
        return suffix
    return f"{name[: MAX_JOB_ID - SUFFIX - 1]}@{suffix[:SUFFIX]}"


async def submit_new(pipeline: Pipeline, call: ProRLCall, name: str | None, tenant: str) -> JobView:
    """A new job of ``tenant`` for ``call``: ``name`` itself when no job has that id yet, else a
    fresh id under it (submit's own check, past its last await, settles races between equal
    names)."""
    if name is not None:
        request = JobRequest.of(call.instance, call.sampling_params, name, tenant=tenant)
        try:
            (view,) = await pipeline.submit([request])
        except JobIdConflict:
            pass
        else:
            if view.created:
                return view
    request = JobRequest.of(
        call.instance, call.sampling_params, process_job_id(name), tenant=tenant
    )
    (view,) = await pipeline.submit([request])
    return view


@router.post("/process", response_model=ProRLResult, responses=responses(429, 503))
async def process(req: ProcessRequest, svc: Service, who: Who) -> ProRLResult:
    """Run a rollout and block until its result is ready; the answer is ProRL-shaped."""
    pipeline = svc.pipeline
    call = prorl_call(req.instance, req.sampling_params, pipeline.registry)
    try:
        view = await submit_new(pipeline, call, req.job_id, who.submits_as)
    except RequestRejected as e:
        raise field_error(call.locate(e.cause), []) from e
    # Under the name's key: one tenant's /cancel of a name reaches none of another's jobs.
    name = who.key(req.job_id) if req.job_id is not None else None
    named = svc.prorl_jobs.setdefault(name, set()) if name is not None else None
    try:
        if named is not None:
            named.add(view.job_id)
        job = pipeline.active(view.job_id)
        if job is not None:
            await job.done.wait()
        final = await pipeline.lookup(view.job_id)
    finally:
        if named is not None:
            named.discard(view.job_id)
            if not named:
                svc.prorl_jobs.pop(str(name), None)
    assert final is not None and final.result is not None
    return prorl_result(shown(final.result, who), call, req.instance)


@router.post("/cancel", response_model=JobStatus, responses=responses(404))
async def cancel(req: CancelRequest, svc: Service, who: Who) -> JobStatus:
    """Cancel the /process rollouts running under this name, or else the job of this id."""
    key = who.key(req.job_id)
    running = sorted(svc.prorl_jobs.get(key, ()))
    if not running:
        return await cancel_job(svc, key, who)
    statuses = [await cancel_job(svc, job_key, who) for job_key in running]
    return statuses[-1]


@router.get("/status", response_model=ServiceStatus)
async def status(svc: Service) -> ServiceStatus:
    return service_status(svc)


@router.post("/start", response_model=Ack, responses=responses(503), dependencies=ADMIN_ONLY)
async def start(svc: Service) -> Ack:
    """Accept new jobs again after /stop (not once the server is shutting down: a 503)."""
    svc.pipeline.resume()
    return Ack(message="accepting jobs")


@router.post("/stop", response_model=Ack, dependencies=ADMIN_ONLY)
async def stop(svc: Service) -> Ack:
    """Drain: accept no new jobs; jobs in flight go on and finish."""
    svc.pipeline.pause()
    return Ack(message=f"draining: {svc.pipeline.stats()['in_flight']} jobs in flight go on")


@router.post("/add_llm_server", response_model=Ack, dependencies=ADMIN_ONLY)
async def add_llm_server(req: LLMServerRequest, svc: Service) -> Ack:
    """Register an inference server in the backend pool (same as POST /v1/backends)."""
    settings = svc.settings
    try:
        await svc.llm.add_checked(
            req.address,
            req.protocol or settings.inference.llm_protocol,
            req.capacity or settings.inference.llm_capacity,
        )
    except NotInferenceServer as e:
        raise FieldError(["address"], str(e), "not_inference_server") from e
    except ValueError as e:
        raise FieldError(["address"], str(e), "url_parsing") from e
    return Ack(message=f"{len(svc.llm.backends())} LLM servers registered")


@router.post("/clear_llm_server", response_model=Ack, dependencies=ADMIN_ONLY)
async def clear_llm_server(svc: Service) -> Ack:
    """Remove every backend (e.g. before a weight update); pinned jobs move on their next turn."""
    await svc.llm.clear()
    return Ack(message="no LLM servers registered")
