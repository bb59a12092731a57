"""Infra failures run a job again in a fresh set-up; policy failures and cancels never do."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from raas.llm.types import BackendError, NoBackendAvailable
from raas.pipeline import JobRequest, Pipeline, Stage
from raas.sandbox.client import SandboxError
from raas.tasks.protocol import InvalidInstance, PolicyError, error_kind
from tests.support.probe import WAIT_S, ProbeTask, finished, probe_instance, settle

STAGES = ["init", "run", "eval"]


async def submit(pipeline: Pipeline, instance: dict[str, Any], **kw: Any) -> str:
    (view,) = await pipeline.submit([JobRequest.of(instance=instance, **kw)])
    return view.job_id


@pytest.mark.parametrize("stage", STAGES)
async def test_an_infra_failure_runs_the_job_again_from_a_fresh_init(
    make_pipeline: Any, probe: ProbeTask, stage: str
) -> None:
    async with make_pipeline(max_attempts=2) as pipeline:
        job = await submit(pipeline, probe_instance(**{stage: "raise_once"}))
        result = await finished(pipeline, job)
    assert result["state"] == "done" and result["reward"] == 0.5
    assert result["attempts"] == 2
    assert result["attempt_errors"] == [
        {"type": "RuntimeError", "message": f"boom in {stage}", "kind": "infra", "stage": stage}
    ]
    # Each attempt had its own set-up, released once; the second began at INIT.
    assert probe.opened[job] == 2 and probe.closed[job] == 2
    assert probe.calls[job, "init"] == 2
    # The trajectory is the second attempt's alone.
    assert result["trajectory"]["response_ids"] == [1, 2, 3]


async def test_attempts_are_limited_and_each_is_recorded(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(max_attempts=3) as pipeline:
        job = await submit(pipeline, probe_instance(run="raise"))
        result = await finished(pipeline, job)
    assert result["state"] == "failed" and result["stage_failed"] == "run"
    assert result["error"]["kind"] == "infra"
    assert result["attempts"] == 3
    assert [e["stage"] for e in result["attempt_errors"]] == ["run", "run"]
    assert probe.opened[job] == 3 and probe.closed[job] == 3


@pytest.mark.parametrize("stage", STAGES)
async def test_a_policy_failure_is_never_run_again(
    make_pipeline: Any, probe: ProbeTask, stage: str
) -> None:
    async with make_pipeline(max_attempts=3) as pipeline:
        job = await submit(pipeline, probe_instance(**{stage: "policy"}))
        result = await finished(pipeline, job)
    assert result["state"] == "failed"
    assert result["error"] == {
        "type": "PolicyError",
        "message": f"the model broke {stage}",
        "kind": "policy",
        "stage": stage,
    }
    assert result["attempts"] == 1 and result["attempt_errors"] == []
    assert probe.opened[job] == 1


@pytest.mark.parametrize(
    ("stage", "kind", "attempts"), [("init", "infra", 2), ("run", "policy", 1)]
)
async def test_a_timeout_is_infra_before_the_model_acts_and_policy_after(
    make_pipeline: Any, probe: ProbeTask, stage: str, kind: str, attempts: int
) -> None:
    limits = {Stage(stage): 0.05}
    async with make_pipeline(max_attempts=2, stage_timeout_s=limits) as pipeline:
        job = await submit(pipeline, probe_instance(**{stage: "block"}))
        result = await finished(pipeline, job)
    assert result["state"] == "timeout"
    assert result["error"]["kind"] == kind
    assert result["attempts"] == attempts
    assert probe.opened[job] == probe.closed[job] == attempts


async def test_a_job_cancelled_between_attempts_is_not_run_again(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    # One INIT worker, held by a blocker: the retried job waits in the INIT queue.
    async with make_pipeline(max_attempts=2, init_workers=1) as pipeline:
        job = await submit(pipeline, probe_instance(run="fail_once"))
        await probe.wait_entered(job, "run")
        blocker = await submit(pipeline, probe_instance(init="block"))
        await probe.wait_entered(blocker, "init")
        probe.release(job, "run")  # its first attempt fails now
        waiting = pipeline.active(job)
        assert waiting is not None
        await settle(lambda: waiting.attempts == 2)  # its second attempt waits for INIT
        pipeline.cancel(job)
        result = await finished(pipeline, job)
        probe.release(blocker, "init")
        await finished(pipeline, blocker)
    assert result["state"] == "cancelled"
    assert result["attempts"] == 2 and result["attempt_errors"][0]["type"] == "RuntimeError"
    assert probe.calls[job, "init"] == 1  # the second attempt never started
    assert probe.opened[job] == probe.closed[job] == 1


async def test_a_draining_service_does_not_run_failed_jobs_again(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(max_attempts=2) as pipeline:
        job = await submit(pipeline, probe_instance(run="block", eval="raise_once"))
        await probe.wait_entered(job, "run")
        draining = asyncio.create_task(pipeline.drain(grace_s=WAIT_S))
        await settle(lambda: pipeline.stopping)
        probe.release(job, "run")  # then EVAL fails, as infra, while the service drains
        await draining
        result = await finished(pipeline, job)
    assert result["state"] == "failed" and result["error"]["kind"] == "infra"
    assert result["attempts"] == 1


OLD_SCHEMA = """
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY, state TEXT NOT NULL, data_source TEXT, instance_id TEXT,
    request TEXT NOT NULL, created_at REAL NOT NULL, seq INTEGER UNIQUE, finished_at REAL,
    reward REAL, result TEXT
);
"""


def old_database(tmp_path: Path, job_id: str, state: str) -> Path:
    """A database as raas wrote it before attempts were recorded, with one unfinished job."""
    db = tmp_path / "old.db"
    request = {"instance": probe_instance(), "sampling_params": {}, "timeout_s": None}
    with sqlite3.connect(db) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute(
            "INSERT INTO jobs (job_id, state, data_source, request, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (job_id, state, "probe", json.dumps(request), 0.0),
        )
    return db


async def test_a_database_from_before_attempts_runs_its_unfinished_jobs_again(
    make_pipeline: Any, probe: ProbeTask, tmp_path: Path
) -> None:
    db = old_database(tmp_path, "old", "run")
    async with make_pipeline(db=db, max_attempts=2) as pipeline:
        result = await finished(pipeline, "old")
    assert result["state"] == "done" and result["attempts"] == 2
    assert result["attempt_errors"][0]["type"] == "server_restart"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (SandboxError("the action server died"), "infra"),
        (NoBackendAvailable("every backend is down"), "infra"),
        (BackendError("http://x", "503", transient=True), "infra"),
        (OSError("no space left"), "infra"),
        (PolicyError("the model's answer broke the judge"), "policy"),
        (InvalidInstance(("instance", "answer"), "missing"), "policy"),
    ],
)
def test_error_kinds(exc: Exception, kind: str) -> None:
    assert error_kind(exc) == kind


async def test_a_job_still_queued_at_a_crash_loses_no_attempt(
    make_pipeline: Any, probe: ProbeTask, tmp_path: Path
) -> None:
    db = old_database(tmp_path, "waiting", "queued")
    async with make_pipeline(db=db, max_attempts=1) as pipeline:
        result = await finished(pipeline, "waiting")
    assert result["state"] == "done"
    assert (result["attempts"], result["attempt_errors"]) == (1, [])
