"""The dashboard's reads of the results table: pages of job summaries with filters, counts by
state and by error, throughput over recent windows.

Plain functions of a connection, run on the store's own thread (``ResultStore`` methods). A
summary reads a few fields out of each listed row's result with SQLite's JSON functions (a page
is small); what is counted over every row (errors, tokens) has columns of its own, indexed.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from raas.wire import DashboardStats, FailureCount, JobSummary, Throughput

MESSAGE_CHARS = 300
WINDOWS_S = (60.0, 600.0)

# Each field of a JobSummary and the SQL that reads it from a row.
_FIELDS = {
    "job_id": "job_id",
    "state": "state",
    "data_source": "COALESCE(data_source, '')",
    "task": "json_extract(result, '$.task')",
    "reward": "reward",
    "error_type": "error_type",
    "error_kind": "error_kind",
    "error_message": f"substr(json_extract(result, '$.error.message'), 1, {MESSAGE_CHARS})",
    "stage_failed": "json_extract(result, '$.stage_failed')",
    "stop_reason": "json_extract(result, '$.trajectory.stop_reason')",
    "turns": "COALESCE(json_array_length(result, '$.trajectory.turns'), 0)",
    "response_tokens": "COALESCE(response_tokens, 0)",
    "total_s": "json_extract(result, '$.timing.total_s')",
    "attempts": "attempts",
    "finished_at": "finished_at",
}
_SUMMARY = f"SELECT seq, {', '.join(_FIELDS.values())} FROM jobs"


@dataclass(frozen=True)
class JobFilter:
    """Which finished jobs to list; None is no filter."""

    state: str | None = None
    data_source: str | None = None
    error_type: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses, args = ["seq IS NOT NULL"], []
        for sql, value in (
            ("state = ?", self.state),
            ("data_source = ?", self.data_source),
            ("error_type = ?", self.error_type),
            ("reward >= ?", self.min_reward),
            ("reward <= ?", self.max_reward),
        ):
            if value is not None:
                clauses.append(sql)
                args.append(value)
        return " AND ".join(clauses), args


def summaries(
    conn: sqlite3.Connection, where: JobFilter, before: int | None, limit: int
) -> tuple[list[JobSummary], int | None]:
    """Up to ``limit`` finished jobs newest first, older than the cursor ``before``; and the
    cursor of the next page (None when there is none)."""
    sql, args = where.where()
    if before is not None:
        sql += " AND seq < ?"
        args.append(before)
    rows = conn.execute(
        f"{_SUMMARY} WHERE {sql} ORDER BY seq DESC LIMIT ?", [*args, limit + 1]
    ).fetchall()
    jobs = [JobSummary(**dict(zip(_FIELDS, row[1:], strict=True))) for row in rows[:limit]]
    more = len(rows) > limit
    return jobs, (rows[limit - 1][0] if more else None)


def stats(conn: sqlite3.Connection, now: float | None = None) -> DashboardStats:
    now = time.time() if now is None else now
    finished = dict(
        conn.execute(
            "SELECT state, COUNT(*) FROM jobs WHERE seq IS NOT NULL GROUP BY state"
        ).fetchall()
    )
    failures = [
        FailureCount(type=t, kind=k or "infra", count=n)
        for t, k, n in conn.execute(
            "SELECT error_type, error_kind, COUNT(*) AS n FROM jobs WHERE error_type IS NOT NULL"
            " GROUP BY error_type, error_kind ORDER BY n DESC, error_type"
        )
    ]
    throughput = []
    for window in WINDOWS_S:
        n, tokens = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(response_tokens), 0) FROM jobs WHERE finished_at >= ?",
            (now - window,),
        ).fetchone()
        throughput.append(Throughput(window_s=window, finished=n, response_tokens=tokens))
    sources = [
        s
        for (s,) in conn.execute(
            "SELECT DISTINCT data_source FROM jobs WHERE data_source IS NOT NULL ORDER BY 1"
        )
    ]
    return DashboardStats(
        finished=finished, failures=failures, throughput=throughput, data_sources=sources
    )
