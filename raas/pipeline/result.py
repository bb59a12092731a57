"""The finished result of a job, in the wire shape (validated by raas.api.schemas.RolloutResult)."""

from __future__ import annotations

import time
from typing import Any

from raas.agent.trajectory import Trajectory
from raas.pipeline.job import Ending, Job, Timing
from raas.pipeline.states import JobState, Stage


def timing_dict(timing: Timing) -> dict[str, float]:
    return {
        "queue_s": timing.queue_s,
        **{f"{stage}_s": timing.stage_s[stage] for stage in Stage},
        "total_s": timing.total_s,
    }


def build_result(job: Job, state: JobState) -> dict[str, Any]:
    ending = job.ending
    metrics = dict(job.reward.metrics) if job.reward is not None else {}
    if job.cleanup_error is not None:
        metrics["cleanup_error"] = job.cleanup_error
    return {
        "job_id": job.id,
        "state": state.value,
        "stage_failed": ending.stage.value if ending and ending.stage else None,
        "error": {"type": ending.error_type, "message": ending.message} if ending else None,
        "reward": job.reward.reward if job.reward is not None else None,
        "metrics": metrics,
        "trajectory": job.partial_trajectory().to_dict(),
        "timing": timing_dict(job.timing),
        "instance_id": job.instance_id,
        "data_source": job.data_source,
    }


def restart_result(
    job_id: str, last_state: str, instance: dict[str, Any], created_at: float
) -> dict[str, Any]:
    """The result of a job that was in flight when the service died."""
    stage = last_state if last_state in {s.value for s in Stage} else None
    ending = Ending(
        JobState.FAILED,
        Stage(stage) if stage else None,
        "server_restart",
        f"the service stopped while this job was {last_state}; it was not finished",
    )
    return {
        "job_id": job_id,
        "state": JobState.FAILED.value,
        "stage_failed": stage,
        "error": {"type": ending.error_type, "message": ending.message},
        "reward": None,
        "metrics": {},
        "trajectory": Trajectory().to_dict(),
        "timing": {
            "queue_s": 0.0,
            "init_s": 0.0,
            "run_s": 0.0,
            "eval_s": 0.0,
            "total_s": time.time() - created_at,
        },
        "instance_id": None
        if instance.get("instance_id") is None
        else str(instance["instance_id"]),
        "data_source": str(instance.get("data_source", "")),
    }
