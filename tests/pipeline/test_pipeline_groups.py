"""Groups in the pipeline: the jobs of one group and instance run INIT once and start from forks
of its context; each stays a job of its own (a failed one is forked again); the template is
cleaned up once the last member is finished."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from raas.agent.loop import Generator
from raas.pipeline import JobRequest, Pipeline
from raas.sandbox import BwrapConfig, LocalConfig
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.protocol import RewardInfo, TaskContext, TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory
from tests.conftest import small_config
from tests.support.probe import finished, settle


@dataclass
class Ctx(TaskContext):
    made_by: str = ""  # the job whose init made the context this one comes from


class InitCounting:
    """A task whose contexts say where they came from; run fails once where asked."""

    name = "plain"

    def __init__(self) -> None:
        self.inits: list[str] = []
        self.recovered: list[tuple[str, bool]] = []  # (init or fork, job.recovered)
        self.cleaned: list[str] = []
        self.runs: Counter[str] = Counter()
        self.gate = asyncio.Event()
        self.gate.set()

    async def init(self, job: TaskJob) -> Ctx:
        self.inits.append(job.job_id)
        self.recovered.append(("init", job.recovered))
        await self.gate.wait()
        return Ctx(job=job, made_by=job.job_id)

    async def run(self, context: TaskContext) -> Trajectory:
        job = context.job
        self.runs[job.job_id] += 1
        if job.sampling_params.get("fail_once") and self.runs[job.job_id] == 1:
            raise RuntimeError("the sandbox died")
        return context.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        assert isinstance(context, Ctx)
        return RewardInfo(1.0, {"made_by": context.made_by})

    async def cleanup(self, context: TaskContext) -> None:
        self.cleaned.append(context.job.job_id)


class Forking(InitCounting):
    name = "forking"

    def __init__(self) -> None:
        super().__init__()
        self.forks: list[tuple[str, str]] = []  # (template's job, the fork's job)

    async def fork_context(self, template: TaskContext, job: TaskJob) -> Ctx:
        assert isinstance(template, Ctx)
        self.forks.append((template.job.job_id, job.job_id))
        self.recovered.append(("fork", job.recovered))
        return Ctx(job=job, made_by=template.made_by)


@pytest.fixture
def task() -> Forking:
    return Forking()


@pytest.fixture
def plain() -> InitCounting:
    return InitCounting()


@pytest.fixture
def registry(task: Forking, plain: InitCounting) -> TaskRegistry:
    """conftest's ``make_pipeline`` runs these tasks."""
    registry = TaskRegistry()
    registry.register(task)
    registry.register(plain)
    return registry


def group_of(n: int, task: str, group: str | None = "g1", **params: Any) -> list[JobRequest]:
    instance = {"data_source": task, "question": "q"}
    return [JobRequest.of(instance, dict(params), f"{group}-{k}", group=group) for k in range(n)]


async def test_a_group_runs_init_once_and_forks_every_member(
    make_pipeline: Any, task: Forking
) -> None:
    task.gate.clear()  # every member is queued before the first init ends
    async with make_pipeline() as pipeline:
        views = await pipeline.submit(group_of(4, "forking"))
        task.gate.set()
        results = [await finished(pipeline, v.job_id) for v in views]
        await settle(lambda: len(task.cleaned) == 5)  # the template's: in the background
    assert len(task.inits) == 1
    template = task.inits[0]
    assert sorted(task.forks) == sorted((template, v.job_id) for v in views)
    assert [r["state"] for r in results] == ["done"] * 4
    assert {r["job_id"] for r in results} == {v.job_id for v in views}
    assert all(r["metrics"]["made_by"] == template for r in results)
    # Each member's context, and then the template (once the last member finished).
    assert Counter(task.cleaned) == Counter([*(v.job_id for v in views), template])


async def test_a_failed_member_is_forked_again_not_the_group(
    make_pipeline: Any, task: Forking
) -> None:
    async with make_pipeline(max_attempts=2) as pipeline:
        ok = group_of(2, "forking")
        failing = JobRequest.of(ok[0].rollout.instance, {"fail_once": True}, "g1-bad", group="g1")
        views = await pipeline.submit([*ok, failing])
        results = {v.job_id: await finished(pipeline, v.job_id) for v in views}
    assert len(task.inits) == 1
    assert [r["state"] for r in results.values()] == ["done"] * 3
    assert results["g1-bad"]["attempts"] == 2
    assert Counter(job for _, job in task.forks) == {"g1-0": 1, "g1-1": 1, "g1-bad": 2}


