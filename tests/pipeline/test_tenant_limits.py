"""Tenant limits that hold against one determined tenant (issue 44, class 5): token quotas
reserved at admission and settled at the end, kept snapshots counted in max_sandboxes and
evicted only by their own tenant's, an admin cap on timeout_s, and RUN slots that never-ending
jobs of one tenant cannot keep from another. Each attack sits beside its control."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI

from raas.agent.snapshots import Snapshot, Snapshots
from raas.api.app import create_app
from raas.llm.chat import encode
from raas.llm.models import load_tokenizer
from raas.llm.types import Generation, SamplingParams
from raas.pipeline import JobRequest, JobState, Pipeline, policies_from
from raas.pipeline.tenants import TokenMeter, token_ceiling
from raas.sandbox import BwrapConfig, Sandbox
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import RewardInfo, TaskContext, TaskJob, TaskRegistry
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.math import MathTask
from raas.tasks.services import TaskServices
from raas.tenants import Quotas, TenantPolicy
from raas.wire import Branch, Trajectory
from tests.conftest import small_config
from tests.support.probe import WAIT_S, ProbeTask, finished, probe_instance

ADMIN, ALICE, BOB = "admin-s3cret", "alice-key-1", "bob-key-1"
Http = httpx.AsyncClient


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Metered(ProbeTask):
    """The probe, as a task whose jobs say their own token ceiling (``ceiling``) and use
    ``spend`` tokens (their turn records: 3 generated, the rest prompt)."""

    name = "metered"

    def token_ceiling(self, job: TaskJob) -> int:
        return int(job.instance["ceiling"])

    async def run(self, context: TaskContext) -> Trajectory:
        traj = await super().run(context)
        traj.turns[0]["prompt_tokens"] = int(context.job.instance["spend"]) - 3
        return traj


def metered(ceiling: int, spend: int = 50, run: str = "ok") -> dict[str, Any]:
    return {**probe_instance(run=run), "data_source": "metered", "ceiling": ceiling, "spend": spend}


@pytest.fixture
def meter_task(registry: TaskRegistry) -> Metered:
    task = Metered()
    registry.register(task)
    return task


Server = Callable[..., Any]


@pytest.fixture
def server(tmp_path: Path, registry: TaskRegistry) -> Server:
    """``async with server(alice_quotas) as (app, http)``: the app with a tenants file of alice
    (those quotas) and bob (none), its lifespan running, and an httpx client on it."""

    @asynccontextmanager
    async def make(**alice_quotas: Any) -> AsyncIterator[tuple[FastAPI, Http]]:
        path = tmp_path / "tenants.toml"
        quotas = "".join(f"{k} = {v}\n" for k, v in alice_quotas.items())
        path.write_text(
            f'[tenants.alice]\nkey_sha256 = ["{digest(ALICE)}"]\n'
            f"[tenants.alice.quotas]\n{quotas}"
            f'[tenants.bob]\nkey_sha256 = ["{digest(BOB)}"]\n'
        )
        settings = ServeSettings(
            db=tmp_path / "limits.db", cancel_grace_s=0.05, api_key=ADMIN, tenants_file=path
        )
        app = create_app(settings, registry)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with Http(transport=transport, base_url="http://localhost") as http:
                yield app, http

    return make


def batch(prefix: str, instances: list[dict[str, Any]]) -> dict[str, Any]:
    return {"jobs": [{"job_id": f"{prefix}-{i}", "instance": x} for i, x in enumerate(instances)]}


async def result(http: Http, key: str, job_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S}, headers=auth(key))
    assert r.status_code == 200, r.text
    assert r.json()["result"] is not None, r.text
    body: dict[str, Any] = r.json()["result"]
    return body


# -- token quotas ---------------------------------------------------------------------------


def test_an_agent_tasks_ceiling_is_its_turns_times_its_context() -> None:
    # Each turn's prompt and output fit in max_context_tokens; the quota counts both.
    job = TaskJob("", {}, {"max_turns": 3, "max_context_tokens": 1000})
    assert token_ceiling(MathTask(), job) == 3000
    assert token_ceiling(MathTask(), TaskJob("", {}, {})) == 6 * 4096  # the task's defaults
    assert token_ceiling(ProbeTask(), job) is None  # a task that says nothing reserves none


def test_reserved_tokens_count_until_settled_by_what_was_used() -> None:
    meter, policy = (
        TokenMeter(clock=lambda: 0.0),
        TenantPolicy(quotas=Quotas(llm_tokens_per_day=1000)),
    )
    assert meter.over(policy, 1000) is None  # the control: the whole quota fits
    meter.reserve(800)
    assert meter.over(policy, 400) == ("llm_tokens_per_day", None)  # till jobs end
    assert meter.over(policy, 200) is None
    meter.settle(800, 100)  # the jobs used 100 of their 800
    assert meter.over(policy, 900) is None and meter.over(policy, 901) is not None


async def test_a_batch_beyond_the_token_quota_is_refused_and_settled_jobs_let_more_in(
    server: Server, meter_task: Metered
) -> None:
    async with server(llm_tokens_per_day=1000) as (_, http):
        over = batch("over", [metered(400, run="block")] * 3)
        # The attack: three jobs that may each use 400 tokens, on a quota of 1000.
        r = await http.post("/v1/rollouts:batch", json=over, headers=auth(ALICE))
        assert r.status_code == 429 and r.json()["quota"] == "llm_tokens_per_day", r.text
        assert "llm_tokens_per_day" in r.json()["detail"] and int(r.headers["retry-after"]) >= 1
        gone = await http.get("/v1/rollouts/over-0", headers=auth(ALICE))
        assert gone.status_code == 404  # nothing of the batch was accepted
        # The control: two of them fit, and run.
        within = batch("in", [metered(400, run="block")] * 2)
        r = await http.post("/v1/rollouts:batch", json=within, headers=auth(ALICE))
        assert r.status_code == 202, r.text
        # While they run their ceilings stay reserved: a third is refused...
        r = await http.post(
            "/v1/rollouts", json={"instance": metered(400), "job_id": "third"}, headers=auth(ALICE)
        )
        assert r.status_code == 429 and r.json()["quota"] == "llm_tokens_per_day", r.text
        # ...and another tenant's quota is its own.
        r = await http.post("/v1/rollouts", json={"instance": metered(400)}, headers=auth(BOB))
        assert r.status_code == 202
        for i in range(2):
            await meter_task.wait_entered(f"alice~in-{i}", "run")
            meter_task.release(f"alice~in-{i}", "run")
        for i in range(2):
            assert (await result(http, ALICE, f"in-{i}"))["state"] == "done"
        # Settled: they used 100 of the 800 reserved, so two more of 400 fit (900 of 1000).
        again = batch("again", [metered(400)] * 2)
        r = await http.post("/v1/rollouts:batch", json=again, headers=auth(ALICE))
        assert r.status_code == 202, r.text
        for i in range(2):
            assert (await result(http, ALICE, f"again-{i}"))["state"] == "done"
        # 200 used of 1000: a job that may use 801 more is refused, whole.
        r = await http.post("/v1/rollouts", json={"instance": metered(801)}, headers=auth(ALICE))
        assert r.status_code == 429 and r.json()["quota"] == "llm_tokens_per_day"
        # A job whose ceiling alone is over the quota can never fit: a 422 saying why.
        r = await http.post("/v1/rollouts", json={"instance": metered(1001)}, headers=auth(BOB))
        assert r.status_code == 202  # the control: bob has no token quota
        r = await http.post("/v1/rollouts", json={"instance": metered(1001)}, headers=auth(ALICE))
        assert r.status_code == 422 and "llm_tokens_per_day" in r.text, r.text


# -- the timeout cap -----------------------------------------------------------------------


async def test_a_timeout_over_the_tenants_cap_is_refused_and_none_asked_gets_the_cap(
    server: Server, probe: ProbeTask
) -> None:
    async with server(max_timeout_s=2) as (_, http):
        # The attack: a job asking more than its admin allows its tenant.
        asks = {"instance": probe_instance(), "job_id": "long", "timeout_s": 3600}
        r = await http.post("/v1/rollouts", json=asks, headers=auth(ALICE))
        assert r.status_code == 422, r.text
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "timeout_s"] and "max_timeout_s" in error["msg"]
        assert (await http.get("/v1/rollouts/long", headers=auth(ALICE))).status_code == 404
        r = await http.post("/v1/rollouts", json=asks, headers=auth(BOB))
        assert r.status_code == 202  # the control: bob has no cap
        ok = {"instance": probe_instance(), "job_id": "ok", "timeout_s": 2}
        assert (await http.post("/v1/rollouts", json=ok, headers=auth(ALICE))).status_code == 202
        assert (await result(http, ALICE, "ok"))["state"] == "done"
        # A never-ending job that asks none ends at the cap, not never.
        endless = {"instance": probe_instance(run="block"), "job_id": "endless"}
        r = await http.post("/v1/rollouts", json=endless, headers=auth(ALICE))
        assert r.status_code == 202
        assert (await result(http, ALICE, "endless"))["state"] == "timeout"
        assert (await result(http, BOB, "long"))["state"] == "done"


# -- RUN slots -------------------------------------------------------------------------------


async def test_never_ending_jobs_of_one_tenant_keep_no_run_slot_from_another(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(run_workers=2) as pipeline:
        endless = await pipeline.submit(
            [JobRequest.of(probe_instance(run="block"), tenant="a") for _ in range(4)]
        )
        await probe.wait_entered(endless[0].job_id, "run")
        await probe.wait_entered(endless[1].job_id, "run")  # a alone took every RUN slot
        # The attack: jobs that never end hold them; b's quick jobs must all finish anyway.
        quick = await pipeline.submit(
            [JobRequest.of(probe_instance(), tenant="b") for _ in range(5)]
        )
        for view in quick:
            assert (await finished(pipeline, view.job_id))["state"] == "done"
        # The control: a, over its share, started no more of its own meanwhile.
        entered = [probe.entered[v.job_id, "run"].is_set() for v in endless]
        assert entered == [True, True, False, False]
        assert pipeline.stats()["stages"]["run"]["active"] == 2


# -- snapshots -----------------------------------------------------------------------------


class FakeSandbox:
    closed = False

    async def close(self) -> None:
        self.closed = True


def fake(job: str, turn: int) -> Snapshot:
    return Snapshot(job, turn, Trajectory(), {}, cast(Sandbox, FakeSandbox()))


async def test_an_owners_snapshots_are_evicted_by_its_own_only() -> None:
    snapshots = Snapshots(max_total=2)
    freed: list[str] = []
    limits = {"c": 1}
    snapshots.bind(lambda job: job.split("~")[0], limits.get, freed.append)
    for turn in (1, 2):
        snapshots.add(fake("a~p", turn), per_job=5)
    # The attack: b's snapshots beyond the server's count once evicted a's oldest.
    for turn in (1, 2, 3):
        snapshots.add(fake("b~q", turn), per_job=5)
    assert snapshots.get("a~p", 1).turn == 1 and snapshots.held("a") == 2
    with pytest.raises(LookupError, match="evicted"):
        snapshots.get("b~q", 1)  # the control: b's own oldest went for its newest
    assert freed == ["b"] and snapshots.held("b") == 2
    for turn in (1, 2):
        snapshots.add(fake("c~r", turn), per_job=5)
    assert snapshots.held("c") == 1  # what c may keep (its quota) bounds c alone
    await snapshots.close()


def bash(command: str) -> str:
    call = {"name": "bash", "arguments": {"command": command}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


FINISH = '<tool_call>\n{"name": "finish", "arguments": {"answer": "done"}}\n</tool_call>'
LINES = {"data_source": "lines", "question": "append lines"}


class Lines(AgentTask):
    name = "lines"

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": str(instance["question"])}]

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        return {}

    async def judge(self, instance: dict[str, Any], artifact: dict[str, Any], services: Any) -> Any:
        return RewardInfo(1.0)


class Policy:
    """Each job appends a line to a file for three turns, then finishes; a job named in
    ``held`` waits at its first call until let go. ``watch`` is called at each call."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.calls: Counter[str] = Counter()
        self.held: dict[str, asyncio.Event] = {}
        self.reached: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.watch: Callable[[], None] = lambda: None

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation:
        self.watch()
        self.reached[session].set()
        if session in self.held:
            await self.held[session].wait()
        self.calls[session] += 1
        n = self.calls[session]
        text = bash(f"echo {n} >> f") if n <= 3 else FINISH
        ids = [*encode(self.tok, text), self.tok.eos_token_id]
        return Generation(ids, [-0.1] * len(ids), "stop", backend="scripted")


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("smollm2")


