"""Rows of the jobs table as records, and the rule that no row is written that cannot be read.

A result is stored as its JSON. A result that does not read back from that JSON (a NaN, which
JSON writes as null, in a list of floats) once made its job, every page of results holding it and
every export fail, after a restart too. So a result is read back before it is written
(``storable``), and one that does not read back as it was is stored as a failed result of kind
infra that says why. A row that cannot be read all the same (written by an older raas, or by
hand) is quarantined (``Quarantine``): skipped wherever results are listed, said once in the log,
counted; its own job reads as failed, saying so.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from raas.tenants import DEFAULT_TENANT, tenant_of
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory

log = logging.getLogger(__name__)

# The error types of the failed results that stand in for one that could not be stored or read.
UNSTORABLE = "unstorable_result"
UNREADABLE = "unreadable_result"
MESSAGE_CHARS = 300  # of an error message quoted in another
NO_TIMING = Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0)

COLUMNS = (
    "job_id, state, data_source, instance_id, request, created_at, seq, result,"
    " attempts, attempt_errors, tenant"
)
ERRORS = TypeAdapter(list[ErrorInfo])


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    state: str
    data_source: str
    instance_id: str | None
    request: dict[str, Any]
    created_at: float
    seq: int | None = None
    result: RolloutResult | None = None
    attempts: int = 1
    attempt_errors: list[ErrorInfo] = field(default_factory=list)
    tenant: str = DEFAULT_TENANT  # whose job it is (raas.tenants); job_id is its key


Row = sqlite3.Row | tuple[Any, ...]


def record(row: Row) -> JobRecord:
    """The record of a row of COLUMNS; a ValueError or TypeError when it cannot be read."""
    job_id, state, data_source, instance_id, request, created_at, seq, result, n, errors = row[:10]
    return JobRecord(
        job_id=job_id,
        state=state,
        data_source=data_source or "",
        instance_id=instance_id,
        request=json.loads(request),
        created_at=created_at,
        seq=seq,
        result=RolloutResult.model_validate_json(result) if result else None,
        attempts=n,
        attempt_errors=ERRORS.validate_json(errors) if errors else [],
        tenant=str(row[10]),
    )


# -- writing: only what reads back -------------------------------------------------------------


def storable(result: RolloutResult) -> tuple[RolloutResult, str]:
    """``result`` and its JSON where that reads back as the same result; else a failed result
    (kind infra) that says what would not have, and its JSON."""
    payload, problem = _round_trip(result)
    if problem is None:
        return result, payload
    log.error(
        "job %s: its result cannot be stored as it is (%s); stored as failed",
        result.job_id,
        problem,
    )
    for stand_in in _stand_ins(result, problem):
        payload, still = _round_trip(stand_in)
        if still is None:
            return stand_in, payload
    raise AssertionError(f"job {result.job_id}: not even a failed result can be stored")


def _round_trip(result: RolloutResult) -> tuple[str, str | None]:
    """The result's JSON, and what of it does not read back (None: all of it does)."""
    try:
        payload = result.model_dump_json()
        back = RolloutResult.model_validate_json(payload)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        written = _at(result.model_dump(mode="json"), first["loc"])
        return "", f"{where} is {_short(written)}, which would not read back ({first['msg']})"
    except ValueError as e:  # PydanticSerializationError: a value JSON cannot hold at all
        return "", str(e)[:MESSAGE_CHARS]
    # As JSON-ready values, so that a tuple read back as a list is no difference, and a NaN
    # (never equal to itself, written as null) is one.
    return payload, _difference(result.model_dump(mode="json"), back.model_dump(mode="json"))


