"""`raas bench harbor`: EVAL time of Harbor tasks with and without the twins of their tests.

For each task of ``--tasks`` (a task directory or a dataset of them; default
examples/harbor_pytest, whose test.sh runs pytest on the agent's module), built first, gold's
solution (``solution/solve.sh``, run where the agent works) is judged ``--repeats`` times each
way, in turn: without twins (the floor: the verifier in one fork of the agent's files, the EVAL
of a task with no Python tests) and with them (the harbor task's own EVAL: the real run in a
fork of a frozen fork, then up to ``PER_EVAL`` twin runs, each one more). The first EVAL with
twins also calibrates them against gold (gold's own sandbox, solve.sh, and a verifier run for the
real tests and each twin; cached for the process): printed apart. An agent that did nothing is
judged both ways too (``no-op``): it fails the real tests and runs no twin, so what it pays is
the frozen fork. INIT and solve.sh are not timed. Prints medians and their ratio; asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from raas.helpers.task_dirs import read_task_dir, task_dirs
from raas.sandbox import BwrapConfig, SandboxError
from raas.tasks.agentic import AgentContext
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.harbor.task import SOLVE_TIMEOUT_S, HarborTask, verifier_run, verify
from raas.tasks.protocol import TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

EXAMPLE = Path(__file__).parents[2] / "examples" / "harbor_pytest"


async def solved(
    task: HarborTask, services: TaskServices, instance: dict[str, Any], gold: bool = True
) -> AgentContext:
    """An agent's context after gold's solution, or after nothing (not timed)."""
    ctx = await task.init(TaskJob("bench", instance, {}, services=services))
    assert isinstance(ctx, AgentContext) and ctx.sandbox is not None
    command = HarborInstance.model_validate(instance).gold_command()
    if command is None:
        raise SandboxError(f"{instance.get('name')}: no solution/solve.sh to judge")
    if gold:
        await ctx.sandbox.bash(command, timeout_s=SOLVE_TIMEOUT_S)
    return ctx


async def floor(task: HarborTask, ctx: AgentContext, want: float = 1.0) -> float:
    """EVAL without twins: one fork of the agent's files, the verifier in it (which must score
    ``want``)."""
    assert ctx.sandbox is not None
    instance = HarborInstance.model_validate(ctx.job.instance)
    start = time.perf_counter()
    run = verifier_run(instance, ctx.sandbox)
    files = await ctx.sandbox.fork(carry=task.verifier_carry(ctx.job))
    ctx.closing.append(files)
    await ctx.sandbox.close()
    verdict = await verify(files, instance.config, run, task.services_of(ctx.job))
    took = time.perf_counter() - start
    if verdict.reward != want:
        raise SandboxError(f"{instance.label}: scored {verdict.metrics}, not {want:g}")
    return took


async def no_op_floor(task: HarborTask, ctx: AgentContext) -> float:
    """The floor's EVAL of an agent that did nothing."""
    return await floor(task, ctx, want=0.0)


async def twinned(task: HarborTask, ctx: AgentContext) -> float:
    """The harbor task's own EVAL, twins and all."""
    start = time.perf_counter()
    info = await task.eval(ctx, Trajectory())
    took = time.perf_counter() - start
    if info.reward <= 0 or "tamper" in info.metrics:
        raise SandboxError(f"{ctx.job.instance.get('name')}: gold scored {info.metrics}")
    return took


async def failed(task: HarborTask, ctx: AgentContext) -> float:
    """The harbor task's own EVAL of an agent that did nothing: no twin runs."""
    start = time.perf_counter()
    info = await task.eval(ctx, Trajectory())
    took = time.perf_counter() - start
    if info.reward > 0:
        raise SandboxError(f"{ctx.job.instance.get('name')}: a no-op scored {info.metrics}")
    return took


Way = Callable[[HarborTask, AgentContext], Awaitable[float]]


async def timed(
    task: HarborTask, services: TaskServices, instance: dict[str, Any], how: Way
) -> float:
    """``how``'s EVAL time on a fresh agent's context (gold's, but for ``failed``)."""
    ctx = await solved(task, services, instance, gold=how not in (failed, no_op_floor))
    try:
        return await how(task, ctx)
    finally:
        await task.cleanup(ctx)


async def bench(args: argparse.Namespace) -> None:
    store = None if args.store is None else Path(args.store)
    config = BwrapConfig() if store is None else BwrapConfig(image_store=store)
    services = TaskServices(llm=None, sandbox_config=config)  # type: ignore[arg-type]
    task = HarborTask()
    print(
        f"{'task':<24} {'calibrate':>10} {'no twins':>10} {'twins':>10} {'ratio':>7}"
        f" {'no-op':>8} {'floor':>8}"
    )
    try:
        for path in task_dirs(Path(args.tasks)):
            instance = read_task_dir(path)
            calibrate = await timed(task, services, instance, twinned)  # builds, calibrates
            ways = (floor, twinned, failed, no_op_floor)
            took: dict[Way, list[float]] = {way: [] for way in ways}
            for _ in range(args.repeats):  # in turn: a busy moment costs each the same
                for way in ways:
                    took[way].append(await timed(task, services, instance, way))
            low, high, wrong, wrong_low = (statistics.median(took[way]) for way in ways)
            print(
                f"{str(instance.get('name'))[:24]:<24} {calibrate:9.1f}s {low:9.2f}s"
                f" {high:9.2f}s {high / low:6.2f}x {wrong:7.2f}s {wrong_low:7.2f}s"
            )
    finally:
        await services.close()
    print("calibrate: the first EVAL with twins (INIT, the image's build, solve.sh: not timed)")
    print("ratio: EVAL with twins over the floor (the real verifier run alone), gold's solution")
    print("no-op: EVAL of an agent that did nothing (no twin runs), and its floor")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench harbor", description=__doc__)
    parser.add_argument("--tasks", default=str(EXAMPLE), help="a task directory or a dataset")
    parser.add_argument("--repeats", type=int, default=5, help="EVALs of each task, each way")
    parser.add_argument("--store", default=None, help="the image store (default: raas's)")
    asyncio.run(bench(parser.parse_args(argv)))
    return 0