async def test_different_groups_and_instances_do_not_share_init(
    make_pipeline: Any, task: Forking
) -> None:
    async with make_pipeline() as pipeline:
        other = JobRequest.of({"data_source": "forking", "question": "other"}, {}, "o", group="g1")
        requests = [*group_of(2, "forking"), *group_of(2, "forking", "g2"), other]
        views = await pipeline.submit(requests)
        for v in views:
            await finished(pipeline, v.job_id)
    assert len(task.inits) == 3


async def test_a_task_that_cannot_fork_runs_init_for_every_member(
    make_pipeline: Any, plain: InitCounting
) -> None:
    async with make_pipeline() as pipeline:
        for v in await pipeline.submit(group_of(3, "plain")):
            assert (await finished(pipeline, v.job_id))["state"] == "done"
    assert len(plain.inits) == 3


async def test_jobs_that_name_no_group_run_init_each(make_pipeline: Any, task: Forking) -> None:
    async with make_pipeline() as pipeline:
        for v in await pipeline.submit(group_of(3, "forking", group=None)):
            await finished(pipeline, v.job_id)
    assert len(task.inits) == 3 and task.forks == []


async def test_a_group_revived_after_a_crash_makes_one_new_template(
    make_pipeline: Any, task: Forking, registry: TaskRegistry, tmp_path: Path
) -> None:
    task.gate.clear()
    db = tmp_path / "crash.db"
    store = ResultStore(db)
    await store.open()
    first = Pipeline(registry, store, small_config())
    await first.start()
    await first.submit(group_of(3, "forking"))
    await settle(lambda: bool(task.inits))
    # The process "dies": workers vanish without finishing anything, the store just closes.
    for worker in first.stages.workers:
        worker.cancel()
    await store.close()
    task.inits.clear()
    task.recovered.clear()
    task.gate.set()
    async with make_pipeline(db=db, max_attempts=3) as second:
        results = [await finished(second, f"g1-{k}") for k in range(3)]
    assert len(task.inits) == 1
    # Each member resumes in its own fork; the template is the task as INIT sets it up, never
    # one member's resumed state. (The first pipeline's cancelled INIT may still fork its own.)
    assert task.recovered.count(("fork", True)) == 3
    assert ("init", True) not in task.recovered and ("init", False) in task.recovered
    assert [r["state"] for r in results] == ["done"] * 3


class SetUpOnce(AgentTask):
    """An agent task whose set-up leaves a file and a shell variable behind; counts set-ups."""

    name = "set-up-once"

    def __init__(self) -> None:
        self.setups = 0

    async def setup(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None
        self.setups += 1
        await ctx.sandbox.bash("echo ready > /workspace/state && export READY=1")


async def test_an_agent_tasks_fork_is_a_fork_of_its_sandbox() -> None:
    task = SetUpOnce()
    services = TaskServices(llm=cast(Generator, None), sandbox_config=BwrapConfig())
    template = await task.init(TaskJob("a", {}, {}, services))
    child = await task.fork_context(template, TaskJob("b", {}, {}, services))
    try:
        assert child.job.job_id == "b" and child.sandbox is not None
        assert child.sandbox is not template.sandbox and child.closing == [child.sandbox]
        seen = await child.sandbox.bash("cat /workspace/state; echo $READY")
        assert seen.output == "ready\n1\n" and task.setups == 1
    finally:
        await task.cleanup(child)
        await task.cleanup(template)
    assert child.sandbox.closed and template.sandbox is not None and template.sandbox.closed


async def test_an_agent_task_whose_sandbox_cannot_fork_sets_each_up() -> None:
    task = SetUpOnce()
    services = TaskServices(llm=cast(Generator, None), sandbox_config=LocalConfig())
    template = await task.init(TaskJob("a", {}, {}, services))
    child = await task.fork_context(template, TaskJob("b", {}, {}, services))
    try:
        assert task.setups == 2 and child.sandbox is not template.sandbox
    finally:
        await task.cleanup(child)
        await task.cleanup(template)
