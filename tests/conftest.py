from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from raas.pipeline import Pipeline, PipelineConfig, Stage
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.countdown import CountdownTask
from tests.probe import ProbeTask


@pytest.fixture
def probe() -> ProbeTask:
    return ProbeTask()


@pytest.fixture
def registry(probe: ProbeTask) -> TaskRegistry:
    reg = TaskRegistry()
    reg.register(probe)
    reg.register(CountdownTask())
    return reg


def small_config(**overrides: Any) -> PipelineConfig:
    """Small pools; a short cancel grace so that abandoned stages do not slow the tests."""
    workers = {Stage.INIT: 2, Stage.RUN: 2, Stage.EVAL: 2}
    queues = {Stage.INIT: 16, Stage.RUN: 8, Stage.EVAL: 8}
    for stage in Stage:
        workers[stage] = overrides.pop(f"{stage}_workers", workers[stage])
        queues[stage] = overrides.pop(f"{stage}_queue", queues[stage])
    return PipelineConfig(
        workers=workers, queue_size=queues, cancel_grace_s=0.05, job_timeout_s=None, **overrides
    )


PipelineFactory = Callable[..., Any]


@pytest.fixture
def make_pipeline(tmp_path: Path, registry: TaskRegistry) -> Callable[..., Any]:
    @asynccontextmanager
    async def factory(db: Path | None = None, **overrides: Any) -> AsyncIterator[Pipeline]:
        store = ResultStore(db or tmp_path / "raas.db")
        await store.open()
        pipeline = Pipeline(registry, store, small_config(**overrides))
        await pipeline.start()
        try:
            yield pipeline
        finally:
            await pipeline.stop(grace_s=0)
            await store.close()

    return factory