Served = Callable[..., Any]


@pytest.fixture
def served(tmp_path: Path, tok: Any) -> Served:
    @asynccontextmanager
    async def make(
        policies: dict[str, TenantPolicy], max_snapshots: int = 64
    ) -> AsyncIterator[tuple[Pipeline, Policy, Snapshots]]:
        policy = Policy(tok)
        snapshots = Snapshots(max_snapshots)
        services = TaskServices(llm=policy, sandbox_config=BwrapConfig(), snapshots=snapshots)
        registry = TaskRegistry()
        registry.register(Lines())
        store = ResultStore(tmp_path / "snapshots.db")
        await store.open()
        config = small_config(tenants=policies_from(policies))
        pipeline = Pipeline(registry, store, config, services=services)
        await pipeline.start()
        try:
            yield pipeline, policy, snapshots
        finally:
            await pipeline.stop(grace_s=0)
            await services.close()
            await store.close()

    return make


def lines(tenant: str, job_id: str, keep: int = 0, **more: Any) -> JobRequest:
    params = {"keep_snapshots": keep} if keep else {}
    return JobRequest.of(LINES, params, job_id, tenant=tenant, **more)


async def test_kept_snapshots_count_in_max_sandboxes(served: Served) -> None:
    policies = {"a": TenantPolicy(quotas=Quotas(max_sandboxes=2))}
    async with served(policies) as (pipeline, policy, snapshots):
        most: list[int] = []
        policy.watch = lambda: most.append(pipeline.stats()["tenants"]["a"]["sandboxes"])
        (parent,) = await pipeline.submit([lines("a", "p", keep=3)])
        assert (await finished(pipeline, parent.job_id))["state"] == "done"
        # Its job's own sandbox and 2 quota: it kept one snapshot (its last), and holds it.
        assert snapshots.held("a") == 1 and pipeline.stats()["tenants"]["a"]["sandboxes"] == 1
        policy.held["a~q1"] = asyncio.Event()
        q1, q2 = await pipeline.submit([lines("a", "q1", keep=2), lines("a", "q2")])
        await asyncio.wait_for(policy.reached["a~q1"].wait(), WAIT_S)
        # The attack: a snapshot and a job in flight are its 2; a third would start here.
        (b,) = await pipeline.submit([lines("b", "b")])
        assert (await finished(pipeline, b.job_id))["state"] == "done"  # the control: b goes
        job = pipeline.active(q2.job_id)
        assert job is not None and job.state is JobState.QUEUED  # two INIT workers were free
        policy.held["a~q1"].set()
        for view in (q1, q2):
            assert (await finished(pipeline, view.job_id))["state"] == "done"
        # q1 kept its snapshots within the quota: a's own oldest (p's) went for them.
        assert max(most) == 2 and snapshots.held("a") == 1
        with pytest.raises(LookupError, match="evicted"):
            snapshots.get("a~p", 3)


async def test_another_tenants_snapshots_never_evict_this_ones(served: Served) -> None:
    async with served({}, max_snapshots=2) as (pipeline, _, snapshots):
        (parent,) = await pipeline.submit([lines("a", "p", keep=3)])
        assert (await finished(pipeline, parent.job_id))["state"] == "done"
        # The attack: b keeps as many snapshots as the server's max_snapshots, after a's.
        (other,) = await pipeline.submit([lines("b", "p", keep=3)])
        assert (await finished(pipeline, other.job_id))["state"] == "done"
        with pytest.raises(LookupError, match="evicted"):
            snapshots.get("b~p", 1)  # the control: b's own oldest went for its newest
        branch = lines("a", "branch", branch=Branch(job_id="p", turn=2))
        (view,) = await pipeline.submit([branch])
        assert (await finished(pipeline, view.job_id))["state"] == "done"
        assert snapshots.held("a") == 2 and snapshots.held("b") == 2
