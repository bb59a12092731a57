"""`raas bench tenants`: two tenants share one pipeline; does a flood of one starve the other?

Pipeline level (no HTTP: the scheduler is what is measured), with the scripted ``countdown``
task, which needs no model, its INIT made to wait ``--init-s`` as a sandbox's set-up would.
Tenant A keeps a backlog of jobs queued (``--backlog``, topped up as they finish) while tenant
B submits a steady stream (``--rate`` jobs a second). Phases, each
``--seconds`` long on a fresh pipeline:

1. B alone: B's latency (submit to result) with nothing else to do, the floor.
2. one tenant: A's flood and B's stream under the same tenant, as a server without tenants
   runs them (first come, first served).
3. fair share: A and B as two tenants of weight 1.
4. weights 2:1: each tenant queues ``--backlog`` jobs at once; of the first ``--backlog``
   jobs each stage ran (both tenants still waiting), the split, which should be 2:1.

Prints B's p50 and p95 latency (submit to result), the p50 ratio to the floor and the p50 of
the part spent waiting in stage queues (what fair share decides; the rest is the stages' work,
slowed by A's jobs sharing the CPU), and the split; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from raas.pipeline import (
    Job,
    JobRequest,
    JobState,
    Overloaded,
    Pipeline,
    PipelineConfig,
    Stage,
    TenantPolicy,
    policies_from,
)
from raas.store.sqlite import ResultStore
from raas.tasks import TaskJob, TaskRegistry
from raas.tasks.countdown import CountdownContext, CountdownTask, generate_instances

INSTANCES = generate_instances(256, seed=7)


class SlotBoundCountdown(CountdownTask):
    """Countdown whose INIT waits ``init_s`` first, as a sandbox's set-up does: the slots, not
    this machine's CPU, are then what the tenants share (countdown alone runs in a millisecond,
    faster than a flood can be submitted, so no backlog would build)."""

    def __init__(self, init_s: float) -> None:
        super().__init__()
        self.init_s = init_s

    async def init(self, job: TaskJob) -> CountdownContext:
        await asyncio.sleep(self.init_s)
        return await super().init(job)


class StageOrder:
    """The tenant of each job each stage ran, in order (a PipelineObserver); ``enough`` is set
    once EVAL has run ``wanted``."""

    def __init__(self, wanted: int = 0) -> None:
        self.tenants: dict[Stage, list[str]] = {stage: [] for stage in Stage}
        self.wanted = wanted
        self.enough = asyncio.Event()

    def job_submitted(self, job: Job) -> None:
        pass

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None:
        self.tenants[stage].append(job.tenant)
        if len(self.tenants[Stage.EVAL]) >= self.wanted:
            self.enough.set()

    def job_finished(self, job: Job, state: JobState) -> None:
        pass


def _request(tenant: str, i: int) -> JobRequest:
    return JobRequest(INSTANCES[i % len(INSTANCES)], tenant=tenant)


async def _flood(pipeline: Pipeline, tenant: str, backlog: int, stop: asyncio.Event) -> None:
    """Keep ``backlog`` of ``tenant``'s jobs in flight until ``stop``."""
    i = 0
    while not stop.is_set():
        held = pipeline.stats()["tenants"].get(tenant, {}).get("in_flight", 0)
        # Small batches, often: a big one's record takes long enough to write that the queues
        # would run dry meanwhile, and a tenant with nothing waiting has no share to measure.
        want = min(backlog - held, 100)
        if want > 0:
            try:
                await pipeline.submit([_request(tenant, i + k) for k in range(want)])
                i += want
            except Overloaded:
                pass
        await asyncio.sleep(0.005)


async def _stream(
    pipeline: Pipeline, tenant: str, rate: float, seconds: float
) -> tuple[list[float], list[float]]:
    """Submit one job every ``1 / rate`` s for ``seconds``; each one's latency, and the part of
    it spent waiting in stage queues."""
    latencies: list[float] = []
    queued: list[float] = []

    async def one(i: int) -> None:
        start = time.perf_counter()
        (view,) = await pipeline.submit([_request(tenant, i)])
        done = await pipeline.wait(view.job_id, 600)
        latencies.append(time.perf_counter() - start)
        if done is not None and done.result is not None:
            queued.append(done.result.timing.queue_s)

    tasks = []
    begin = time.perf_counter()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, begin + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies, queued


