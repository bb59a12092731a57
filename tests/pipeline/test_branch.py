"""Branching: a job that keeps per-turn snapshots, and a job that starts from one of them after
turn k, with the parent's first k turns token for token and its files as they were then; a
branch from what is not kept is refused at submit, naming what is missing; snapshots are
bounded and closed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from raas.agent.snapshots import Snapshot, Snapshots
from raas.llm.chat import encode
from raas.llm.models import load_tokenizer
from raas.llm.types import Generation, SamplingParams
from raas.pipeline import JobRequest, Pipeline, RequestRejected
from raas.sandbox import BwrapConfig, Sandbox
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.protocol import InvalidInstance, RewardInfo
from raas.tasks.services import TaskServices
from raas.wire import Branch, Trajectory
from tests.conftest import small_config
from tests.support.probe import WAIT_S, finished

INSTANCE = {"data_source": "branchy", "question": "append lines"}


def bash(command: str) -> str:
    call = {"name": "bash", "arguments": {"command": command}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


FINISH = '<tool_call>\n{"name": "finish", "arguments": {"answer": "done"}}\n</tool_call>'


class Scripts:
    """A policy that answers each job (its session) with that job's next scripted text and
    records every prompt it was given, by job."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]]) -> None:
        self.tok = tokenizer
        self.scripts = {job: list(turns) for job, turns in scripts.items()}
        self.prompts: dict[str, list[list[int]]] = {}

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation:
        self.prompts.setdefault(session, []).append(list(prompt_ids))
        text = self.scripts[session].pop(0)
        ids = [*encode(self.tok, text), self.tok.eos_token_id]
        # Logprobs that differ a turn, so a prefix taken from the wrong place shows.
        logprob = -0.1 * len(self.prompts[session])
        return Generation(ids, [logprob] * len(ids), "stop", backend="scripted")


class Branchy(AgentTask):
    name = "branchy"

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": str(instance["question"])}]

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        assert ctx.sandbox is not None
        return {"lines": (await ctx.sandbox.read_file("/workspace/f")).decode()}

    async def judge(self, instance: dict[str, Any], artifact: dict[str, Any], services: Any) -> Any:
        return RewardInfo(1.0)


PARENT = [bash("echo one >> f"), bash("echo two >> f"), bash("echo three >> f"), FINISH]


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("smollm2")


@pytest.fixture
async def served(tmp_path: Path, tok: Any) -> AsyncIterator[tuple[Pipeline, Scripts, TaskServices]]:
    policy = Scripts(
        tok,
        {
            "parent": list(PARENT),
            "plain": [bash("echo x >> f"), FINISH],
            "short": list(PARENT),
            "branch": [bash("cat f; echo four >> f"), FINISH],
        },
    )
    services = TaskServices(llm=policy, sandbox_config=BwrapConfig())
    registry = TaskRegistry()
    registry.register(Branchy())
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    pipeline = Pipeline(registry, store, small_config(), services=services)
    await pipeline.start()
    try:
        yield pipeline, policy, services
    finally:
        await pipeline.stop(grace_s=0)
        await services.close()
        await store.close()


async def run_job(pipeline: Pipeline, job_id: str, **request: Any) -> dict[str, Any]:
    (view,) = await pipeline.submit([JobRequest.of(INSTANCE, job_id=job_id, **request)])
    return await finished(pipeline, view.job_id)


async def test_a_branch_at_turn_k_starts_from_the_parents_tokens_and_files(
    served: tuple[Pipeline, Scripts, TaskServices],
) -> None:
    pipeline, policy, services = served
    parent = await run_job(pipeline, "parent", sampling_params={"keep_snapshots": 3})
    assert parent["state"] == "done" and parent["metrics"]["artifact"]["lines"] == (
        "one\ntwo\nthree\n"
    )
    branch = await run_job(pipeline, "branch", branch=Branch(job_id="parent", turn=2))
    assert branch["state"] == "done", branch["error"]
    p, b = parent["trajectory"], branch["trajectory"]
    # The branch's first call to the model is the parent's third, token for token: turns 1..2
    # and their observations were not generated again.
    assert policy.prompts["branch"][0] == policy.prompts["parent"][2]
    n = len(policy.prompts["parent"][2]) - len(p["prompt_ids"])
    assert b["prompt_ids"] == p["prompt_ids"]
    for key in ("response_ids", "loss_mask", "logprobs"):
        assert b[key][:n] == p[key][:n]
    assert b["turns"][:2] == p["turns"][:2] and len(b["turns"]) == 4
    # The conversation: the user's message, then turns 1..2 and their observations.
    assert b["messages"][:5] == p["messages"][:5] and len(b["messages"]) == 8
    # Its sandbox is the parent's after turn 2: "three" was never written there.
    observation = b["messages"][-2]
    assert observation["role"] == "tool" and "one\ntwo\n" in observation["content"]
    assert "three" not in observation["content"]
    assert branch["metrics"]["artifact"]["lines"] == "one\ntwo\nfour\n"
    # The parent kept turns 1..3 (none after its last); a branch forks them, they stay kept
    # until the service closes them.
    assert len(services.snapshots) == 3
    kept = [services.snapshots.get("parent", turn).sandbox for turn in (1, 2, 3)]
    await services.snapshots.close()
    assert all(sandbox is not None and sandbox.closed for sandbox in kept)


