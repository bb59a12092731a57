from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.launch import ServerProcess
from raas.pipeline import Pipeline, PipelineConfig, Stage
from raas.sandbox import cgroups
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.countdown import CountdownTask
from tests.support import tiers
from tests.support.probe import ProbeTask

FIXTURES = Path(__file__).parent / "fixtures"
pytest_plugins = ["tests.support.sigterm"]


def pytest_configure(config: pytest.Config) -> None:
    # A tier asked for by its marker fails where what it needs is missing (tests/support/tiers.py).
    tiers.MARK_EXPRESSION = config.getoption("markexpr") or ""


# The files that take longest in `make test` (most first; seconds summed over their tests, on 2
# loaded cores), which it starts first: `pytest -n 3 --dist loadfile --no-loadscope-reorder`
# hands out whole files in this order, then the rest in collection order. Started last, one of
# them ran alone at the end of the run (xdist's own order, by test count, puts the files of a
# few long tests last). Only the order changes; tests/test_structure.py checks that each exists.
SLOW_FIRST = [
    "tests/test_readme.py",  # 190 s
    "tests/cli/test_server.py",  # 113 s
    "tests/llm/test_engine.py",  # 68 s
    "tests/cli/test_run_interrupt.py",  # 66 s
    "tests/bench/test_bench_tenants.py",  # 58 s
    "tests/oracle/test_oracle.py",  # 58 s
    "tests/client/test_rollout_client.py",  # 50 s
    "tests/judge/test_reward_hacks_contest.py",  # 47 s
    "tests/api/test_prorl_contract.py",  # 46 s
    "tests/api/test_dashboard_browser.py",  # 41 s
    "tests/client/test_grpo_cpu_example.py",  # 41 s
    "tests/sandbox/test_fork_shell_state.py",  # 39 s
    "tests/tasks/test_tasks.py",  # 36 s
    "tests/judge/test_reward_hacks_swe.py",  # 36 s
    "tests/sandbox/test_sandbox.py",  # 25 s
    "tests/oracle/test_oracle_policy.py",  # 25 s
    "tests/cli/test_cli.py",  # 24 s
    "tests/api/test_cross_origin_browser.py",  # 23 s
    "tests/tasks/test_harness.py",  # 22 s
    "tests/sandbox/test_sandbox_checkpoint.py",  # 21 s
]


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Tests give sandboxes temporary runtime roots that no server claims: each left its empty
    # parent cgroup (raas-<hash>) in every hierarchy for good, hundreds a run.
    cgroups.sweep_parents()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    # a stable sort: each file's tests keep their order, the files not listed theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


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
    """Small pools; a short cancel grace so that abandoned stages do not slow the tests; one
    attempt, so a failure is the result (the retry tests ask for more)."""
    workers = {Stage.INIT: 2, Stage.RUN: 2, Stage.EVAL: 2}
    queues = {Stage.INIT: 16, Stage.RUN: 8, Stage.EVAL: 8}
    for stage in Stage:
        workers[stage] = overrides.pop(f"{stage}_workers", workers[stage])
        queues[stage] = overrides.pop(f"{stage}_queue", queues[stage])
    overrides.setdefault("max_attempts", 1)
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


ApiClient = Callable[..., Any]


@pytest.fixture
def client(tmp_path: Path, registry: TaskRegistry) -> ApiClient:
    """``async with client(**settings) as http``: an httpx client on the app (ASGI), with its
    lifespan running, on ``tmp_path / "api.db"`` unless ``db`` says otherwise."""

    @asynccontextmanager
    async def make(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
        defaults: dict[str, Any] = {"db": tmp_path / "api.db", "cancel_grace_s": 0.05}
        app = create_app(ServeSettings(**{**defaults, **settings}), registry)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
                yield http

    return make


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A site directory holding a 'separately installed' package's entry points."""
    site = tmp_path / "site"
    dist = site / "raas_test_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: raas-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[raas.tasks]\ngated = gated_task:GatedTask\nbroken = no_such_module:Nothing\n"
    )
    return site


@pytest.fixture
def server_env(plugin_path: Path) -> dict[str, str]:
    path = os.pathsep.join([str(plugin_path), str(FIXTURES), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def start_server(tmp_path: Path, server_env: dict[str, str]) -> Iterator[Any]:
    servers: list[ServerProcess] = []

    def start(db: Path, *args: str, port: int | None = None) -> ServerProcess:
        log = tmp_path / f"server{len(servers)}.log"
        server = ServerProcess(db, log, list(args), server_env, port=port)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
