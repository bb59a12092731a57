"""Durable before acknowledged (issue 33): a store that refuses writes (here SQLite's own
``query_only``, which fails every write as a full disk does; tests/pipeline/test_faults.py fills a
real disk) turns submissions away with a 503 and runs none of them, holds finished results (the job
stays in flight, never reported done) until they are written, and recovers by itself.

Before, a job was queued before its record was written (a submission answered 500 still ran),
and a result that could not be written was reported done all the same, then read back as
running until a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from raas.api.app import create_app
from raas.api.state import ServiceState
from raas.pipeline import JobRequest, Pipeline
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from tests.support.probe import ProbeTask, finished, probe_instance, settle


async def refuse_writes(store: ResultStore, refuse: bool = True) -> None:
    await store._call(lambda conn: conn.execute(f"PRAGMA query_only = {int(refuse)}"))


@asynccontextmanager
async def service(db: Path, registry: TaskRegistry) -> AsyncIterator[tuple[Any, ServiceState]]:
    app = create_app(ServeSettings(db=db, cancel_grace_s=0.05), registry)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield http, app.state.service


async def test_a_submission_the_store_cannot_record_is_a_503_and_never_runs(
    tmp_path: Path, registry: TaskRegistry, probe: ProbeTask
) -> None:
    body = {"instance": probe_instance(), "job_id": "refused"}
    async with service(tmp_path / "raas.db", registry) as (http, svc):
        await refuse_writes(svc.pipeline.store)
        r = await http.post("/v1/rollouts", json=body)
        assert r.status_code == 503 and r.headers["Retry-After"] == "2", r.text
        assert "cannot record new jobs" in r.json()["detail"]
        batch = await http.post("/v1/rollouts:batch", json={"jobs": [body]})
        assert batch.status_code == 503

        health = (await http.get("/healthz")).json()
        assert health["status"] == "degraded" and "readonly" in health["detail"]
        assert "raas_store_writable 0.0" in (await http.get("/metrics")).text
        # Turned away means not run, not queued, not stored.
        assert (await http.get("/v1/rollouts:running")).json()["jobs"] == []
        assert (await http.get("/v1/rollouts/refused")).status_code == 404
        assert probe.opened["refused"] == 0

        await refuse_writes(svc.pipeline.store, False)  # the disk has room again
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.post("/v1/rollouts", json=body)).status_code == 202
        got = (await http.get("/v1/rollouts/refused", params={"wait": 10})).json()
        assert got["state"] == "done"
    assert probe.opened["refused"] == 1


async def held(pipeline: Pipeline, n: int) -> None:
    await settle(lambda: pipeline.stats()["results_held"] == n, max_yields=100_000)


async def test_a_result_the_store_cannot_write_is_held_never_reported_done(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(store_retry_s=0.01) as pipeline:
        (view,) = await pipeline.submit([JobRequest.of(probe_instance(eval="block"))])
        job_id = view.job_id
        await probe.wait_entered(job_id, "eval")
        await refuse_writes(pipeline.store)
        probe.release(job_id, "eval")
        await held(pipeline, 1)
        # Several tries later (whenever they ran), still not reported finished.
        await asyncio.sleep(0.1)
        looked = await pipeline.wait(job_id, 0)
        assert looked is not None and looked.result is None and not looked.state.finished
        assert pipeline.active(job_id) is not None
        assert pipeline.stats()["store_writable"] is False

        await refuse_writes(pipeline.store, False)
        result = await finished(pipeline, job_id)
        assert (result["state"], result["reward"]) == ("done", 0.5)
        page = await pipeline.store.finished()
    assert [r.job_id for r in page.records] == [job_id]  # written once
    assert pipeline.stats()["finished"]["done"] == 1 and pipeline.stats()["results_held"] == 0


async def test_a_result_still_held_at_shutdown_runs_again_at_the_next_start(
    make_pipeline: Any, probe: ProbeTask, tmp_path: Path
) -> None:
    db = tmp_path / "raas.db"
    async with make_pipeline(db, store_retry_s=0.01, max_attempts=2) as pipeline:
        (view,) = await pipeline.submit([JobRequest.of(probe_instance(eval="block"))])
        await probe.wait_entered(view.job_id, "eval")
        await refuse_writes(pipeline.store)
        probe.release(view.job_id, "eval")
        await held(pipeline, 1)
    # Stopped with the result unwritten: the record says the job is unfinished.
    async with make_pipeline(db, max_attempts=2) as pipeline:
        result = await finished(pipeline, view.job_id)
    assert (result["state"], result["attempts"]) == ("done", 2)
    assert result["attempt_errors"][0]["type"] == "server_restart"