async def _pipeline(db: Path, backlog: int, init_s: float, observers: list[StageOrder]) -> Pipeline:
    registry = TaskRegistry()
    registry.register(SlotBoundCountdown(init_s))
    config = PipelineConfig(queue_size={stage: 2 * backlog + 1000 for stage in Stage})
    store = ResultStore(db)
    await store.open()
    return Pipeline(registry, store, config, observers=observers)


async def _close(pipeline: Pipeline) -> None:
    await pipeline.stop()
    await pipeline.store.close()


async def latency_phase(
    db: Path, seconds: float, rate: float, backlog: int, init_s: float, flood: str | None
) -> tuple[list[float], list[float]]:
    """B's latencies (and their queue waits) while ``flood`` (a tenant, or none) keeps
    ``backlog`` jobs in flight."""
    pipeline = await _pipeline(db, backlog, init_s, [])
    await pipeline.start()
    stop = asyncio.Event()
    flooding = asyncio.create_task(_flood(pipeline, flood, backlog, stop)) if flood else None
    try:
        return await _stream(pipeline, "b", rate, seconds)
    finally:
        stop.set()
        if flooding is not None:
            await flooding
        await _close(pipeline)


async def split_phase(
    db: Path, backlog: int, init_s: float, weights: dict[str, float]
) -> StageOrder:
    """Each tenant's ``backlog`` jobs are queued at once (one submission, queued before any
    worker takes one), so that each is backlogged until its last job is taken."""
    order = StageOrder(wanted=backlog)
    pipeline = await _pipeline(db, backlog, init_s, [order])
    pipeline.set_tenants(policies_from({t: TenantPolicy(weight=w) for t, w in weights.items()}))
    await pipeline.start()
    await pipeline.submit([_request(t, i) for t in weights for i in range(backlog)])
    await order.enough.wait()  # the rest is not counted: cancelled
    await _close(pipeline)
    return order


def _p(latencies: list[float], q: int) -> float:
    return statistics.quantiles(latencies, n=100)[q - 1] if len(latencies) > 1 else latencies[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench tenants", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--rate", type=float, default=5.0, help="tenant B's jobs a second")
    parser.add_argument("--backlog", type=int, default=2000, help="tenant A's jobs kept queued")
    parser.add_argument(
        "--init-s", type=float, default=0.05, help="seconds each INIT waits (a sandbox's set-up)"
    )
    args = parser.parse_args(argv)
    # The jobs still queued when a phase ends are cancelled: a warning each, not news here.
    logging.getLogger("raas.pipeline").setLevel(logging.ERROR)
    print(
        f"pipeline level (no HTTP), countdown task with INIT {args.init_s:g} s, 8 workers a"
        f" stage; A keeps {args.backlog} jobs queued, B submits {args.rate:g} jobs/s;"
        f" {args.seconds:g} s a phase"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        phases = {
            "B alone (floor)": None,
            "A and B, one tenant": "b",
            "A and B, two tenants 1:1": "a",
        }
        floor = 0.0
        for i, (name, flood) in enumerate(phases.items()):
            db = tmpdir / f"{i}.db"
            latencies, queued = asyncio.run(
                latency_phase(db, args.seconds, args.rate, args.backlog, args.init_s, flood)
            )
            p50, p95 = _p(latencies, 50), _p(latencies, 95)
            floor = floor or p50
            print(
                f"  {name:<26} B p50 {1000 * p50:8.1f} ms ({p50 / floor:6.2f}x floor),"
                f" p95 {1000 * p95:7.1f} ms; queued p50 {1000 * _p(queued, 50):6.1f} ms"
            )
        weights = {"a": 2.0, "b": 1.0}
        order = asyncio.run(split_phase(tmpdir / "split.db", args.backlog, args.init_s, weights))
        print(
            f"  weights a=2, b=1, {args.backlog} jobs each queued at once: of the first"
            f" {args.backlog} jobs each stage ran (both tenants backlogged)"
        )
        for stage in Stage:
            first = Counter(order.tenants[stage][: args.backlog])
            a, b = first["a"], first["b"]
            ratio = f"{a / b:.2f}" if b else "-"
            print(f"    {stage.value:<5} a {a:6d}  b {b:6d}  a/b {ratio} (2.00 is the fair split)")
    return 0
