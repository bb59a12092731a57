"""The ASGI application: one pipeline, one result store, the routes."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI

import raas
from raas.agent.gateway import is_gateway_path
from raas.agent.snapshots import Snapshots
from raas.api.auth import LOGIN_PATH, ApiKeyMiddleware
from raas.api.body_limit import BodyLimitMiddleware
from raas.api.browser_guard import UNSAFE_METHODS, BrowserGuardMiddleware, guard_policy
from raas.api.errors import PathMethods, install_error_handlers, one_value_per_query_key, responses
from raas.api.image_store import ImageStoreMonitor
from raas.api.metrics import PipelineMetrics
from raas.api.openapi import (
    document_api_key,
    document_form_refusal,
    document_instances,
    document_streams,
)
from raas.api.routes import backends, dashboard, gateway, prorl, rollouts, system
from raas.api.state import ServiceState
from raas.api.tenants import watch_tenants
from raas.images.store import ImageStore
from raas.llm.models import loaded_vocab_size
from raas.llm.pool import BackendPool, PoolConfig
from raas.pipeline import Pipeline, PipelineConfig, policies_of
from raas.pipeline.checkpoints import StoredCheckpoints
from raas.sandbox import claim_runtime_dir, sandbox_config
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.services import TaskServices, egress_of

log = logging.getLogger(__name__)


def runtime_key(db: Path) -> str:
    """What a server's sandbox directory is keyed by: its database, which a restart reuses."""
    return str(db.resolve())


async def _report_backends(llm: BackendPool, timeout_s: float = 5.0) -> None:
    """Say at start-up when agent jobs cannot run: no backend, or one that does not answer."""
    if not llm.backends():
        log.warning(
            "no LLM backend: agent tasks fail until one is added (--llm URL, POST /v1/backends)"
        )
        return
    try:
        silent = await asyncio.wait_for(llm.unanswered(), timeout_s)
    except TimeoutError:
        silent = {"(all)": f"no answer within {timeout_s:g} s"}
    for url, why in silent.items():
        log.warning(
            "LLM backend %s does not answer (%s): its jobs fail until it does; check --llm",
            url,
            why,
        )


