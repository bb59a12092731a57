"""Service status, the node's images, liveness and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from raas.api.metrics import CONTENT_TYPE
from raas.api.state import ServiceState, service
from raas.api.tenants import Caller, caller
from raas.api.usage import read_usage
from raas.wire import NodeImages, ServiceStatus, UsageReport

router = APIRouter(tags=["system"])
Service = Annotated[ServiceState, Depends(service)]
Who = Annotated[Caller, Depends(caller)]


def service_status(svc: ServiceState) -> ServiceStatus:
    return ServiceStatus.model_validate(
        {
            **svc.pipeline.stats(),
            "tasks": svc.pipeline.registry.names(),
            "llm_servers": [b.url for b in svc.llm.backends()],
            "images_version": svc.images.version,
        }
    )


@router.get("/v1/status", response_model=ServiceStatus)
async def get_status(svc: Service) -> ServiceStatus:
    """Queue depth and active jobs per stage, totals by state, uptime."""
    return service_status(svc)


@router.get("/v1/images", response_model=NodeImages)
async def get_images(svc: Service) -> NodeImages:
    """The images the image store of this server's node holds (as last read: at most a few
    seconds old), and the version /v1/status names them by."""
    return NodeImages(version=svc.images.version or "", images=list(svc.images.names))


@router.get("/metrics", response_class=Response)
async def metrics(svc: Service, who: Who) -> Response:
    """Prometheus text format. The per-tenant series (``raas_tenant_*``) are the admin's only:
    a tenant reads its own use at GET /v1/usage."""
    return Response(svc.metrics.render(per_tenant=who.tenant is None), media_type=CONTENT_TYPE)


@router.get("/v1/usage", response_model=UsageReport)
async def get_usage(
    svc: Service,
    who: Who,
    since_s: Annotated[float, Query(ge=0, description="The period, back from now.")] = 86400.0,
) -> UsageReport:
    """Each tenant's jobs (accepted, finished by state), stage and sandbox seconds and LLM tokens
    over the last ``since_s`` seconds (a day at most: kept by the minute, in memory, since the
    server started; /metrics counts the same since the start). A tenant sees its own row only,
    the admin every tenant's."""
    return read_usage(svc.pipeline.ledger, since_s, only=who.tenant)
