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
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from raas.helpers import without_none
from raas.store.sqlite import iter_finished
from raas.wire import RolloutResult

FORMATS = ("jsonl", "parquet")
# Narrower Parquet types where the values allow it (a mask is 0/1; logprobs need no float64).
NARROW = {"loss_mask": "int8", "logprobs": "float32"}

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


def _version_span(result: RolloutResult) -> int | None:
    span = result.trajectory.policy_version_range()
    return None if span is None else span[1] - span[0]


# Columns computed from a result rather than read off one field: name -> (kind, value).
DERIVED: dict[str, tuple[Kind, Callable[[RolloutResult], Any]]] = {
    "policy_version_min": ("int", lambda r: _version_range(r)[0]),
    "policy_version_max": ("int", lambda r: _version_range(r)[1]),
    "policy_version_span": ("int", _version_span),
    "token_policy_versions": ("ints", lambda r: r.trajectory.token_policy_versions()),
}


@cache
def columns() -> tuple[Column, ...]:
    derived = (Column(name, (), kind) for name, (kind, _) in DERIVED.items())
    return (*_columns(RolloutResult), *derived)


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


def results(db: Path, state: str | None = None) -> Iterator[RolloutResult]:
    for record in iter_finished(db, state):
        if record.result is not None:
            yield record.result


def write_jsonl(rows: Iterable[RolloutResult], out: Path) -> int:
    n = 0
    with open(out, "w") as f:
        for row in rows:
            f.write(row.model_dump_json() + "\n")
            n += 1
    return n


def write_parquet(rows: Iterable[RolloutResult], out: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise RuntimeError("Parquet export needs pyarrow: pip install 'raas[parquet]'") from e
    table = pa.Table.from_pylist([flat_row(r) for r in rows], schema=parquet_schema(pa))
    pq.write_table(table, out)
    return int(table.num_rows)


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


def export(db: Path, fmt: str, out: Path, state: str | None = None) -> int:
    """Write every finished result (optionally of one state); returns how many."""
    if fmt not in WRITERS:
        raise ValueError(f"unknown format {fmt!r} (choose {', '.join(FORMATS)})")
    return WRITERS[fmt](results(db, state), out)