def _difference(written: Any, read: Any, path: tuple[str, ...] = ()) -> str | None:
    """Where ``read`` differs from ``written`` first, and how, or None."""
    if written == read:  # the usual answer, compared in C; the walk below only locates
        return None
    if isinstance(written, dict) and isinstance(read, dict) and written.keys() == read.keys():
        for key in written:
            found = _difference(written[key], read[key], (*path, str(key)))
            if found is not None:
                return found
        return None
    if isinstance(written, list) and isinstance(read, list) and len(written) == len(read):
        for i, (w, r) in enumerate(zip(written, read, strict=True)):
            found = _difference(w, r, (*path, str(i)))
            if found is not None:
                return found
        return None
    where = ".".join(path) or "the result"
    return f"{where} is {_short(written)}, which would read back as {_short(read)}"


def _at(data: Any, loc: tuple[int | str, ...]) -> Any:
    for key in loc:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _stand_ins(result: RolloutResult, problem: str) -> list[RolloutResult]:
    """Failed results for one that cannot be stored: as much of it as is plain, then less."""
    ended = f"{result.state}"
    if result.error is not None:
        ended += f" ({result.error.type}: {result.error.message[:MESSAGE_CHARS]})"
    error = ErrorInfo(
        type=UNSTORABLE,
        message=f"the job ended {ended}, but its result cannot be stored as it is: {problem}",
        kind="infra",
    )
    cleared: dict[str, Any] = {
        "state": "failed",
        "stage_failed": None,
        "error": error,
        "reward": None,
        "metrics": {},
        "trajectory": Trajectory(),
    }
    kept = result.model_copy(update=cleared)
    bare = RolloutResult(
        job_id=result.job_id,
        state="failed",
        error=error,
        trajectory=Trajectory(),
        timing=NO_TIMING,
        data_source="",
    )
    return [kept, kept.model_copy(update={"timing": NO_TIMING}), bare]


# -- reading: what cannot be read is quarantined ------------------------------------------------


class Quarantine:
    """The rows of one database found unreadable: each said once in the log, all counted."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.job_ids: set[str] = set()

    def read(self, row: Row) -> JobRecord | None:
        """The row's record, or None (logged and counted) when it cannot be read."""
        try:
            return record(row)
        except (ValueError, TypeError) as e:  # JSON, validation, a column of the wrong type
            self._found(str(row[0]), e)
            return None

    def read_or_stand_in(self, row: Row) -> JobRecord:
        """The row's record; for one that cannot be read, a failed record saying so (its own
        job's answer, where listing skips it)."""
        found = self.read(row)
        return found if found is not None else _unreadable(row)

    def _found(self, job_id: str, error: Exception) -> None:
        if job_id in self.job_ids:
            return
        self.job_ids.add(job_id)
        reason = str(error).splitlines()[0][:MESSAGE_CHARS]
        log.error(
            "%s: the row of job %s cannot be read (%s: %s); quarantined: it is left as it is and"
            " skipped wherever results are listed or exported",
            self.path,
            job_id,
            type(error).__name__,
            reason,
        )


def _unreadable(row: Row) -> JobRecord:
    """A failed record for a row that cannot be read, from the columns that can."""
    job_id, state, data_source, instance_id, request, created_at, seq = row[:7]
    source = data_source if isinstance(data_source, str) else ""
    result = None
    if seq is not None:
        result = RolloutResult(
            job_id=str(job_id),
            state="failed",
            error=ErrorInfo(
                type=UNREADABLE,
                message="the stored result of this job cannot be read (quarantined)",
                kind="infra",
            ),
            trajectory=Trajectory(),
            timing=NO_TIMING,
            data_source=source,
        )
    try:
        stored = json.loads(request)
    except (ValueError, TypeError):
        stored = None
    return JobRecord(
        job_id=str(job_id),
        state="failed" if seq is not None else str(state),
        data_source=source,
        instance_id=instance_id if isinstance(instance_id, str) else None,
        request=stored if isinstance(stored, dict) else {},
        created_at=created_at if isinstance(created_at, float | int) else 0.0,
        seq=seq,
        result=result,
        tenant=tenant_of(str(job_id)),
    )
