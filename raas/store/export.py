"""Writing finished trajectories out for offline use (JSONL or Parquet).

The table's columns are derived from the wire's ``RolloutResult``: scalar fields as they are,
token lists as lists, free-form parts (messages, turns, metrics) as JSON text in ``NAME_json``;
the required nested parts (trajectory, timing) are inlined, an optional one (error) is prefixed
with its name (``error_type``). A field added to the wire type becomes a column by itself. Two
columns are read out of the turn records: ``policy_version_min`` and ``policy_version_max``, the
oldest and newest policy version that generated the trajectory's tokens (null where the backend
said nothing of its weights), ``policy_version_span`` (max - min: how many weight updates landed
while it was generated, the staleness of its oldest token against its newest) and
``token_policy_versions`` (one a response token: the version that generated it, null on
inserted tokens; null as a whole where the turn records do not account for the tokens).

A row is an ``ExportedResult``: the result under the id its own tenant knows the job by
(``cd-7``, not the server's key ``alice~cd-7``) and the tenant named in ``tenant`` (null for the
admin's own jobs, so for every job of a server without tenants). A database is read as its
owner reads it (``export``, ``results``); a server streams the rows a caller may see
(``stream_jsonl``, for ``GET /v1/rollouts:export``) a page of the store at a time. Either takes
the dashboard's filter of its job list (raas.store.dashboard.JobFilter: state, data_source,
error type, reward bounds, a search), so an export is the list a person filtered.
"""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from raas.helpers.optional import without_none
from raas.store.dashboard import EVERY_JOB, JobFilter
from raas.store.records import JobRecord
from raas.store.sqlite import ResultStore, iter_finished
from raas.tenants import DEFAULT_TENANT, own_id
from raas.wire import ExportedResult, RolloutResult

FORMATS = ("jsonl", "parquet")
# Narrower Parquet types where the values allow it (a mask is 0/1; logprobs need no float64).
NARROW = {"loss_mask": "int8", "logprobs": "float32"}
# Rows held at once: a Parquet row group; the results a server reads from its store per page of
# a streamed export (a long trajectory's JSON is a few MB).
PARQUET_ROWS = 1000
STREAM_PAGE = 64

Kind = Literal["text", "float", "int", "bool", "ints", "floats", "json"]


@dataclass(frozen=True)
class Column:
    name: str
    path: tuple[str, ...]  # where its value lies in the result
    kind: Kind


SCALARS: dict[Any, Kind] = {str: "text", float: "float", int: "int", bool: "bool"}


def _kind(annotation: Any) -> Kind:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "text"
    if annotation in SCALARS:
        return SCALARS[annotation]
    if origin is list and args and args[0] in (int, float):
        return "ints" if args[0] is int else "floats"
    return "json"


