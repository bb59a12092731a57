"""`raas bench judges`: EVAL time of the SWE judge per task, with and without its twins.

For each of the first ``--rows`` bundled SWE rows, gold's patch judged ``--repeats`` times each
way, in turn, in fresh bwrap sandboxes: without twins (the floor: one run of the real tests,
``raas.judge.swe.judge_swe``) and with them (the task's own judge: the real run, then the twin
run where the real tests passed). The first judge of a task with twins also runs gold's twins
once (calibration, cached for the process): that one is printed apart. A solution that fails
the real tests runs no twin, so its EVAL costs the floor. Prints medians and their ratio;
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raas.judge.swe import judge_swe
from raas.sandbox import BwrapConfig
from raas.tasks.agentic import fresh_sandbox
from raas.tasks.datasets import bundled
from raas.tasks.services import TaskServices
from raas.tasks.swe import SweTask


async def seconds(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def bench(args: argparse.Namespace) -> None:
    services = TaskServices(llm=None, sandbox_config=BwrapConfig())  # type: ignore[arg-type]
    task = SweTask()
    rows = bundled("swe")[: args.rows]
    print(f"{'task':<22} {'calibrate':>10} {'no twins':>10} {'twins':>10} {'ratio':>7}")
    ratios, floors, withs = [], [], []
    try:
        for row in rows:
            gold = {"patch": row["gold_patch"]}
            files = dict(row["snapshot"]["files"])

            async def plain(row: dict[str, Any] = row, files: dict[str, str] = files) -> None:
                async with fresh_sandbox(services) as sandbox:
                    await judge_swe(
                        sandbox,
                        files=files,
                        patch=row["gold_patch"],
                        fail_to_pass=list(row["FAIL_TO_PASS"]),
                        pass_to_pass=list(row["PASS_TO_PASS"]),
                    )

            async def twinned(row: dict[str, Any] = row, gold: dict[str, str] = gold) -> None:
                info = await task.judge(row, gold, services)
                if info.reward != 1.0:
                    raise RuntimeError(f"{row['instance_id']}: gold scored {info.metrics}")

            calibrate = await seconds(twinned)
            without, with_ = [], []
            for _ in range(args.repeats):  # in turn: a busy moment costs both the same
                without.append(await seconds(plain))
                with_.append(await seconds(twinned))
            floor, twins = statistics.median(without), statistics.median(with_)
            floors.append(floor)
            withs.append(twins)
            ratios.append(twins / floor)
            print(
                f"{row['instance_id']:<22} {1000 * calibrate:8.0f}ms {1000 * floor:8.0f}ms"
                f" {1000 * twins:8.0f}ms {twins / floor:6.2f}x"
            )
    finally:
        await services.close()
    print(
        f"{'median':<22} {'':>10} {1000 * statistics.median(floors):8.0f}ms"
        f" {1000 * statistics.median(withs):8.0f}ms {statistics.median(ratios):6.2f}x"
    )
    print("ratio: EVAL with twins over the floor (the real tests alone), gold's patch")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench judges", description=__doc__)
    parser.add_argument("--rows", type=int, default=8, help="bundled SWE rows (of 24)")
    parser.add_argument("--repeats", type=int, default=5, help="judges of each row, each way")
    asyncio.run(bench(parser.parse_args(argv)))
    return 0
