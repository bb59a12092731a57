"""Tenants sharing one server: weighted fair share of each stage queue, quotas (refused whole,
429 with Retry-After naming the quota, nothing accepted lost) and per-tenant accounting."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.pipeline import (
    InitQueueFull,
    JobRequest,
    JobState,
    Pipeline,
    QuotaExceeded,
    policies_from,
)
from raas.pipeline.queue import QueueFull, StageQueue
from raas.pipeline.slots import StageSlots
from raas.pipeline.tenants import DAY_S, TokenMeter
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from raas.tenants import Quotas, TenantPolicy
from tests.support.probe import WAIT_S, ProbeTask, finished, probe_instance, settle


@dataclass
class Item:
    id: str
    tenant: str
    priority: int = 0


def backlog(q: StageQueue[Item], tenant: str, n: int, priority: int = 0) -> list[Item]:
    items = [Item(f"{tenant}-{i}", tenant, priority) for i in range(n)]
    for item in items:
        q.put_nowait(item)
    return items


def taken(q: StageQueue[Item], n: int) -> list[Item]:
    out = []
    for _ in range(n):
        item = q.take()
        assert item is not None
        out.append(item)
    return out


def weights(table: dict[str, float]) -> Any:
    return lambda tenant: table.get(tenant, 1.0)


async def test_two_backlogged_tenants_with_weights_two_to_one_split_the_slots_two_to_one() -> None:
    q: StageQueue[Item] = StageQueue(1000, weight=weights({"a": 2.0, "b": 1.0}))
    backlog(q, "a", 300)
    backlog(q, "b", 300)
    split = Counter(item.tenant for item in taken(q, 150))
    assert abs(split["a"] / split["b"] - 2.0) <= 0.2, split
    # Equal weights split evenly, and the order within a tenant stays first-in first-out.
    even: StageQueue[Item] = StageQueue(100)
    backlog(even, "a", 20)
    backlog(even, "b", 20)
    got = taken(even, 20)
    assert Counter(item.tenant for item in got) == {"a": 10, "b": 10}
    assert [item.id for item in got if item.tenant == "a"] == [f"a-{i}" for i in range(10)]


async def test_an_idle_tenants_share_goes_to_the_others_and_it_banks_no_credit() -> None:
    q: StageQueue[Item] = StageQueue(1000, weight=weights({"a": 1.0, "b": 3.0}))
    backlog(q, "a", 50)
    assert {item.tenant for item in taken(q, 50)} == {"a"}  # b idle: a gets every slot
    assert q.take() is None
    # b comes back after a took 50 slots alone: it gets its 3:1 share from now, not 50 slots
    # of catching up.
    a_more = [Item(f"a-more-{i}", "a") for i in range(40)]
    for item in a_more:
        q.put_nowait(item)
    backlog(q, "b", 40)
    split = Counter(item.tenant for item in taken(q, 40))
    assert abs(split["a"] - 10) <= 1 and split.total() == 40, split  # 3:1, within a slot


async def test_priorities_hold_within_a_tenant() -> None:
    q: StageQueue[Item] = StageQueue(100)
    for name, priority in [("a0", 0), ("a1", 1), ("a2", 0), ("a3", 1)]:
        q.put_nowait(Item(name, "a", priority))
    backlog(q, "b", 4)
    order = [item.id for item in taken(q, 8) if item.tenant == "a"]
    assert order == ["a1", "a3", "a0", "a2"]


async def test_discard_reserve_and_a_held_back_tenant() -> None:
    held = {"a"}
    q: StageQueue[Item] = StageQueue(4, may_take=lambda tenant: tenant not in held)
    a0, a1 = backlog(q, "a", 2)
    q.reserve("b")
    (b0,) = backlog(q, "b", 1)
    assert q.free == 0
    assert q.discard(a0) and not q.discard(a0) and q.waiting("a") == 1
    assert q.take() is b0  # a is held back (at its sandbox quota): b goes first
    assert q.take() is None
    held.clear()
    assert await q.get() is a1  # a0 was discarded: never taken
    q.put_nowait(Item("b1", "b"), reserved=True)
    assert q.take() is not None and len(q) == 0 and q.free == 4


def test_a_token_budget_refuses_until_its_window_frees() -> None:
    now = [1000.0]
    meter = TokenMeter(clock=lambda: now[0])
    policy = TenantPolicy(quotas=Quotas(llm_tokens_per_day=100))
    meter.add(60)
    assert meter.over(policy) is None
    now[0] += 10
    meter.add(50)
    spent = meter.over(policy)
    assert spent is not None and spent[0] == "llm_tokens_per_day"
    assert spent[1] == pytest.approx(DAY_S - 10)  # once the first 60 tokens leave the window
    now[0] += DAY_S - 10
    assert meter.over(policy) is None
    per_s = TenantPolicy(quotas=Quotas(llm_tokens_per_s=1.0))  # 60 a minute
    meter.add(60)
    assert meter.over(per_s) is not None and meter.over(TenantPolicy()) is None


def req(tenant: str, **stages: str) -> JobRequest:
    return JobRequest.of(probe_instance(**stages), tenant=tenant)


async def test_jobs_in_flight_quota_refuses_whole_and_loses_nothing(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    policies = policies_from({"a": TenantPolicy(quotas=Quotas(max_jobs_in_flight=2))})
    async with make_pipeline(tenants=policies, init_workers=3) as pipeline:
        accepted = await pipeline.submit([req("a", init="block"), req("a", init="block")])
        with pytest.raises(QuotaExceeded) as refused:
            await pipeline.submit([req("b"), req("a")])  # b's job goes with it: all or none
        assert refused.value.quota == "max_jobs_in_flight" and refused.value.tenant == "a"
        assert refused.value.retry_after_s >= 1
        assert pipeline.stats()["in_flight"] == 2
        (b,) = await pipeline.submit([req("b")])  # another tenant is accepted meanwhile
        assert (await finished(pipeline, b.job_id))["state"] == "done"
        for view in accepted:
            await probe.wait_entered(view.job_id, "init")
            probe.release(view.job_id, "init")
        results = [await finished(pipeline, view.job_id) for view in accepted]
        assert [r["state"] for r in results] == ["done", "done"]
        (again,) = await pipeline.submit([req("a")])  # its jobs finished: a is accepted again
        assert (await finished(pipeline, again.job_id))["state"] == "done"
        idle = {"in_flight": 0, "sandboxes": 0}
        assert pipeline.stats()["tenants"] == {"a": idle, "b": idle}


def test_a_tenant_arriving_at_a_queue_another_filled_gets_its_weighted_share_of_places() -> None:
    q: StageQueue[Item] = StageQueue(4, weight=weights({"a": 1.0, "b": 3.0}))
    backlog(q, "a", 4)
    with pytest.raises(QueueFull):
        q.put_nowait(Item("a-4", "a"))  # the control: full for the tenant that filled it
    backlog(q, "b", 3)  # b's share: 3 of the 4 places
    with pytest.raises(QueueFull):
        q.put_nowait(Item("b-3", "b"))
    assert q.room("a") == 0 and q.room("b") == 0 and len(q) == 7  # under twice its size
    assert [item.tenant for item in taken(q, 2)] == ["b", "b"]  # by weight
    assert q.room("a") == 0 and q.room("b") == 2  # 5 of 4 held: the places freed are b's
    assert [item.tenant for item in taken(q, 3)] == ["a", "b", "a"]  # a tie: a started first
    assert q.room("a") == 2 and q.room("b") == 3  # a holds 2: the free ones, or b's share


def test_newcomers_shares_beyond_a_full_queue_stop_at_twice_its_size() -> None:
    q: StageQueue[Item] = StageQueue(4)
    backlog(q, "a", 4)
    for tenant, share in [("b", 2), ("c", 1), ("d", 1)]:  # 4 / 2, 4 / 3, 4 / 4 of the places
        assert q.room(tenant) == share
        backlog(q, tenant, share)
    assert len(q) == 8 and q.room("e") == 0  # e's share is a place, but 8 is twice the size
    with pytest.raises(QueueFull):
        q.put_nowait(Item("e-0", "e"))


def test_a_tenant_alone_fills_the_queue_and_no_more() -> None:
    q: StageQueue[Item] = StageQueue(3)
    backlog(q, "a", 2)
    q.reserve("a")
    assert q.room("a") == 0
    with pytest.raises(QueueFull):
        q.reserve("a")


def test_a_full_next_queue_holds_back_only_the_tenant_that_filled_it() -> None:
    after: StageQueue[Item] = StageQueue(2)
    before: StageQueue[Item] = StageQueue(10, hands_to=after)
    backlog(after, "a", 2)
    backlog(before, "a", 2)
    assert before.take() is None  # the control: a's next queue is full
    (b0,) = backlog(before, "b", 1)
    assert before.take() is b0  # b holds nothing there: its place is reserved beyond the size
    assert before.take() is None and after.room("b") == 0
    after.put_nowait(b0, reserved=True)
    assert len(after) == 3


def test_a_slot_is_kept_for_a_tenant_under_its_share_with_a_job_on_its_way() -> None:
    table = weights({"a": 1.0, "b": 1.0})
    init = StageSlots(2, table)
    run = StageSlots(4, table, before=init)
    for _ in range(3):
        run.take("a")
    assert run.may_take("a")  # the control: nothing of b's on its way, the last slot is a's
    init.take("b")  # b's job in INIT: the one free RUN slot is kept for it
    assert not run.may_take("a") and run.may_take("b")
    init.give_back("b")  # it ended in INIT (failed, cancelled): nothing is on its way
    assert run.may_take("a")


def test_slots_are_kept_by_weight_and_only_up_to_the_jobs_on_their_way() -> None:
    table = weights({"a": 3.0, "b": 1.0})
    init = StageSlots(8, table)
    run = StageSlots(8, table, before=init)
    for tenant in ["a"] * 5 + ["b"] * 3:
        (run if tenant == "a" else init).take(tenant)  # b: three jobs on their way
    assert run.may_take("a")  # a is under its share of 6
    run.take("a")
    assert not run.may_take("a")  # 2 free: both kept for b, its share of 8 (not three)
    run.take("a")  # were a to take one anyway (a share shrunk by a reload)...
    assert not run.may_take("a") and run.may_take("b")  # ...one is still b's


async def test_a_tenant_at_its_sandbox_cap_waits_while_another_goes_ahead(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    policies = policies_from({"a": TenantPolicy(quotas=Quotas(max_sandboxes=1))})
    async with make_pipeline(tenants=policies) as pipeline:
        a0, a1 = await pipeline.submit([req("a", init="block"), req("a")])
        (b0,) = await pipeline.submit([req("b", init="block")])
        await probe.wait_entered(a0.job_id, "init")
        await probe.wait_entered(b0.job_id, "init")  # two INIT workers: a1 was passed over
        job = pipeline.active(a1.job_id)
        assert job is not None and job.state is JobState.QUEUED
        assert pipeline.stats()["tenants"]["a"] == {"in_flight": 2, "sandboxes": 1}
        probe.release(a0.job_id, "init")
        assert (await finished(pipeline, a1.job_id))["state"] == "done"  # it waited, not failed
        probe.release(b0.job_id, "init")
        for view in (a0, b0):
            assert (await finished(pipeline, view.job_id))["state"] == "done"


async def test_a_full_init_queue_refuses_the_tenant_that_filled_it_not_another(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=1, init_queue=2) as pipeline:
        (a0,) = await pipeline.submit([req("a", init="block")])
        await probe.wait_entered(a0.job_id, "init")
        flood = await pipeline.submit([req("a"), req("a")])
        with pytest.raises(InitQueueFull) as refused:
            await pipeline.submit([req("a")])  # the control: a filled it
        assert "0 places left to this tenant" in str(refused.value)
        (b0,) = await pipeline.submit([req("b")])  # b's share of the places, a's backlog aside
        with pytest.raises(InitQueueFull):
            await pipeline.submit([req("b")])  # and no more: its share of 2 is 1
        probe.release(a0.job_id, "init")
        for view in (a0, *flood, b0):
            assert (await finished(pipeline, view.job_id))["state"] == "done"


async def test_a_tenant_never_waits_behind_anothers_jobs_held_before_a_full_queue(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=2, run_workers=1, run_queue=1) as pipeline:
        (a0,) = await pipeline.submit([req("a", run="block")])
        await probe.wait_entered(a0.job_id, "run")
        flood = await pipeline.submit([req("a") for _ in range(4)])
        await settle(lambda: pipeline.stats()["stages"]["run"]["queued"] == 1)
        (b0,) = await pipeline.submit([req("b")])  # the RUN queue is full of a's jobs
        probe.release(a0.job_id, "run")
        for view in (a0, *flood, b0):
            assert (await finished(pipeline, view.job_id))["state"] == "done"
    ran = [job_id for job_id, stage in probe.order if stage == "run"]
    # b's job went through INIT though a's filled the RUN queue (b held no place there), and
    # runs next, ahead of a's jobs that came first, the one already through INIT included.
    assert ran == [a0.job_id, b0.job_id, *(v.job_id for v in flood)]


async def test_a_run_slot_freed_waits_for_a_tenants_job_in_init_not_anothers_backlog(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=2, run_workers=2) as pipeline:
        a0, a1 = await pipeline.submit([req("a", run="block"), req("a", run="block")])
        await probe.wait_entered(a0.job_id, "run")
        await probe.wait_entered(a1.job_id, "run")  # a holds both RUN slots
        (a2,) = await pipeline.submit([req("a")])
        await settle(lambda: pipeline.stats()["stages"]["run"]["queued"] == 1)  # a2, through INIT
        (b0,) = await pipeline.submit([req("b", init="block")])
        await probe.wait_entered(b0.job_id, "init")
        probe.release(a0.job_id, "run")
        assert (await finished(pipeline, a0.job_id))["state"] == "done"
        probe.release(b0.job_id, "init")
        probe.release(a1.job_id, "run")
        for view in (a1, a2, b0):
            assert (await finished(pipeline, view.job_id))["state"] == "done"
    ran = [job_id for job_id, stage in probe.order if stage == "run"]
    # The slot a0 freed was kept for b0, then in INIT, though a2 was waiting for it already;
    # without it kept, a2 would have taken it at once and b0 waited for a1 to end.
    assert ran == [a0.job_id, a1.job_id, b0.job_id, a2.job_id]


async def test_over_quota_is_a_429_with_retry_after_naming_it_and_tenants_are_counted(
    tmp_path: Path, registry: TaskRegistry, probe: ProbeTask
) -> None:
    app = create_app(ServeSettings(db=tmp_path / "api.db", cancel_grace_s=0.05), registry)
    async with app.router.lifespan_context(app):
        pipeline: Pipeline = app.state.service.pipeline
        pipeline.set_tenants(
            policies_from({"default": TenantPolicy(quotas=Quotas(max_jobs_in_flight=1))})
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            body = {"instance": probe_instance(init="block"), "job_id": "first"}
            assert (await http.post("/v1/rollouts", json=body)).status_code == 202
            r = await http.post("/v1/rollouts", json={"instance": probe_instance()})
            assert r.status_code == 429
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["quota"] == "max_jobs_in_flight"
            assert "max_jobs_in_flight" in r.json()["detail"]
            metrics = (await http.get("/metrics")).text
            assert 'raas_tenant_jobs_in_flight{tenant="default"} 1.0' in metrics
            await probe.wait_entered("first", "init")
            probe.release("first", "init")
            done = await http.get("/v1/rollouts/first", params={"wait": WAIT_S})
            assert done.json()["result"]["state"] == "done"
            await settle(lambda: pipeline.stats()["in_flight"] == 0)
            r = await http.post("/v1/rollouts", json={"instance": probe_instance()})
            assert r.status_code == 202  # accepted again
            second = await http.get(f"/v1/rollouts/{r.json()['job_id']}", params={"wait": WAIT_S})
            assert second.json()["result"]["state"] == "done"
            metrics = (await http.get("/metrics")).text
            usage = (await http.get("/v1/usage", params={"since_s": 3600})).json()
    assert 'raas_tenant_jobs_submitted_total{tenant="default"} 2.0' in metrics
    assert 'raas_tenant_jobs_finished_total{state="done",tenant="default"} 2.0' in metrics
    assert 'raas_tenant_llm_tokens_total{direction="out",tenant="default"} 6.0' in metrics
    assert 'raas_tenant_stage_seconds_total{stage="init",tenant="default"}' in metrics
    assert 'raas_tenant_sandbox_seconds_total{tenant="default"}' in metrics
    (default,) = usage["tenants"]
    assert default["tenant"] == "default" and default["submitted"] == 2
    assert default["finished"] == {"done": 2} and default["tokens_out"] == 6
    assert default["sandbox_s"] > 0 and set(default["stage_s"]) == {"init", "run", "eval"}


def test_raas_usage_prints_a_row_a_tenant_in_80_columns_and_reads_durations() -> None:
    from click.testing import CliRunner
    from rich.console import Console

    from raas.cli import main
    from raas.cli.usage import usage_table
    from raas.wire import TenantUsage, UsageReport

    report = UsageReport(
        since_s=7200,
        tenants=[
            TenantUsage(
                tenant="team-with-a-very-long-name",
                submitted=123456,
                finished={"done": 120000, "failed": 3456},
                stage_s={"init": 1e5, "run": 2e5, "eval": 3e4},
                sandbox_s=3.3e5,
                tokens_in=12_345_678_901,
                tokens_out=98_765_432,
            ),
            TenantUsage(tenant="b", submitted=2, finished={"done": 2}),
        ],
    )
    console = Console(width=80, record=True)
    console.print(usage_table(report))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "last 2h" in text and "12.3G" in text and "3456" in text and "team-with" in text
    bad = CliRunner().invoke(main, ["usage", "http://127.0.0.1:1", "--since", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output
