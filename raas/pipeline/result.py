"""The finished result of a job, as the wire's RolloutResult."""

from __future__ import annotations

import time
from typing import Any

from raas.pipeline.job import Ending, Job
from raas.pipeline.states import JobState, Stage
from raas.tasks.protocol import RewardInfo
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
) -> RolloutResult:
    """The one place a result is put together."""
    metrics = dict(reward.metrics) if reward is not None else {}
    if cleanup_error is not None:
        metrics["cleanup_error"] = cleanup_error
    instance_id = instance.get("instance_id")
    return RolloutResult(
        job_id=job_id,
        state=state.value,
        stage_failed=ending.stage.value if ending and ending.stage else None,
        error=ErrorInfo(type=ending.error_type, message=ending.message) if ending else None,
        reward=reward.reward if reward is not None else None,
        metrics=metrics,
        trajectory=trajectory or Trajectory(),
        timing=timing,
        instance_id=None if instance_id is None else str(instance_id),
        data_source=str(instance.get("data_source", "")),
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
        job.request.instance,
        job.ending,
        timing,
        job.reward,
        job.partial_trajectory(),
        job.cleanup_error,
    )


def restart_result(
    job_id: str, last_state: str, instance: dict[str, Any], created_at: float
) -> RolloutResult:
    """The result of a job that was in flight when the service died."""
    stage = Stage(last_state) if last_state in {s.value for s in Stage} else None
    ending = Ending(
        JobState.FAILED,
        stage,
        "server_restart",
        f"the service stopped while this job was {last_state}; it was not finished",
    )
    timing = Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=time.time() - created_at)
    return result_of(job_id, JobState.FAILED, instance, ending, timing)
