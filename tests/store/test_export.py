"""Export columns come from the wire's RolloutResult: the table a trainer reads offline."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raas.store import export
from raas.store.dashboard import JobFilter
from raas.store.export import columns, flat_row, parquet_schema, stream_jsonl, write_parquet
from raas.store.records import JobRecord
from raas.store.sqlite import ResultStore
from raas.tenants import tenant_of
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory

# The columns exports have always had; a new wire field adds one, none may vanish.
COLUMNS = {
    "job_id",
    "state",
    "data_source",
    "instance_id",
    "reward",
    "stage_failed",
    "error_type",
    "error_message",
    "prompt_ids",
    "response_ids",
    "loss_mask",
    "logprobs",
    "stop_reason",
    "messages_json",
    "turns_json",
    "metrics_json",
    "queue_s",
    "init_s",
    "run_s",
    "eval_s",
    "total_s",
    "error_kind",
    "error_stage",
    "attempts",
    "attempt_errors_json",
    "task",
    "policy_version_min",
    "policy_version_max",
    "policy_version_span",
    "token_policy_versions",
    "tenant",  # whose job (null: the admin's own, every job of a server without tenants)
    # A job resumed after a restart: the turn it went on from, what was lost, or why not.
    "resume_resumed_at_turn",
    "resume_lost_json",
    "resume_refused",
}


def result() -> RolloutResult:
    return RolloutResult(
        job_id="j",
        state="failed",
        stage_failed="run",
        error=ErrorInfo(type="timeout", message="too slow"),
        reward=None,
        metrics={"artifact": {"answer": "4"}},
        trajectory=Trajectory(
            prompt_ids=[1, 2],
            response_ids=[3, 4],
            loss_mask=[1, 0],
            logprobs=[-0.5, 0.0],
            messages=[{"role": "user", "content": "hi"}],
            turns=[{"policy_version": 5}, {"policy_versions": [6, 6, 7]}, {"policy_version": None}],
            stop_reason="max_turns",
        ),
        timing=Timing(queue_s=0.1, init_s=0.2, run_s=0.3, eval_s=0.0, total_s=0.6),
        instance_id="i",
        data_source="openai/gsm8k",
        task="math",
    )


def test_columns_are_the_wire_fields_flattened() -> None:
    assert {c.name for c in columns()} == COLUMNS
    row = flat_row(result())
    assert set(row) == COLUMNS
    assert (row["error_type"], row["error_message"], row["stage_failed"]) == (
        "timeout",
        "too slow",
        "run",
    )
    assert (row["response_ids"], row["loss_mask"], row["run_s"]) == ([3, 4], [1, 0], 0.3)
    assert json.loads(row["metrics_json"]) == {"artifact": {"answer": "4"}}
    assert (row["data_source"], row["task"]) == ("openai/gsm8k", "math")
    assert json.loads(row["messages_json"]) == [{"role": "user", "content": "hi"}]
    # The oldest and newest policy that generated the tokens, from the turn records.
    assert (row["policy_version_min"], row["policy_version_max"]) == (5, 7)
    assert row["policy_version_span"] == 2
    assert row["token_policy_versions"] is None  # the turns say no output_tokens to align by
    unknown = result()
    unknown.trajectory.turns = [{"policy_version": None}]
    assert flat_row(unknown)["policy_version_min"] is None
    assert flat_row(unknown)["policy_version_span"] is None
    aligned = result()
    aligned.trajectory.turns = [{"output_tokens": 1, "policy_version": 5}]
    assert flat_row(aligned)["token_policy_versions"] == [5, None]  # the second is inserted
    # A gateway job's trajectory (its first segment) holds the later segments' records too.
    aligned.trajectory.turns = [
        {"segment": 0, "output_tokens": 1, "policy_version": 5},
        {"segment": 1, "output_tokens": 3, "policy_version": 6},
    ]
    assert flat_row(aligned)["token_policy_versions"] == [5, None]


def test_a_row_fits_the_parquet_schema() -> None:
    table = pa.Table.from_pylist([flat_row(result())], schema=parquet_schema(pa))
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.column("error_type").to_pylist() == ["timeout"]
    assert table.column("policy_version_max").to_pylist() == [7]
    aligned = result()
    aligned.trajectory.turns = [{"output_tokens": 1, "policy_version": 5}]
    table = pa.Table.from_pylist([flat_row(aligned)], schema=parquet_schema(pa))
    assert table.column("token_policy_versions").to_pylist() == [[5, None]]


async def finish(store: ResultStore, *keys: str) -> None:
    """Record and finish the jobs of ``keys`` (``alice~cd-7``: Alice's cd-7), in that order."""
    await store.add_jobs(
        [JobRecord(k, "queued", "openai/gsm8k", "i", {}, 0.0, tenant=tenant_of(k)) for k in keys]
    )
    for key in keys:
        await store.save_result(key, result().model_copy(update={"job_id": key}))


async def test_a_streamed_export_pages_through_one_tenants_jobs_and_ends_where_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "STREAM_PAGE", 1)  # a page a row: every row another store call
    store = ResultStore(tmp_path / "s.db")
    await store.open()
    try:
        await finish(store, "alice~cd-7", "bob~cd-7", "cd-7", "alice~cd-8")
        alices = stream_jsonl(store, JobFilter(tenant="alice"))
        chunks = [await anext(alices)]
        await finish(store, "alice~late")  # finished after the export began: not in it
        chunks += [chunk async for chunk in alices]
        rows = [json.loads(line) for chunk in chunks for line in chunk.decode().splitlines()]
        assert [(r["tenant"], r["job_id"]) for r in rows] == [("alice", "cd-7"), ("alice", "cd-8")]
        assert RolloutResult.model_validate(rows[0]).trajectory.response_ids == [3, 4]
        admins = b"".join([chunk async for chunk in stream_jsonl(store)]).decode()
        assert [(r["tenant"], r["job_id"]) for r in map(json.loads, admins.splitlines())] == [
            ("alice", "cd-7"),
            ("bob", "cd-7"),
            (None, "cd-7"),  # the admin's own
            ("alice", "cd-8"),
            ("alice", "late"),
        ]
    finally:
        await store.close()


def test_parquet_is_written_a_row_group_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "PARQUET_ROWS", 2)
    out = tmp_path / "r.parquet"
    rows = [result().model_copy(update={"job_id": f"j{i}"}) for i in range(5)]
    assert write_parquet(iter(rows), out) == 5
    assert pq.ParquetFile(out).metadata.num_row_groups == 3
    assert pq.read_table(out).column("job_id").to_pylist() == [f"j{i}" for i in range(5)]
    assert write_parquet(iter([]), out) == 0
    assert pq.read_table(out).schema == parquet_schema(pa)
