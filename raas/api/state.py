"""What the routes share: the pipeline, its metrics and the registered LLM servers."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from raas.api.metrics import PipelineMetrics
from raas.api.settings import ServeSettings
from raas.pipeline import Pipeline


@dataclass
class ServiceState:
    settings: ServeSettings
    pipeline: Pipeline
    metrics: PipelineMetrics
    # Inference servers registered through /add_llm_server; the LLM backend pool takes them over
    # once it exists.
    llm_servers: list[str] = field(default_factory=list)


async def service(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state
