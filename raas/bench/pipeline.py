"""`raas bench pipeline`: what separating the stages buys when the LLM is the scarce resource.

Part 1, same run, same 8 LLM slots: a task whose stages sleep (init 0.1 s, run 0.2 s holding an LLM
slot, eval 0.8 s). Coupled baseline: 8 workers, each doing init, run and eval in turn (a trainer
that embeds rollouts). Pipeline: raas's three pools, 8 RUN workers, INIT and EVAL sized so that
RUN never starves. Prints jobs/s, LLM-slot utilisation and the throughput ratio.

Part 2, service overhead: no-op jobs end to end over HTTP (submit, then long-poll the result),
against a bare HTTP round trip and the in-process pipeline measured in the same run.
Prints medians and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import uvicorn

from raas.api.app import create_app
from raas.bench.forked import ForkedServer
from raas.pipeline import JobRequest, Pipeline, PipelineConfig, Stage
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import RewardInfo, TaskContext, TaskJob, TaskRegistry
from raas.wire import Trajectory

LLM_SLOTS = 8
INIT_S, RUN_S, EVAL_S = 0.1, 0.2, 0.8


class LLMSlots:
    """A semaphore that adds up how long its slots were held."""

    def __init__(self, n: int) -> None:
        self.sem = asyncio.Semaphore(n)
        self.busy_s = 0.0

    async def hold(self, seconds: float) -> None:
        async with self.sem:
            start = time.perf_counter()
            await asyncio.sleep(seconds)
            self.busy_s += time.perf_counter() - start


class SleepTask:
    name = "sleep"

    def __init__(self, llm: LLMSlots) -> None:
        self.llm = llm

    async def init(self, job: TaskJob) -> TaskContext:
        await asyncio.sleep(INIT_S)
        return TaskContext(job=job)

    async def run(self, context: TaskContext) -> Trajectory:
        await self.llm.hold(RUN_S)
        return context.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        await asyncio.sleep(EVAL_S)
        return RewardInfo(1.0)

    async def cleanup(self, context: TaskContext) -> None:
        return None


class NoopTask:
    name = "noop"

    async def init(self, job: TaskJob) -> TaskContext:
        return TaskContext(job=job)

    async def run(self, context: TaskContext) -> Trajectory:
        return context.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        return RewardInfo(0.0)

    async def cleanup(self, context: TaskContext) -> None:
        return None


async def coupled(n_jobs: int) -> tuple[float, float]:
    llm = LLMSlots(LLM_SLOTS)
    jobs = asyncio.Queue[int]()
    for i in range(n_jobs):
        jobs.put_nowait(i)

    async def worker() -> None:
        while not jobs.empty():
            jobs.get_nowait()
            await asyncio.sleep(INIT_S)
            await llm.hold(RUN_S)
            await asyncio.sleep(EVAL_S)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(LLM_SLOTS)))
    wall = time.perf_counter() - start
    return wall, llm.busy_s / (LLM_SLOTS * wall)


async def pipelined(n_jobs: int, db: Path) -> tuple[float, float]:
    llm = LLMSlots(LLM_SLOTS)
    registry = TaskRegistry()
    registry.register(SleepTask(llm))
    # RUN demands 8 / 0.2 s = 40 jobs/s: INIT needs >= 4 workers, EVAL >= 32.
    config = PipelineConfig(
        workers={Stage.INIT: 8, Stage.RUN: LLM_SLOTS, Stage.EVAL: 40},
        queue_size={Stage.INIT: n_jobs, Stage.RUN: n_jobs, Stage.EVAL: n_jobs},
    )
    store = ResultStore(db)
    await store.open()
    pipeline = Pipeline(registry, store, config)
    await pipeline.start()
    start = time.perf_counter()
    views = await pipeline.submit([JobRequest({"data_source": "sleep"}) for _ in range(n_jobs)])
    for view in views:
        job = pipeline.active(view.job_id)
        if job is not None:
            await job.done.wait()
    wall = time.perf_counter() - start
    await pipeline.stop()
    await store.close()
    return wall, llm.busy_s / (LLM_SLOTS * wall)


async def in_process_noop(n_jobs: int, db: Path) -> list[float]:
    registry = TaskRegistry()
    registry.register(NoopTask())
    store = ResultStore(db)
    await store.open()
    pipeline = Pipeline(registry, store, PipelineConfig())
    await pipeline.start()
    latencies = []
    for _ in range(n_jobs):
        start = time.perf_counter()
        (view,) = await pipeline.submit([JobRequest({"data_source": "noop"})])
        await pipeline.wait(view.job_id, 10.0)
        latencies.append(time.perf_counter() - start)
    await pipeline.stop()
    await store.close()
    return latencies


def _serve_noop(port: int, db: Path) -> None:
    registry = TaskRegistry()
    registry.register(NoopTask())
    app = create_app(ServeSettings(db=db, port=port), registry)
    uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning")).run()


async def http_noop(url: str, n_jobs: int, concurrency: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:

        async def one() -> None:
            async with gate:
                start = time.perf_counter()
                r = await http.post("/v1/rollouts", json={"instance": {"data_source": "noop"}})
                job_id = r.json()["job_id"]
                body = (await http.get(f"/v1/rollouts/{job_id}", params={"wait": 10})).json()
                assert body["state"] == "done", body
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n_jobs)))
        return latencies, time.perf_counter() - start


async def http_roundtrip(url: str, n: int) -> list[float]:
    out = []
    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(n):
            start = time.perf_counter()
            await http.get("/healthz")
            out.append(time.perf_counter() - start)
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def ms(values: list[float]) -> str:
    return f"p50 {1000 * statistics.median(values):.2f} ms, p99 {1000 * pct(values, 99):.2f} ms"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench pipeline", description=__doc__)
    parser.add_argument("--jobs", type=int, default=96, help="jobs per design in part 1")
    parser.add_argument("--noop-jobs", type=int, default=500, help="no-op jobs in part 2")
    parser.add_argument("--concurrency", type=int, default=4, help="HTTP clients in part 2")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        print(f"part 1: {args.jobs} jobs, {LLM_SLOTS} LLM slots,"
              f" stages init {INIT_S} s / run {RUN_S} s (LLM) / eval {EVAL_S} s")  # fmt: skip
        c_wall, c_util = asyncio.run(coupled(args.jobs))
        p_wall, p_util = asyncio.run(pipelined(args.jobs, tmpdir / "p.db"))
        c_rate, p_rate = args.jobs / c_wall, args.jobs / p_wall
        print(f"  coupled  (8 workers, init+run+eval each): {c_rate:6.2f} jobs/s,"
              f" LLM-slot utilisation {100 * c_util:5.1f}%")  # fmt: skip
        print(f"  pipeline (INIT 8, RUN 8, EVAL 40):        {p_rate:6.2f} jobs/s,"
              f" LLM-slot utilisation {100 * p_util:5.1f}%")  # fmt: skip
        print(f"  throughput ratio pipeline/coupled: {p_rate / c_rate:.2f}x")

        print(f"part 2: {args.noop_jobs} no-op jobs")
        inproc = asyncio.run(in_process_noop(args.noop_jobs, tmpdir / "n.db"))
        print(f"  in-process pipeline, one at a time (submit -> persisted result): {ms(inproc)}")
        with ForkedServer(_serve_noop, tmpdir / "h.db") as server:
            bare = asyncio.run(http_roundtrip(server.url, args.noop_jobs))
            cpu_before = server.cpu_s()
            lat, wall = asyncio.run(http_noop(server.url, args.noop_jobs, args.concurrency))
            server_ms = 1000 * (server.cpu_s() - cpu_before) / args.noop_jobs
        print(f"  bare HTTP round trip (GET /healthz): {ms(bare)}")
        print(f"  HTTP end to end, {args.concurrency} concurrent clients (POST + long-poll GET):"
              f" {args.noop_jobs / wall:.0f} jobs/s, {ms(lat)}")  # fmt: skip
        print(f"  server CPU per job: {server_ms:.2f} ms (~{1000 / server_ms:.0f} jobs/s a core);"
              " the Python client shares the 2 cores and limits the rate above")  # fmt: skip
        print(f"  added latency per job vs. a bare round trip at p50:"
              f" {statistics.median(lat) / statistics.median(bare):.1f}x")  # fmt: skip
    return 0
