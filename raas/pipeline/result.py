"""The finished result of a job, as the wire's RolloutResult."""

from __future__ import annotations

import time
from typing import Any

from raas.pipeline.job import Ending, Job
from raas.pipeline.states import JobState, Stage
from raas.tasks.protocol import RewardInfo, TaskContext
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory


def result_of(
    job_id: str,
    state: JobState,
    instance: dict[str, Any],
    ending: Ending | None,
    timing: Timing,
    reward: RewardInfo | None = None,
    trajectory: Trajectory | None = None,
    cleanup_error: str | None = None,
    attempt_errors: list[ErrorInfo] | None = None,
    task: str | None = None,
    trajectory_error: str | None = None,
    context: TaskContext | None = None,
) -> RolloutResult:
    """The one place a result is put together."""
    metrics = dict(reward.metrics) if reward is not None else {}
    if ending is not None:
        metrics = {**ending.metrics, **metrics}
    if cleanup_error is not None:
        metrics["cleanup_error"] = cleanup_error
    if trajectory_error is not None:
        metrics["trajectory_error"] = trajectory_error
    if context is not None and context.checkpoints is not None:
        metrics["checkpoints"] = context.checkpoints
    if trajectory is not None and trajectory.turns:
        metrics["malformed_tool_calls"] = trajectory.malformed_tool_calls()
    if trajectory is not None and not trajectory.finite_logprobs():
        # JSON holds no NaN or infinity (they are written null): the stored result could not be
        # read back. The rest is kept; the error or trajectory_error says why these are gone.
        trajectory = trajectory.model_copy(update={"logprobs": []})
    instance_id = instance.get("instance_id")
    return RolloutResult(
        job_id=job_id,
        state=state.value,
        stage_failed=ending.stage.value if ending and ending.stage else None,
        error=ending.error if ending else None,
        reward=reward.reward if reward is not None else None,
        metrics=metrics,
        trajectory=trajectory or Trajectory(),
        timing=timing,
        instance_id=None if instance_id is None else str(instance_id),
        data_source=str(instance.get("data_source", "")),
        task=task,
        attempts=len(attempt_errors or ()) + 1,
        attempt_errors=attempt_errors or [],
        resume=context.resume if context is not None else None,
    )


def build_result(job: Job, state: JobState) -> RolloutResult:
    t = job.timing
    timing = Timing(
        queue_s=t.queue_s,
        init_s=t.stage_s[Stage.INIT],
        run_s=t.stage_s[Stage.RUN],
        eval_s=t.stage_s[Stage.EVAL],
        total_s=t.total_s,
    )
    return result_of(
        job.id,
        state,
        job.request.rollout.instance,
        job.ending,
        timing,
        job.reward,
        job.partial_trajectory(),
        job.cleanup_error,
        job.attempt_errors,
        job.task,
        job.trajectory_error,
        job.context,
    )


def restart_ending(last_state: str) -> Ending:
    """Why a job that was in flight when the service died did not finish (that time)."""
    stage = Stage(last_state) if last_state in {s.value for s in Stage} else None
    return Ending(
        JobState.FAILED,
        stage,
        "server_restart",
        f"the service stopped while this job was {last_state}; it was not finished",
    )


def unfinished_result(
    job_id: str,
    ending: Ending,
    instance: dict[str, Any],
    created_at: float,
    attempt_errors: list[ErrorInfo],
    task: str | None = None,
) -> RolloutResult:
    """The result of a job from before a restart that is not run again."""
    timing = Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=time.time() - created_at)
    return result_of(
        job_id, ending.state, instance, ending, timing, attempt_errors=attempt_errors, task=task
    )
