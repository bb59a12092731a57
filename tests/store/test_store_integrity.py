"""The store writes only rows it can read back, and serves the rest around a row it cannot read
(issue 33). Before, one NaN logprob made a row that failed its job's lookup, every page of
``GET /v1/rollouts`` holding it and ``raas export``, also after a restart."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from raas.pipeline import JobRequest
from raas.store.export import export
from raas.store.records import UNSTORABLE, JobRecord
from raas.store.sqlite import ResultStore
from raas.wire import RolloutResult, Timing, Trajectory
from tests.support.probe import finished, probe_instance

TIMING = Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=1)


def result(job_id: str, **fields: Any) -> RolloutResult:
    trajectory = Trajectory(response_ids=[1, 2], loss_mask=[1, 1], logprobs=[-0.1, -0.2])
    return RolloutResult(
        **{
            "job_id": job_id,
            "state": "done",
            "reward": 1.0,
            "trajectory": trajectory,
            "timing": TIMING,
            "data_source": "probe",
            **fields,
        }
    )


@pytest.mark.parametrize(
    ("poison", "where"),
    [
        (
            {"trajectory": Trajectory(response_ids=[1, 2], logprobs=[-0.1, float("nan")])},
            "trajectory.logprobs.1",
        ),
        ({"reward": float("inf")}, "reward is inf, which would read back as None"),
        ({"timing": TIMING.model_copy(update={"run_s": float("nan")})}, "timing.run_s is nan"),
    ],
)
async def test_a_result_that_would_not_read_back_is_stored_as_a_failed_infra_result(
    tmp_path: Path, poison: dict[str, Any], where: str
) -> None:
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    await store.add_jobs([JobRecord("j", "eval", "probe", "i-1", {}, 0.0)])
    stored = await store.save_result("j", result("j", instance_id="i-1", **poison))
    record = await store.get("j")
    page = await store.finished()
    await store.close()
    assert record is not None and record.result == stored
    assert (stored.state, stored.reward, stored.trajectory) == ("failed", None, Trajectory())
    assert stored.error is not None and (stored.error.type, stored.error.kind) == (
        UNSTORABLE,
        "infra",
    )
    assert "the job ended done" in stored.error.message and where in stored.error.message
    assert stored.instance_id == "i-1" and stored.data_source == "probe"  # what could be kept
    assert [r.result for r in page.records] == [stored]


async def test_a_nan_in_free_form_metrics_is_written_as_null(tmp_path: Path) -> None:
    # What JSON does with a number it has not (pydantic's default): the row reads back.
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    await store.add_jobs([JobRecord("j", "eval", "probe", None, {}, 0.0)])
    stored = await store.save_result("j", result("j", metrics={"score": float("nan")}))
    record = await store.get("j")
    await store.close()
    assert stored.state == "done" and record is not None and record.result is not None
    assert record.result.metrics == {"score": None}


async def test_a_job_whose_reward_is_not_a_number_ends_failed_never_done(
    make_pipeline: Any,
) -> None:
    async with make_pipeline() as pipeline:
        (nan,) = await pipeline.submit([JobRequest.of(probe_instance() | {"reward": "nan"})])
        (inf,) = await pipeline.submit([JobRequest.of(probe_instance() | {"reward": "inf"})])
        results = [await finished(pipeline, view.job_id) for view in (nan, inf)]
        page = await pipeline.store.finished()
    for got in results:
        assert (got["state"], got["error"]["type"], got["error"]["kind"]) == (
            "failed",
            UNSTORABLE,
            "infra",
        )
    assert [r.job_id for r in page.records] == [nan.job_id, inf.job_id]


def corrupt(db: Path, job_id: str, result_json: str) -> None:
    """Write a job's result column as a raas before issue 33 could (or a hand) did."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE jobs SET result = ? WHERE job_id = ?", (result_json, job_id))
    conn.close()


async def write_jobs(db: Path, job_ids: list[str]) -> None:
    store = ResultStore(db)
    await store.open()
    await store.add_jobs([JobRecord(j, "queued", "probe", None, {}, 0.0) for j in job_ids])
    for job_id in job_ids:
        await store.save_result(job_id, result(job_id))
    await store.close()


BAD_ROWS = {
    # What main wrote for a NaN logprob: JSON, but not a result.
    "nan-logprob": result("nan-logprob").model_dump_json().replace("-0.2]", "null]"),
    "not-json": "{this is not JSON",
}


async def test_an_unreadable_row_is_quarantined_and_its_neighbours_are_served(
    tmp_path: Path, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "api.db"
    order = ["a", "nan-logprob", "b", "not-json", "c"]
    await write_jobs(db, order)
    for job_id, text in BAD_ROWS.items():
        corrupt(db, job_id, text)

    caplog.set_level(logging.ERROR, logger="raas.store.records")
    async with client() as http:
        seen: list[str] = []
        since = 0
        for _ in order:  # pages of one row: a bad one is a page with no result, not an error
            r = await http.get("/v1/rollouts", params={"since": since, "limit": 1})
            assert r.status_code == 200, r.text
            seen += [res["job_id"] for res in r.json()["results"]]
            since = r.json()["next_since"]
        assert seen == ["a", "b", "c"]
        whole = (await http.get("/v1/rollouts")).json()
        assert [res["job_id"] for res in whole["results"]] == ["a", "b", "c"]
        assert whole["next_since"] == 5

        own = (await http.get("/v1/rollouts/not-json")).json()
        assert own["state"] == "failed" and own["result"]["error"]["type"] == "unreadable_result"
        metrics = (await http.get("/metrics")).text
        assert "raas_store_unreadable_rows 2.0" in metrics
        listed = (await http.get("/v1/dashboard/jobs")).json()["jobs"]
        assert sorted(job["job_id"] for job in listed) == sorted(order)

    # Said once per row, however often it was skipped.
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 2 and all("quarantined" in line for line in said)
    assert export(db, "jsonl", tmp_path / "out.jsonl") == 3
