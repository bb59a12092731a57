"""What the routes share: the pipeline, its metrics, the LLM servers, the node's images."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from raas.agent.gateway import Gateway
from raas.api.image_store import ImageStoreMonitor
from raas.api.metrics import PipelineMetrics
from raas.api.tenants import TenantsWatch
from raas.llm.pool import BackendPool
from raas.pipeline import Pipeline
from raas.settings import ServeSettings
from raas.tenants import Tenants


@dataclass
class ServiceState:
    settings: ServeSettings
    pipeline: Pipeline
    metrics: PipelineMetrics
    llm: BackendPool
    # The node's image store as this server reports it (/v1/images, /metrics).
    images: ImageStoreMonitor
    # /process rollouts in flight under each job_id a ProRL client named them by (for /cancel).
    prorl_jobs: dict[str, set[str]] = field(default_factory=dict)
    # Agent programs' OpenAI-style sessions, one per job (raas.api.routes.gateway).
    gateway: Gateway | None = None
    # The served model's tokenizer, loaded off the event loop (the dashboard decodes with it).
    tokenizer: Callable[[], Awaitable[Any]] | None = None
    # The tenants file as last read; None: no tenants (one key, or none).
    tenants_watch: TenantsWatch | None = None

    def tenants(self) -> Tenants | None:
        return self.tenants_watch.current if self.tenants_watch is not None else None


async def service(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state
