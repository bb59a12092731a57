"""`raas bench pipeline`: what separating the stages buys when the LLM is the scarce resource.

Part 1, same run, same 8 LLM slots: a task whose stages sleep (init 0.1 s, run 0.2 s holding an LLM
slot, eval 0.8 s). Coupled baseline: 8 workers, each doing init, run and eval in turn (a trainer
that embeds rollouts). Pipeline: raas's three pools, 8 RUN workers, INIT and EVAL sized so that
RUN never starves. Prints jobs/s, LLM-slot utilisation and the throughput ratio.

Part 2, service overhead: no-op jobs end to end over HTTP (submit, then long-poll the result),
driven by a load generator that is not the bottleneck (wrk, a compiled one, with a Lua script
for the two-request cycle; several Python processes where wrk is missing, said so), against its
floor measured in the same run: bare HTTP round trips (GET /healthz) on the same connections.
Prints jobs/s, the server's CPU per job (from /proc) and the ratios to the floor; then the same
jobs from one Python client (httpx, a few in flight), as a trainer would send them.
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
from raas.bench import jobload
from raas.bench.forked import ForkedServer
from raas.pipeline import JobRequest, Pipeline, PipelineConfig, Stage
from raas.settings import load_settings
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
    views = await pipeline.submit([JobRequest.of({"data_source": "sleep"}) for _ in range(n_jobs)])
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
        (view,) = await pipeline.submit([JobRequest.of({"data_source": "noop"})])
        await pipeline.wait(view.job_id, 10.0)
        latencies.append(time.perf_counter() - start)
    await pipeline.stop()
    await store.close()
    return latencies


def _serve_noop(port: int, db: Path) -> None:
    registry = TaskRegistry()
    registry.register(NoopTask())
    app = create_app(load_settings(None, {"db": db, "port": port}), registry)
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


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def ms(values: list[float]) -> str:
    return f"p50 {1000 * statistics.median(values):.2f} ms, p99 {1000 * pct(values, 99):.2f} ms"


def _loaded(
    server: ForkedServer, args: argparse.Namespace, cycle: bool
) -> tuple[jobload.LoadRun, float]:
    """A load run on the server, and the server's CPU seconds during it."""
    before = server.cpu_s()
    run = jobload.run_load(server.url, args.connections, args.load_s, cycle)
    return run, server.cpu_s() - before


def overhead(server: ForkedServer, args: argparse.Namespace) -> None:
    if jobload.wrk_path() is None:
        print(f"  {jobload.MISSING_WRK}")
    print(
        f"  load: {jobload.generator_name(args.connections)}, {args.load_s:g} s a run,"
        f" medians of {args.repeats} runs"
    )
    jobload.run_load(server.url, args.connections, 1.0, cycle=True)  # warm up
    bare, jobs = [], []
    for _ in range(args.repeats):  # alternated, so both see the same machine
        bare.append(_loaded(server, args, cycle=False))
        jobs.append(_loaded(server, args, cycle=True))
    rt_rate = statistics.median(r.requests_per_s for r, _ in bare)
    rt_cpu = statistics.median(cpu / r.requests for r, cpu in bare)
    rt_p50 = statistics.median(r.p50_s for r, _ in bare)
    job_rate = statistics.median(r.jobs_per_s for r, _ in jobs)
    job_cpu = statistics.median(cpu / max(r.jobs, 1) for r, cpu in jobs)
    job_p50 = statistics.median(r.p50_s for r, _ in jobs)
    job_p99 = statistics.median(r.p99_s for r, _ in jobs)
    failed = sum(r.failed for r, _ in jobs)
    print(
        f"  floor, bare HTTP round trips (GET /healthz): {rt_rate:.0f} requests/s,"
        f" p50 {1000 * rt_p50:.2f} ms; server CPU {1000 * rt_cpu:.3f} ms a request"
    )
    print(
        f"  job cycle (POST /v1/rollouts, long-poll GET): {job_rate:.0f} jobs/s; a request"
        f" p50 {1000 * job_p50:.2f} ms, p99 {1000 * job_p99:.2f} ms, failed {failed}"
    )
    print(
        f"  server CPU per job: {1000 * job_cpu:.3f} ms (~{1 / job_cpu:.0f} jobs/s a core),"
        f" {job_cpu / (2 * rt_cpu):.1f}x the floor's two bare requests"
    )
    print(f"  jobs/s vs the floor (bare round trips / 2): {job_rate / (rt_rate / 2):.2f}")
    # One Python client in the trainer's process, as before: the client is its bottleneck.
    lat, wall = asyncio.run(http_noop(server.url, args.noop_jobs, args.concurrency))
    print(
        f"  one Python client (httpx), {args.concurrency} in flight: {args.noop_jobs / wall:.0f}"
        f" jobs/s, {ms(lat)}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench pipeline", description=__doc__)
    parser.add_argument("--jobs", type=int, default=96, help="jobs per design in part 1")
    parser.add_argument("--noop-jobs", type=int, default=500, help="no-op jobs in part 2")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="jobs in flight from the Python client"
    )
    parser.add_argument(
        "--connections", type=int, default=8, help="load generator connections in part 2"
    )
    parser.add_argument("--load-s", type=float, default=5.0, help="seconds a load run")
    parser.add_argument("--repeats", type=int, default=3, help="load runs of each kind")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        print(
            f"part 1: {args.jobs} jobs, {LLM_SLOTS} LLM slots,"
            f" stages init {INIT_S} s / run {RUN_S} s (LLM) / eval {EVAL_S} s"
        )
        c_wall, c_util = asyncio.run(coupled(args.jobs))
        p_wall, p_util = asyncio.run(pipelined(args.jobs, tmpdir / "p.db"))
        c_rate, p_rate = args.jobs / c_wall, args.jobs / p_wall
        print(
            f"  coupled  (8 workers, init+run+eval each): {c_rate:6.2f} jobs/s,"
            f" LLM-slot utilisation {100 * c_util:5.1f}%"
        )
        print(
            f"  pipeline (INIT 8, RUN 8, EVAL 40):        {p_rate:6.2f} jobs/s,"
            f" LLM-slot utilisation {100 * p_util:5.1f}%"
        )
        print(f"  throughput ratio pipeline/coupled: {p_rate / c_rate:.2f}x")

        print("part 2: no-op jobs")
        inproc = asyncio.run(in_process_noop(args.noop_jobs, tmpdir / "n.db"))
        print(f"  in-process pipeline, one at a time (submit -> persisted result): {ms(inproc)}")
        with ForkedServer(_serve_noop, tmpdir / "h.db") as server:
            overhead(server, args)
    return 0
