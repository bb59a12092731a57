"""`raas bench dapo`: filling B informative GRPO groups, asynchronously replenished (raas) versus
the textbook synchronous over-sample-then-filter loop, against the same service, in one run.

The task is a lottery whose reward is 1 with probability p (p per prompt from {0.1, 0.5, 0.9}, so
some groups are uniform) and whose rollouts take a long-tailed time (log-normal, median
``--median-ms``, 50 by default, cut at 40 times it). Prints wall time to fill the batch, the ratio,
and the rollouts each approach wasted (samples of groups that were dropped, cancelled, or not
needed). Replenishing pays where a rollout's time is the model's and the tools' (a long tail to
wait out), not raas's own CPU: on a machine whose cores raas itself fills, short rollouts leave
little to win. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from raas.bench.forked import ForkedServer, serve_raas
from raas.client import RolloutClient, collect_groups, reward_varies
from raas.settings import load_settings
from raas.tasks import RewardInfo, TaskContext, TaskJob
from raas.wire import Trajectory


class LotteryTask:
    name = "lottery"

    async def init(self, job: TaskJob) -> TaskContext:
        return TaskContext(job=job)

    async def run(self, context: TaskContext) -> Trajectory:
        rng = random.Random(context.job.job_id)
        median_s = float(context.job.instance["median_s"])
        await asyncio.sleep(min(median_s * math.exp(rng.gauss(0, 1.0)), 40 * median_s))
        return context.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        rng = random.Random(context.job.job_id + "reward")
        return RewardInfo(1.0 if rng.random() < float(context.job.instance["p"]) else 0.0)

    async def cleanup(self, context: TaskContext) -> None:
        return None


def prompts(seed: int, median_s: float) -> Any:
    rng = random.Random(seed)
    i = 0
    while True:
        p = rng.choice([0.1, 0.5, 0.9])
        yield {"data_source": "lottery", "p": p, "i": i, "median_s": median_s}
        i += 1


async def synchronous(
    client: RolloutClient, b: int, n: int, oversample: float, seed: int, median_s: float
) -> tuple[float, int, int]:
    """Over-sample a whole batch, wait for all of it, filter; repeat until B are kept."""
    source = prompts(seed, median_s)
    kept, rollouts, start = 0, 0, time.perf_counter()
    while kept < b:
        tasks = [next(source) for _ in range(math.ceil(b * oversample))]
        groups = await client.generate_groups(tasks, n)
        rollouts += len(tasks) * n
        kept += sum(1 for g in groups if reward_varies(g))
    return time.perf_counter() - start, rollouts, rollouts - b * n


async def asynchronous(
    client: RolloutClient, b: int, n: int, in_flight: int, seed: int, median_s: float
) -> tuple[float, int, int]:
    start = time.perf_counter()
    groups, report = await collect_groups(
        client, prompts(seed, median_s), n=n, batch_size=b, max_in_flight=in_flight
    )
    wall = time.perf_counter() - start
    return wall, report.jobs_submitted, report.jobs_submitted - len(groups) * n


async def bench(args: argparse.Namespace, url: str) -> None:
    in_flight = math.ceil(args.batch * args.oversample) * args.n
    p_info = statistics.mean(1 - p**args.n - (1 - p) ** args.n for p in (0.1, 0.5, 0.9))
    print(
        f"B={args.batch} groups of n={args.n}; chance a group is informative {p_info:.2f};"
        f" sync over-samples {args.oversample}x per round, async keeps {in_flight} in flight;"
        f" rollouts take {args.median_ms:g} ms at the median; {args.repeats} repeats each"
        " (medians)"
    )
    sync, asyn = [], []
    median_s = args.median_ms / 1000
    async with RolloutClient(url) as client:
        for r in range(args.repeats):
            sync.append(await synchronous(client, args.batch, args.n, args.oversample, r, median_s))
            asyn.append(await asynchronous(client, args.batch, args.n, in_flight, r, median_s))
    for name, runs in (
        ("synchronous over-sample-then-filter", sync),
        ("async replenishment", asyn),
    ):
        print(
            f"  {name:<36} {statistics.median(x[0] for x in runs):6.2f} s,"
            f" {statistics.median(x[1] for x in runs):5.0f} rollouts started,"
            f" {statistics.median(x[2] for x in runs):5.0f} wasted"
        )
    ratio = statistics.median(x[0] for x in sync) / statistics.median(x[0] for x in asyn)
    print(f"  time to fill the batch, synchronous / asynchronous: {ratio:.2f}x")


def _serve(port: int, db: Path) -> None:
    settings = load_settings(
        None,
        {
            "db": db,
            "init_workers": 64,
            "run_workers": 256,
            "eval_workers": 64,
            "run_queue": 1024,
            "eval_queue": 1024,
        },
    )
    serve_raas(port, settings, [LotteryTask()], log_level="error")  # no line per cancelled job


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench dapo", description=__doc__)
    parser.add_argument("--batch", type=int, default=16, help="B informative groups")
    parser.add_argument("--n", type=int, default=4, help="samples per group")
    parser.add_argument("--oversample", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--median-ms", type=float, default=50.0, help="a rollout's median time (log-normal)"
    )
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ForkedServer(_serve, Path(tmp) / "dapo.db") as server,
    ):
        asyncio.run(bench(args, server.url))
    return 0
