"""What the routes share: the pipeline, its metrics and the registered LLM servers."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from raas.api.metrics import PipelineMetrics
from raas.llm.pool import BackendPool
from raas.pipeline import Pipeline
from raas.settings import ServeSettings


@dataclass
class ServiceState:
    settings: ServeSettings
    pipeline: Pipeline
    metrics: PipelineMetrics
    llm: BackendPool


async def service(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state
