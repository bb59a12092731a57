"""The finished result of a job, in the wire shape (validated by raas.api.schemas.RolloutResult)."""

from __future__ import annotations

import time
from typing import Any

from raas.agent.trajectory import Trajectory
from raas.pipeline.job import Ending, Job, Timing
from raas.pipeline.states import JobState, Stage
from raas.tasks.protocol import RewardInfo


def timing_dict(timing: Timing) -> dict[str, float]:
    return {
        "queue_s": timing.queue_s,
        **{f"{stage}_s": timing.stage_s[stage] for stage in Stage},
        "total_s": timing.total_s,
    }


def result_dict(
    job_id: str,
    state: JobState,
    instance: dict[str, Any],
    ending: Ending | None,
    timing: dict[str, float],
    reward: RewardInfo | None = None,
    trajectory: Trajectory | None = None,
    cleanup_error: str | None = None,
) -> dict[str, Any]:
    """The one place the wire shape of a result is written."""
    metrics = dict(reward.metrics) if reward is not None else {}
    if cleanup_error is not None:
        metrics["cleanup_error"] = cleanup_error
    instance_id = instance.get("instance_id")
    return {
        "job_id": job_id,
        "state": state.value,
        "stage_failed": ending.stage.value if ending and ending.stage else None,
        "error": {"type": ending.error_type, "message": ending.message} if ending else None,
        "reward": reward.reward if reward is not None else None,
        "metrics": metrics,
        "trajectory": (trajectory or Trajectory()).to_dict(),
        "timing": timing,
        "instance_id": None if instance_id is None else str(instance_id),
        "data_source": str(instance.get("data_source", "")),
    }


def build_result(job: Job, state: JobState) -> dict[str, Any]:
    return result_dict(
        job.id,
        state,
        job.request.instance,
        job.ending,
        timing_dict(job.timing),
        job.reward,
        job.partial_trajectory(),
        job.cleanup_error,
    )


def restart_result(
    job_id: str, last_state: str, instance: dict[str, Any], created_at: float
) -> dict[str, Any]:
    """The result of a job that was in flight when the service died."""
    stage = Stage(last_state) if last_state in {s.value for s in Stage} else None
    ending = Ending(
        JobState.FAILED,
        stage,
        "server_restart",
        f"the service stopped while this job was {last_state}; it was not finished",
    )
    timing = {f"{s}_s": 0.0 for s in ("queue", *Stage)} | {"total_s": time.time() - created_at}
    return result_dict(job_id, JobState.FAILED, instance, ending, timing)
