"""A Harbor dataset checked before anyone trains on it: does each task build, does its gold
solution pass, does a no-op agent already pass (``raas datasets check DIR``).

No model is involved: each task runs as the ``harbor`` task does (its image, its service, the
verifier in a fork of the agent's files), once with ``solution/solve.sh`` run where the agent
works, as the gold policy, and once with nothing done. A task whose gold fails, or whose no-op
passes, pays for the wrong thing and is reported, not trained on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from raas.images.errors import ImageError
from raas.sandbox import SandboxError, ToolError
from raas.tasks.agentic import AgentContext
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.harbor.task import SOLVE_TIMEOUT_S, HarborTask
from raas.tasks.protocol import InvalidInstance, TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory


@dataclass
class TaskCheck:
    """One task's check: its ``gold`` and ``no_op`` rewards (None where not run), and the
    ``error`` that stopped it (a build, a sandbox)."""

    name: str
    gold: float | None = None
    no_op: float | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "broken"
        if self.no_op is not None and self.no_op > 0:
            return "no-op passes"
        if self.gold is None:
            return "no gold"
        return "ok" if self.gold >= 1.0 else "gold fails"

    @property
    def ok(self) -> bool:
        return self.verdict in ("ok", "no gold")


async def check_task(services: TaskServices, instance: dict[str, Any]) -> TaskCheck:
    """``instance`` (a harbor instance) run with its gold solution and with none."""
    parsed = HarborInstance.model_validate(instance)
    check = TaskCheck(parsed.name or "(unnamed)")
    started = time.monotonic()
    try:
        check.no_op = await _reward(services, instance, None)
        gold = parsed.gold_command()
        if gold is not None:
            check.gold = await _reward(services, instance, gold)
    except (ImageError, SandboxError, ToolError, InvalidInstance) as e:
        check.error = f"{type(e).__name__}: {e}"
    check.seconds = time.monotonic() - started
    return check


async def _reward(services: TaskServices, instance: dict[str, Any], command: str | None) -> float:
    task = HarborTask()
    parsed = HarborInstance.model_validate(instance)
    job = TaskJob(job_id="check", instance=instance, sampling_params={}, services=services)
    ctx = await task.init(job)
    assert isinstance(ctx, AgentContext) and ctx.sandbox is not None
    try:
        if command is not None:
            await task.open_agent_network(ctx.sandbox, job, parsed.config)
            ran = await ctx.sandbox.bash(command, timeout_s=SOLVE_TIMEOUT_S)
            if ran.timed_out:
                raise SandboxError(f"solve.sh ran past {SOLVE_TIMEOUT_S:g} s")
        info = await task.eval(ctx, Trajectory())
    finally:
        await task.cleanup(ctx)
    return info.reward