async def rejected(pipeline: Pipeline, branch: Branch, job_id: str = "b") -> InvalidInstance:
    with pytest.raises(RequestRejected) as info:
        await pipeline.submit([JobRequest.of(INSTANCE, job_id=job_id, branch=branch)])
    assert await pipeline.lookup(job_id) is None  # nothing of the branch was started
    assert isinstance(info.value.cause, InvalidInstance)
    return info.value.cause


async def test_branches_from_what_is_not_kept_are_refused_naming_it(
    served: tuple[Pipeline, Scripts, TaskServices],
) -> None:
    pipeline, _, _ = served
    unknown = await rejected(pipeline, Branch(job_id="nobody", turn=1))
    assert unknown.loc == ("branch", "job_id") and "no job nobody" in unknown.message
    await run_job(pipeline, "plain")
    none_kept = await rejected(pipeline, Branch(job_id="plain", turn=1))
    assert none_kept.loc == ("branch", "job_id") and "kept no snapshots" in none_kept.message
    await run_job(pipeline, "short", sampling_params={"keep_snapshots": 1})
    beyond = await rejected(pipeline, Branch(job_id="short", turn=4))
    assert beyond.loc == ("branch", "turn") and "beyond" in beyond.message
    evicted = await rejected(pipeline, Branch(job_id="short", turn=1))
    assert evicted.loc == ("branch", "turn") and "evicted (kept: 3)" in evicted.message
    other = {**INSTANCE, "question": "another"}
    with pytest.raises(RequestRejected) as info:
        await pipeline.submit([JobRequest.of(other, branch=Branch(job_id="short", turn=3))])
    assert cast(InvalidInstance, info.value.cause).loc == ("instance",)


class FakeSandbox:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def snapshot(job: str, turn: int) -> tuple[Snapshot, FakeSandbox]:
    sandbox = FakeSandbox()
    return Snapshot(job, turn, Trajectory(), {}, cast(Sandbox, sandbox)), sandbox


async def test_snapshots_are_bounded_per_job_and_in_all_and_closed_at_the_end() -> None:
    snapshots = Snapshots(max_total=3)
    made = {(job, turn): snapshot(job, turn) for job in ("a", "b") for turn in (1, 2, 3)}
    for (job, _), (snap, _) in made.items():
        snapshots.add(snap, per_job=2 if job == "a" else 3)
    # a kept 2 of its turns, then b's pushed the oldest of all out: b keeps 1..3, a nothing.
    assert len(snapshots) == 3
    assert snapshots.get("b", 1).turn == 1
    snapshots.drop("b")  # b runs again: what its earlier attempt kept is gone
    with pytest.raises(LookupError, match="kept no snapshots"):
        snapshots.get("b", 1)
    again, sandbox = snapshot("b", 1)
    snapshots.add(again, per_job=3)
    await snapshots.close()
    assert sandbox.closed
    assert all(sandbox.closed for _, sandbox in made.values())
    with pytest.raises(LookupError):
        snapshots.get("b", 1)


class Held(Scripts):
    """Scripts whose answer to ``held`` waits until the test lets it go (never, here)."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]], held: str) -> None:
        super().__init__(tokenizer, scripts)
        self.held, self.reached = held, asyncio.Event()

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation:
        if session == self.held:
            self.reached.set()
            await asyncio.Event().wait()
        return await super().generate(session, prompt_ids, params)


async def test_a_branch_in_flight_at_a_crash_fails_after_the_restart(
    tmp_path: Path, tok: Any
) -> None:
    """Its snapshot died with the server: the job fails at once, nothing of it half-started."""
    db = tmp_path / "crash.db"
    registry = TaskRegistry()
    registry.register(Branchy())
    policy = Held(tok, {"parent": list(PARENT)}, held="branch")
    services = TaskServices(llm=policy, sandbox_config=BwrapConfig())
    store = ResultStore(db)
    await store.open()
    first = Pipeline(registry, store, small_config(), services=services)
    await first.start()
    await run_job(first, "parent", sampling_params={"keep_snapshots": 3})
    branch = Branch(job_id="parent", turn=1)
    await first.submit([JobRequest.of(INSTANCE, job_id="branch", branch=branch)])
    await asyncio.wait_for(policy.reached.wait(), WAIT_S)  # a fork from a snapshot: real work
    for worker in first.stages.workers:  # the process "dies": nothing finishes, the store closes
        worker.cancel()
    await asyncio.gather(*first.stages.workers, return_exceptions=True)
    # A real death takes its sandboxes with it; here the branch's forked sandbox, held by the
    # job the "dead" pipeline never finished, is released by hand, so none outlives the test.
    for job in list(first.stages.jobs.values()):
        await first.stages.cleanup(job)
    await store.close()
    await services.close()
    fresh = TaskServices(llm=Scripts(tok, {}), sandbox_config=BwrapConfig())
    store = ResultStore(db)
    await store.open()
    second = Pipeline(registry, store, small_config(max_attempts=3), services=fresh)
    await second.start()
    try:
        result = await finished(second, "branch")
    finally:
        await second.stop(grace_s=0)
        await store.close()
    assert result["state"] == "failed"
    assert result["error"]["type"] == "invalid_after_restart"
