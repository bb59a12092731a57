"""Writing finished trajectories out for offline use (JSONL or Parquet)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from raas.store.sqlite import iter_finished

FORMATS = ("jsonl", "parquet")


def results(db: Path, state: str | None = None) -> Iterator[dict[str, Any]]:
    for record in iter_finished(db, state):
        if record.result is not None:
            yield record.result


def flat_row(result: dict[str, Any]) -> dict[str, Any]:
    """One table row: token fields as lists, nested free-form parts as JSON text."""
    traj = result.get("trajectory") or {}
    error = result.get("error") or {}
    timing = result.get("timing") or {}
    return {
        "job_id": result["job_id"],
        "state": result["state"],
        "data_source": result.get("data_source"),
        "instance_id": result.get("instance_id"),
        "reward": result.get("reward"),
        "stage_failed": result.get("stage_failed"),
        "error_type": error.get("type"),
        "error_message": error.get("message"),
        "prompt_ids": traj.get("prompt_ids", []),
        "response_ids": traj.get("response_ids", []),
        "loss_mask": traj.get("loss_mask", []),
        "logprobs": traj.get("logprobs", []),
        "stop_reason": traj.get("stop_reason"),
        "messages_json": json.dumps(traj.get("messages", [])),
        "turns_json": json.dumps(traj.get("turns", [])),
        "metrics_json": json.dumps(result.get("metrics", {})),
        **{
            k: float(timing.get(k, 0.0))
            for k in ("queue_s", "init_s", "run_s", "eval_s", "total_s")
        },
    }


def write_jsonl(rows: Iterable[dict[str, Any]], out: Path) -> int:
    n = 0
    with open(out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def write_parquet(rows: Iterable[dict[str, Any]], out: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise RuntimeError("Parquet export needs pyarrow: pip install 'raas[parquet]'") from e
    table = pa.Table.from_pylist([flat_row(r) for r in rows], schema=_parquet_schema(pa))
    pq.write_table(table, out)
    return int(table.num_rows)


def _parquet_schema(pa: Any) -> Any:
    text, num = pa.string(), pa.float64()
    return pa.schema(
        [
            ("job_id", text), ("state", text), ("data_source", text), ("instance_id", text),
            ("reward", num), ("stage_failed", text), ("error_type", text),
            ("error_message", text), ("prompt_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float32())), ("stop_reason", text),
            ("messages_json", text), ("turns_json", text), ("metrics_json", text),
            ("queue_s", num), ("init_s", num), ("run_s", num), ("eval_s", num), ("total_s", num),
        ]
    )  # fmt: skip


WRITERS: dict[str, Callable[[Iterable[dict[str, Any]], Path], int]] = {
    "jsonl": write_jsonl,
    "parquet": write_parquet,
}


def export(db: Path, fmt: str, out: Path, state: str | None = None) -> int:
    """Write every finished result (optionally of one state); returns how many."""
    if fmt not in WRITERS:
        raise ValueError(f"unknown format {fmt!r} (choose {', '.join(FORMATS)})")
    return WRITERS[fmt](results(db, state), out)
