"""A task handler whose every stage the test controls, and that counts its 'sandboxes'.

Each stage of a job does what the instance says: ``ok`` (return at once), ``block`` (wait until the
test releases it), ``raise`` (raise RuntimeError), ``raise_once`` (raise RuntimeError the first
time only), ``fail_once`` (the first time, wait until released, then raise RuntimeError),
``policy`` (raise a PolicyError), or ``stubborn`` (ignore cancellation until
released). ``init`` opens a sandbox and ``cleanup`` closes it, so a test can check that every
sandbox is closed exactly once, whatever happened. ``run`` writes three generated tokens; as
``broken`` it leaves the last one without a loss_mask entry (a trajectory that breaks the
token invariant), as ``nan`` it gives the last one a NaN logprob. ``reward`` (a number, or its
name such as "nan") sets the reward, 0.5 by default.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from raas.images.errors import ImageNotStored
from raas.pipeline import JobState, Pipeline, Stage
from raas.tasks import RewardInfo, TaskContext, TaskJob
from raas.tasks.protocol import PolicyError
from raas.wire import Trajectory

# A safety net so a broken test fails instead of hanging; never an assertion on speed. A
# minute: a job of real sandboxes on a loaded 2-core machine may take more than 10 s, and a
# passing test never waits it out (every use waits for something that comes).
WAIT_S = 60.0


def probe_instance(**stages: str) -> dict[str, Any]:
    return {"data_source": "probe", **{s: stages.get(s, "ok") for s in ("init", "run", "eval")}}


class ProbeTask:
    name = "probe"

    def __init__(self) -> None:
        self.opened: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()
        self.entered: defaultdict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        self.released: defaultdict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)
        self.closed_event: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.order: list[tuple[str, str]] = []
        self.calls: Counter[tuple[str, str]] = Counter()

    async def wait_entered(self, job_id: str, stage: str) -> None:
        await asyncio.wait_for(self.entered[job_id, stage].wait(), WAIT_S)

    def release(self, job_id: str, stage: str) -> None:
        self.released[job_id, stage].set()

    async def _behave(self, job: TaskJob, stage: str) -> None:
        self.order.append((job.job_id, stage))
        self.calls[job.job_id, stage] += 1
        self.entered[job.job_id, stage].set()
        how = job.instance.get(stage, "ok")
        if how == "raise" or (how == "raise_once" and self.calls[job.job_id, stage] == 1):
            raise RuntimeError(f"boom in {stage}")
        if how == "no_image":  # what the store says of an image it does not hold
            raise ImageNotStored(f"image x:1 is not in the image store (in {stage})")
        if how == "fail_once" and self.calls[job.job_id, stage] == 1:
            await self.released[job.job_id, stage].wait()
            raise RuntimeError(f"boom in {stage}")
        if how == "policy":
            raise PolicyError(f"the model broke {stage}")
        if how == "block":
            await self.released[job.job_id, stage].wait()
        elif how == "stubborn":
            while not self.released[job.job_id, stage].is_set():
                try:
                    await self.released[job.job_id, stage].wait()
                except asyncio.CancelledError:
                    continue

    async def init(self, job: TaskJob) -> TaskContext:
        self.opened[job.job_id] += 1
        try:
            await self._behave(job, "init")
        except BaseException:
            self._close(job.job_id)  # init returns no context, so it releases what it opened
            raise
        return TaskContext(job=job)

    async def run(self, context: TaskContext) -> Trajectory:
        traj = context.trajectory
        traj.turns.append({"turn": 0, "action": "first", "output_tokens": 3, "policy_version": 4})
        malformed = int(context.job.instance.get("malformed", 0))  # tool calls it could not read
        if malformed:
            traj.turns[0]["format_errors"] = ["tool call 1 is not valid JSON"] * malformed
        traj.add_generated([1, 2, 3], [-0.5, -0.5, -0.5])
        how = context.job.instance.get("run")
        if how == "broken":
            traj.loss_mask.pop()
        elif how == "nan":
            traj.logprobs[-1] = float("nan")
        await self._behave(context.job, "run")
        context.trajectory.turns.append({"turn": 1, "action": "second", "output_tokens": 0})
        context.trajectory.stop_reason = "finish"
        return context.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        await self._behave(context.job, "eval")
        reward = float(context.job.instance.get("reward", 0.5))
        metrics: dict[str, Any] = {"turns": len(trajectory.turns)}
        if context.job.instance.get("tamper"):  # as a judge whose twin passed says it
            metrics["tamper"] = str(context.job.instance["tamper"])
        return RewardInfo(reward, metrics)

    async def cleanup(self, context: TaskContext) -> None:
        self._close(context.job.job_id)

    def _close(self, job_id: str) -> None:
        self.closed[job_id] += 1
        self.closed_event[job_id].set()


async def settle(condition: Callable[[], bool], max_yields: int = 10_000) -> None:
    """Let the event loop run until ``condition()`` holds (no clock involved)."""
    for _ in range(max_yields):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the pipeline never reached the expected condition")


async def finished(pipeline: Pipeline, job_id: str) -> dict[str, Any]:
    """The job's result once it has one, as the JSON the API sends."""
    view = await pipeline.wait(job_id, WAIT_S)
    assert view is not None and view.state.finished, f"{job_id} did not finish: {view}"
    assert view.result is not None
    return view.result.model_dump(mode="json")


__all__ = ["JobState", "ProbeTask", "Stage", "finished", "probe_instance", "settle"]
