"""/v1/backends: register, list and remove inference servers at run time, and pause and resume
them all around a weight sync. Listing is anyone's; the rest acts on the pool every tenant shares,
so with a tenants file it needs the admin's key (raas.api.tenants.ADMIN_ONLY)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, status

from raas.api.errors import FieldError, responses
from raas.api.state import ServiceState, service
from raas.api.tenants import ADMIN_ONLY
from raas.llm.pool import Backend, NotInferenceServer
from raas.wire import Ack, BackendIn, BackendOut, PauseIn, PauseOut

router = APIRouter(prefix="/v1", tags=["backends"])
Service = Annotated[ServiceState, Depends(service)]


def backend_out(b: Backend) -> BackendOut:
    return BackendOut.model_validate(
        {
            "id": b.id,
            "url": b.url,
            "protocol": b.protocol,
            "capacity": b.capacity,
            "model": b.model,
            "healthy": b.healthy,
            "sessions": b.sessions,
            "load": b.load,
            "requests": b.requests,
            "failures": b.failures,
            "last_error": b.last_error,
        }
    )


@router.post(
    "/backends",
    status_code=status.HTTP_201_CREATED,
    response_model=BackendOut,
    dependencies=ADMIN_ONLY,
)
async def add_backend(req: BackendIn, svc: Service) -> BackendOut:
    """Register an inference server; the same URL again returns the one registered."""
    try:
        backend = await svc.llm.add_checked(req.url, req.protocol, req.capacity, req.model)
    except NotInferenceServer as e:
        raise FieldError(["url"], str(e), "not_inference_server") from e
    except ValueError as e:
        raise FieldError(["url"], str(e), "url_parsing") from e
    return backend_out(backend)


@router.get("/backends", response_model=list[BackendOut])
async def list_backends(svc: Service) -> list[BackendOut]:
    return [backend_out(b) for b in svc.llm.backends()]


@router.delete(
    "/backends/{backend_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=responses(404),
    dependencies=ADMIN_ONLY,
)
async def remove_backend(backend_id: str, svc: Service) -> None:
    if not await svc.llm.remove(backend_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no backend {backend_id!r}")


@router.post(
    "/backends:pause", response_model=PauseOut, responses=responses(504), dependencies=ADMIN_ONLY
)
async def pause_backends(req: PauseIn, svc: Service) -> PauseOut:
    """Pause the pool for a weight sync: no generation starts until ``/v1/backends:resume``;
    each backend is paused through its own route (vLLM's ``/pause``, SGLang's
    ``/pause_generation``, raas's engine) or drained where it has none. Answers once every
    backend is paused or drained (504: a drain that did not end; the pool stays paused)."""
    try:
        paused = await svc.llm.pause(req.mode, resume_after_s=req.resume_after_s)
    except TimeoutError as e:
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT, detail=str(e)) from e
    return PauseOut.model_validate({"backends": paused})


@router.post("/backends:resume", response_model=Ack, dependencies=ADMIN_ONLY)
async def resume_backends(svc: Service) -> Ack:
    """End a pause: the backends resume and generations start again (those a backend aborted
    go on from the tokens they had)."""
    await svc.llm.resume()
    return Ack()