def create_app(settings: ServeSettings, registry: TaskRegistry | None = None) -> FastAPI:
    """Build the service. The pipeline starts and drains with the app's lifespan."""
    tasks = registry if registry is not None else TaskRegistry.from_entry_points()
    # Read now: a tenants file that cannot be used stops the server before it starts.
    watch = watch_tenants(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = ResultStore(settings.server.db)
        await store.open()
        metrics = PipelineMetrics()
        # Token ids from a backend are checked against the tokenizer's size once it is loaded
        # (the agent loop and the gateway load it before their first request).
        inference = settings.inference
        llm = BackendPool(
            PoolConfig(stream=inference.llm_stream, stall_timeout_s=inference.llm_stall_timeout_s),
            functools.partial(loaded_vocab_size, inference.tokenizer),
        )
        for address in inference.llm:
            llm.add(address, inference.llm_protocol, inference.llm_capacity)
        # The sandboxes' own directory, keyed by the database: a restart after a crash kills
        # and removes what the crashed server's sandboxes left.
        runtime = await asyncio.to_thread(claim_runtime_dir, runtime_key(settings.server.db))
        egress_policy, egress_caps = egress_of(settings.sandboxes)
        services = TaskServices(
            llm=llm,
            tokenizer_name=inference.tokenizer,
            sandbox_config=sandbox_config(
                settings.sandboxes.sandbox, runtime_dir=runtime.path, paths=settings.paths
            ),
            warm_sandboxes=settings.sandboxes.warm_sandboxes,
            snapshots=Snapshots(settings.sandboxes.max_snapshots),
            agents=settings.agents,
            tasks=settings.tasks,
            prepared_bytes=int(settings.http.max_body_mb * 2**20),
            egress=egress_policy,
            egress_caps=egress_caps,
        )
        pipeline = Pipeline(
            tasks,
            store,
            PipelineConfig.from_settings(settings.pipeline),
            services=services,
        )
        services.checkpoints = StoredCheckpoints(
            store, lambda tenant: pipeline.config.tenants(tenant).quotas.max_checkpoint_mb
        )
        metrics.watch(pipeline)
        if watch is not None:  # the tenants file's weights and quotas, now and at each reload
            pipeline.set_tenants(policies_of(watch.current))
            watch.on_change = lambda tenants: pipeline.set_tenants(policies_of(tenants))
        # What the node's image store holds, for the clients' placement and /metrics: read
        # once before the first request, then kept fresh in the background.
        images = ImageStoreMonitor(ImageStore(services.image_store_dir()))
        await images.refresh()
        images.start()
        metrics.watch_images(images)
        llm.start()
        app.state.service = ServiceState(
            settings,
            pipeline,
            metrics,
            llm,
            images,
            gateway=services.gateway,
            tokenizer=services.tokenizer_async,
            tenants_watch=watch,
        )
        if watch is not None:
            watch.start()
        await pipeline.start()
        await _report_backends(llm)
        log.info(
            "raas ready: tasks %s, results in %s", ", ".join(tasks.names()), settings.server.db
        )
        # uvicorn names the address alone; the page a person opens is said here.
        log.info("the dashboard: http://%s:%d/ui", settings.server.host, settings.server.port)
        try:
            yield
        finally:
            if watch is not None:
                await watch.stop()
            await images.stop()
            await pipeline.stop(grace_s=settings.pipeline.drain_grace_s)
            await llm.stop()
            await services.close()
            await asyncio.to_thread(runtime.release)
            await store.close()
            log.info("raas stopped; every result is in %s", settings.server.db)

    app = FastAPI(
        title="raas",
        version=raas.__version__,
        summary="Rollout-as-a-Service for RL of multi-turn LLM agents",
        lifespan=lifespan,
    )
    methods = PathMethods()
    install_error_handlers(app, methods)
    # The last added runs first: a page's request is refused, then the key checked, then the
    # body's size, all before any of the body is read; then a gateway call goes to its session.
    app.add_middleware(gateway.GatewayLane)
    app.add_middleware(BodyLimitMiddleware, max_body_mb=settings.http.max_body_mb)
    app.add_middleware(
        ApiKeyMiddleware,
        api_key=settings.auth.api_key,
        job_path=is_gateway_path,
        job_token=lambda token: _job_token(app, token),
        tenants=lambda: watch.current if watch is not None else None,
    )
    app.add_middleware(
        BrowserGuardMiddleware,
        policy=guard_policy(
            settings.auth.api_key, settings.server.host, settings.http.allowed_hosts, [LOGIN_PATH]
        ),
    )

    @app.get("/healthz", tags=["system"], responses=responses(403, 413))
    async def healthz() -> dict[str, str]:
        """``ok``, or ``degraded`` and why: the result store cannot write (a full disk). Still
        a 200: the server is alive, serves what is stored and recovers by itself once it can
        write; a restart would not help, and would drop the results it holds."""
        state: ServiceState | None = getattr(app.state, "service", None)
        problem = await state.pipeline.store_problem() if state is not None else None
        if problem is not None:
            return {"status": "degraded", "detail": problem}
        return {"status": "ok"}

    guarded = responses(401, 403, 413)
    methods.add(app.router.routes)  # FastAPI's pages and /healthz
    # The gateway's routes answer in their APIs' own error shapes, to SDKs that send what they
    # send: raas's own routes alone refuse a repeated query key.
    one_value = [Depends(one_value_per_query_key)]
    for module in (rollouts, system, backends, prorl, gateway, dashboard):
        checks = one_value if module is not gateway else []
        app.include_router(module.router, responses=guarded, dependencies=checks)
        methods.add(module.router.routes)

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()  # FastAPI keeps it as app.openapi_schema
            document_instances(document, tasks, settings.tasks)
            document_form_refusal(document, UNSAFE_METHODS, form_paths={LOGIN_PATH})
            document_streams(document, rollouts.JsonLines.media_type)
            if settings.auth.api_key:
                document_api_key(document)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _job_token(app: FastAPI, token: bytes) -> bool:
    """Is ``token`` an open gateway session's (a job's own key to its OpenAI-style API)?"""
    state: ServiceState | None = getattr(app.state, "service", None)
    if state is None or state.gateway is None:
        return False
    try:
        return state.gateway.session(token.decode("ascii")) is not None
    except UnicodeDecodeError:
        return False
