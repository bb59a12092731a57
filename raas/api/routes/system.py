"""Service status, liveness and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from raas.api.metrics import CONTENT_TYPE
from raas.api.state import ServiceState, service
from raas.wire import ServiceStatus

router = APIRouter(tags=["system"])
Service = Annotated[ServiceState, Depends(service)]


def service_status(svc: ServiceState) -> ServiceStatus:
    return ServiceStatus.model_validate(
        {
            **svc.pipeline.stats(),
            "tasks": svc.pipeline.registry.names(),
            "llm_servers": [b.url for b in svc.llm.backends()],
        }
    )


@router.get("/v1/status", response_model=ServiceStatus)
async def get_status(svc: Service) -> ServiceStatus:
    """Queue depth and active jobs per stage, totals by state, uptime."""
    return service_status(svc)


@router.get("/metrics", response_class=Response)
async def metrics(svc: Service) -> Response:
    """Prometheus text format."""
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE)