def _columns(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[Column]:
    for name, info in model.model_fields.items():
        annotation, optional = without_none(info.annotation)
        path = (*prefix, name)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for sub in _columns(annotation, path):
                yield Column(f"{name}_{sub.name}" if optional else sub.name, sub.path, sub.kind)
            continue
        kind = _kind(annotation)
        yield Column(f"{name}_json" if kind == "json" else name, path, kind)


def _version_range(result: RolloutResult) -> tuple[int, int] | tuple[None, None]:
    return result.trajectory.policy_version_range() or (None, None)


# Columns computed from a result rather than read off one field: name -> (kind, value).
DERIVED: dict[str, tuple[Kind, Callable[[RolloutResult], Any]]] = {
    "policy_version_min": ("int", lambda r: _version_range(r)[0]),
    "policy_version_max": ("int", lambda r: _version_range(r)[1]),
    "policy_version_span": ("int", lambda r: r.trajectory.policy_version_span()),
    "token_policy_versions": ("ints", lambda r: r.trajectory.token_policy_versions()),
}


@cache
def columns() -> tuple[Column, ...]:
    derived = (Column(name, (), kind) for name, (kind, _) in DERIVED.items())
    return (*_columns(ExportedResult), *derived)


def _value(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)  # type: ignore[assignment]
    return data


def flat_row(result: RolloutResult) -> dict[str, Any]:
    """One table row: token fields as lists, nested free-form parts as JSON text."""
    data = result.model_dump(mode="json")
    row = {}
    for col in columns():
        if col.name in DERIVED:
            row[col.name] = DERIVED[col.name][1](result)
            continue
        value = _value(data, col.path)
        row[col.name] = json.dumps(value) if col.kind == "json" else value
    return row


def exported(record: JobRecord) -> ExportedResult | None:
    """The export's row of a finished job (None: it has no result): under its own tenant's id,
    that tenant named (null: the admin's own)."""
    if record.result is None:
        return None
    tenant = None if record.tenant == DEFAULT_TENANT else record.tenant
    # The result was validated as it was read: its fields are taken as they are.
    fields = {**dict(record.result), "job_id": own_id(record.job_id), "tenant": tenant}
    return ExportedResult.model_construct(**fields)


def results(db: Path, where: JobFilter = EVERY_JOB) -> Iterator[ExportedResult]:
    """The rows of every finished job in ``db`` that ``where`` takes (a tenant's, a state's,
    a search's...)."""
    for record in iter_finished(db, where):
        if (row := exported(record)) is not None:
            yield row


def line(row: RolloutResult) -> str:
    """A row as a line of JSONL (a RolloutResult reads it back: it ignores ``tenant``)."""
    return row.model_dump_json() + "\n"


async def stream_jsonl(store: ResultStore, where: JobFilter = EVERY_JOB) -> AsyncIterator[bytes]:
    """The rows of the jobs that had finished when it started and that ``where`` takes (a
    tenant's, and what the dashboard's list filters by) as JSON lines, a page at a time: each
    read on the store's thread and written on another, so neither the event loop waits nor is
    the whole export ever in memory."""
    until = store.last_seq  # a fixed end: results that finish meanwhile cannot prolong it
    since = 0
    while since < until:
        page = await store.finished(where, since, STREAM_PAGE)
        if page.next_since == since:
            return
        since = page.next_since
        rows = [
            row
            for record in page.records
            if record.seq is not None and record.seq <= until
            if (row := exported(record)) is not None
        ]
        if rows:
            yield (await asyncio.to_thread(_lines, rows)).encode()


def _lines(rows: list[ExportedResult]) -> str:
    return "".join(map(line, rows))


def write_jsonl(rows: Iterable[RolloutResult], out: Path) -> int:
    n = 0
    with open(out, "w") as f:
        for row in rows:
            f.write(line(row))
            n += 1
    return n


def write_parquet(rows: Iterable[RolloutResult], out: Path) -> int:
    """``rows`` as a Parquet file, PARQUET_ROWS at a time (a row group each)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise RuntimeError("Parquet export needs pyarrow: pip install 'raas[parquet]'") from e
    schema = parquet_schema(pa)
    n = 0
    batch: list[dict[str, Any]] = []
    with pq.ParquetWriter(out, schema) as writer:
        for row in rows:
            batch.append(flat_row(row))
            if len(batch) == PARQUET_ROWS:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                n, batch = n + len(batch), []
        if batch or n == 0:  # an empty export is a file of the columns and no rows
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        n += len(batch)
    return n


def parquet_schema(pa: Any) -> Any:
    scalar = {
        "text": pa.string(),
        "json": pa.string(),
        "float": pa.float64(),
        "int": pa.int64(),
        "bool": pa.bool_(),
    }
    fields = []
    for col in columns():
        if col.kind in ("ints", "floats"):
            default = "int64" if col.kind == "ints" else "float64"
            fields.append((col.name, pa.list_(getattr(pa, NARROW.get(col.name, default))())))
        else:
            fields.append((col.name, scalar[col.kind]))
    return pa.schema(fields)


WRITERS: dict[str, Callable[[Iterable[RolloutResult], Path], int]] = {
    "jsonl": write_jsonl,
    "parquet": write_parquet,
}


def export(db: Path, fmt: str, out: Path, where: JobFilter = EVERY_JOB) -> int:
    """Write every finished result that ``where`` takes (of one state, one tenant, matching a
    search...); returns how many."""
    if fmt not in WRITERS:
        raise ValueError(f"unknown format {fmt!r} (choose {', '.join(FORMATS)})")
    return WRITERS[fmt](results(db, where), out)
