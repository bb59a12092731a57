"""The dashboard's reads of the results table: pages of job summaries with filters, counts by
state and by error, throughput over recent windows.

Plain functions of a connection, run on the store's own thread (``ResultStore`` methods). A
summary reads a few fields out of each listed row's result with SQLite's JSON functions (a page
is small). The counts over every result are a Tally, counted once when the store opens and kept
as results are written: counting the table on each of the dashboard's polls (every 2 s) would
hold the thread that writes results (125 ms at 200,000 results).
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from raas.tenants import job_key
from raas.wire import (
    ERROR_KINDS,
    PASS_REWARD,
    STAGE_NAMES,
    DashboardStats,
    Distributions,
    FailureCount,
    JobSummary,
    SourceStats,
    Throughput,
)

MESSAGE_CHARS = 300
WINDOWS_S = (60.0, 600.0)

# A row's result where it is JSON (SQLite's JSON functions refuse the whole query on one that is
# not): a row that cannot be read is listed with what its columns say.
_RESULT = "(CASE WHEN json_valid(result) THEN result END)"
# Why the judge scored a done job below a pass (only there): its ``metrics.reason``, which every
# judge of raas writes below a pass (raas.judge.reasons). The other keys are a fallback for rows
# stored before the judges gave reasons (and a task of one's own that writes none): what judges
# wrote then, a verifier's or a judge's error, a failing case's why, the harness's word on its
# log, or the answer a math judge read.
_OLD_NOTES = ("verifier_error", "error", "failure.why", "log")
_JUDGE_NOTE = (
    f"CASE WHEN reward < {PASS_REWARD} THEN COALESCE("
    + ", ".join(f"json_extract({_RESULT}, '$.metrics.{key}')" for key in ("reason", *_OLD_NOTES))
    + f", CASE WHEN json_extract({_RESULT}, '$.metrics.correct') = 0 THEN 'answer read: '"
    f" || COALESCE(json_extract({_RESULT}, '$.metrics.read'), 'none') END) END"
)
# Each field of a JobSummary and the SQL that reads it from a row.
_FIELDS = {
    "job_id": "job_id",
    "state": "state",
    "data_source": "COALESCE(data_source, '')",
    "task": f"json_extract({_RESULT}, '$.task')",
    "instance_id": "instance_id",
    "reward": "reward",
    "error_type": "error_type",
    "error_kind": "error_kind",
    "error_message": f"substr(json_extract({_RESULT}, '$.error.message'), 1, {MESSAGE_CHARS})",
    "stage_failed": f"json_extract({_RESULT}, '$.stage_failed')",
    "stop_reason": f"json_extract({_RESULT}, '$.trajectory.stop_reason')",
    "tamper": f"substr(json_extract({_RESULT}, '$.metrics.tamper'), 1, {MESSAGE_CHARS})",
    "judge_note": f"substr({_JUDGE_NOTE}, 1, {MESSAGE_CHARS})",
    "turns": f"COALESCE(json_array_length({_RESULT}, '$.trajectory.turns'), 0)",
    "response_tokens": "COALESCE(response_tokens, 0)",
    "total_s": f"json_extract({_RESULT}, '$.timing.total_s')",
    "attempts": "attempts",
    "finished_at": "finished_at",
}
_SUMMARY = f"SELECT seq, {', '.join(_FIELDS.values())} FROM jobs"


SEARCH_CHARS = 200  # the longest text a search takes (the routes refuse a longer one: a 422)
# How many of the newest finished jobs a search over the server's routes reads: it reads each
# row's result JSON (the error's message, the judge's note), on the store's one thread, where
# every result write waits behind it. Unbounded, 2,000 results of 8k tokens took 0.56 s a
# search, and a tenant (or the dashboard's refresh) could repeat it at will.
SEARCH_ROWS = 1000
LIKE_ESCAPE = "\\"
# What a search looks in, cheapest first (SQLite stops at the first that matches): the row's
# columns, then its result's JSON. The job id is read as the caller knows it (``_own_id``).
_SEARCHED = (
    "instance_id",
    "data_source",
    "error_type",
    _FIELDS["task"],
    f"json_extract({_RESULT}, '$.error.message')",
    _JUDGE_NOTE,
)


def like_pattern(text: str) -> str:
    """A LIKE pattern that matches ``text`` anywhere, each of its characters only itself: a
    ``%`` or ``_`` someone searches for is not a wildcard."""
    escaped = (
        text.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2)
        .replace("%", LIKE_ESCAPE + "%")
        .replace("_", LIKE_ESCAPE + "_")
    )
    return f"%{escaped}%"


@dataclass(frozen=True)
class JobFilter:
    """Which finished jobs to list or export (the dashboard's list, ``GET /v1/rollouts:export``,
    ``raas export``): the one WHERE clause of them all; None is no filter."""

    state: str | None = None
    data_source: str | None = None
    error_type: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    tenant: str | None = None  # None: every tenant's (the admin's view)
    # A substring, matched without regard to (ASCII) case, of the job id as the caller knows
    # it, instance_id, data_source, task, the error's type and message, or the judge's note;
    # among the newest ``search_rows`` finished jobs of the database (None: all of them).
    search: str | None = None
    search_rows: int | None = SEARCH_ROWS

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition on ``jobs`` and its arguments (every value bound, none formatted
        into the SQL)."""
        clauses, args = ["seq IS NOT NULL"], []
        for sql, value in (
            ("tenant = ?", self.tenant),
            ("state = ?", self.state),
            ("data_source = ?", self.data_source),
            ("error_type = ?", self.error_type),
            ("reward >= ?", self.min_reward),
            ("reward <= ?", self.max_reward),
        ):
            if value is not None:
                clauses.append(sql)
                args.append(value)
        if self.search:
            own_id, own_args = self._own_id()
            searched = (own_id, *_SEARCHED)
            clauses.append(
                "(" + " OR ".join(f"{x} LIKE ? ESCAPE '{LIKE_ESCAPE}'" for x in searched) + ")"
            )
            # The own id's argument first: its expression is the first searched.
            args.extend([*own_args, *[like_pattern(self.search)] * len(searched)])
            if self.search_rows is not None:  # (seq's index finds the newest at once)
                clauses.append("seq > (SELECT COALESCE(MAX(seq), 0) FROM jobs) - ?")
                args.append(self.search_rows)
        return " AND ".join(clauses), args

    def _own_id(self) -> tuple[str, list[Any]]:
        """The SQL of the job id as the caller knows it, and its arguments: a tenant its own
        (``cd-7``, not the key ``alice~cd-7``, so that searching ``ali`` does not match every
        job of Alice's); the admin the key, as the admin's list shows it."""
        if self.tenant is None:
            return "job_id", []
        return "substr(job_id, ?)", [len(job_key(self.tenant, "")) + 1]


EVERY_JOB = JobFilter()  # every finished job of every tenant (a database's owner's reads)


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


@dataclass
class Rewards:
    """Finished jobs by state and their rewards: of the table, or of one data_source."""

    states: Counter[str] = field(default_factory=Counter)
    rewarded: int = 0
    reward_sum: float = 0.0
    passed: int = 0

    def note(self, state: str, reward: float | None, n: int = 1) -> None:
        """Count ``n`` finished jobs of ``state`` and ``reward`` (-1: one taken back)."""
        self.states[state] += n
        if reward is not None:
            self.rewarded += n
            self.reward_sum += n * reward
            self.passed += n if reward >= PASS_REWARD else 0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.rewarded if self.rewarded else None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.rewarded if self.rewarded else None

    def finished(self) -> dict[str, int]:
        return {s: n for s, n in sorted(self.states.items()) if n > 0}


@dataclass
class Tally(Rewards):
    """Finished jobs by state and their rewards, by error, and every data_source, of the whole
    table; and the first two by data_source (what a trainer mixing datasets reads first)."""

    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    sources: set[str] = field(default_factory=set)
    by_source: dict[str, Rewards] = field(default_factory=dict)

    @classmethod
    def count(cls, conn: sqlite3.Connection, tenant: str | None = None) -> Tally:
        """The whole table's (once a start), or one tenant's (on each of its polls)."""
        # Each count from an index alone (jobs_state_seq, jobs_errors): the rows are large.
        tally = cls()
        of, args = _of_tenant(tenant)
        tally.states.update(
            dict(
                conn.execute(
                    f"SELECT state, COUNT(*) FROM jobs WHERE seq IS NOT NULL{of} GROUP BY 1", args
                )
            )
        )
        errors = conn.execute(
            "SELECT error_type, error_kind, COUNT(*) FROM jobs WHERE error_type IS NOT NULL"
            f"{of} GROUP BY 1, 2",
            args,
        )
        tally.errors.update({(t, k or "infra"): n for t, k, n in errors})
        sources = conn.execute(f"SELECT DISTINCT data_source FROM jobs WHERE 1{of}", args)
        tally.sources.update(s for (s,) in sources if s is not None)
        # Once a start, over the table (no index holds rewards): the rows' large results lie
        # on overflow pages that this does not read.
        rewarded, total, passed = conn.execute(
            "SELECT COUNT(reward), TOTAL(reward), COUNT(CASE WHEN reward >= ? THEN 1 END)"
            f" FROM jobs WHERE seq IS NOT NULL{of}",
            (PASS_REWARD, *args),
        ).fetchone()
        tally.rewarded, tally.reward_sum, tally.passed = rewarded, total, passed
        for source, state, n, rewarded, total, passed in conn.execute(
            "SELECT COALESCE(data_source, ''), state, COUNT(*), COUNT(reward), TOTAL(reward),"
            " COUNT(CASE WHEN reward >= ? THEN 1 END) FROM jobs WHERE seq IS NOT NULL"
            f"{of} GROUP BY 1, 2",
            (PASS_REWARD, *args),
        ):
            one = tally.by_source.setdefault(source, Rewards())
            one.states[state] += n
            one.rewarded += rewarded
            one.reward_sum += total
            one.passed += passed
        return tally

    def add(
        self,
        state: str,
        error_type: str | None,
        error_kind: str | None,
        reward: float | None,
        n: int = 1,
        data_source: str | None = None,
    ) -> None:
        """Count ``n`` results (-1: one taken back, when a result is written over)."""
        self.note(state, reward, n)
        if error_type is not None:
            self.errors[error_type, error_kind or "infra"] += n
        self.by_source.setdefault(data_source or "", Rewards()).note(state, reward, n)


def _of_tenant(tenant: str | None) -> tuple[str, list[Any]]:
    """The SQL that keeps a query to ``tenant``'s jobs (nothing for None), and its argument."""
    return ("", []) if tenant is None else (" AND tenant = ?", [tenant])


def stats(
    conn: sqlite3.Connection, tally: Tally, now: float | None = None, tenant: str | None = None
) -> DashboardStats:
    now = time.time() if now is None else now
    of, args = _of_tenant(tenant)
    most_first = sorted((-n, t, k) for (t, k), n in tally.errors.items() if n > 0)
    failures = [
        FailureCount.model_validate({"type": t, "kind": k, "count": -n}) for n, t, k in most_first
    ]
    throughput = []
    for window in WINDOWS_S:
        n, tokens = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(response_tokens), 0) FROM jobs"
            f" WHERE finished_at >= ?{of}",
            (now - window, *args),
        ).fetchone()
        throughput.append(Throughput(window_s=window, finished=n, response_tokens=tokens))
    recent = dict(
        conn.execute(
            f"SELECT COALESCE(data_source, ''), COUNT(*) FROM jobs WHERE finished_at >= ?{of}"
            " GROUP BY 1",
            (now - WINDOWS_S[-1], *args),
        ).fetchall()
    )
    sources = [
        SourceStats(
            data_source=source,
            finished=one.finished(),
            rewarded=one.rewarded,
            mean_reward=one.mean_reward,
            pass_rate=one.pass_rate,
            finished_recently=recent.get(source, 0),
        )
        for source, one in sorted(tally.by_source.items())
        if one.finished()
    ]
    return DashboardStats(
        finished=tally.finished(),
        failures=failures,
        throughput=throughput,
        data_sources=sorted(tally.sources),
        rewarded=tally.rewarded,
        mean_reward=tally.mean_reward,
        pass_rate=tally.pass_rate,
        sources=sources,
    )


LENGTH_BINS = 12


def distributions(conn: sqlite3.Connection, last: int, tenant: str | None = None) -> Distributions:
    """How the ``last`` finished jobs (a tenant's own) ended, how many turns they took and how
    long their responses were: what says that every rollout hits its length limit, or never
    calls a tool. Read from the columns a result's write copies, never from its JSON."""
    of, args = _of_tenant(tenant)
    rows = conn.execute(
        f"SELECT stop_reason, state, turns, response_tokens FROM jobs WHERE seq IS NOT NULL{of}"
        " ORDER BY seq DESC LIMIT ?",
        (*args, last),
    ).fetchall()
    grouped = conn.execute(
        "SELECT tenant, job_group, reward FROM (SELECT tenant, job_group, reward FROM jobs"
        f" WHERE seq IS NOT NULL{of} ORDER BY seq DESC LIMIT ?)"
        " WHERE job_group IS NOT NULL AND reward IS NOT NULL",
        (*args, last),
    ).fetchall()
    rewards: dict[tuple[str, str], set[float]] = {}
    sizes: Counter[tuple[str, str]] = Counter()
    for tenant_of, group, reward in grouped:
        rewards.setdefault((tenant_of, group), set()).add(reward)
        sizes[tenant_of, group] += 1
    groups = [key for key, n in sizes.items() if n >= 2]
    # A job with no stop reason failed before its loop said one, or had no loop (a judge only).
    reasons = Counter(
        reason or (state if state != "done" else "none") for reason, state, *_ in rows
    )
    turns = [int(t or 0) for *_, t, _ in rows]
    lengths = [int(n or 0) for *_, n in rows]
    by_turns = Counter(turns)
    top = max(lengths, default=0)
    width = max(1, -(-(top + 1) // LENGTH_BINS))  # so that the longest falls in the last bin
    counts = [0] * LENGTH_BINS
    for n in lengths:
        counts[min(n // width, LENGTH_BINS - 1)] += 1
    return Distributions(
        jobs=len(rows),
        stop_reasons=dict(reasons.most_common()),
        turns=[by_turns.get(k, 0) for k in range(max(turns, default=-1) + 1)],
        response_tokens_bin=width,
        response_tokens=counts if rows else [],
        groups=len(groups),
        groups_all_equal=sum(1 for key in groups if len(rewards[key]) == 1),
    )


# -- the plots over time, filled at a start ----------------------------------------------------


@dataclass(frozen=True)
class FinishedGroup:
    """What the plots over time count of the results of one tenant that finished in one
    bucket with one state and error kind (raas.pipeline.ledger fills its window with these)."""

    bucket: int  # the index of the bucket: floor(finished_at / bucket_s)
    tenant: str
    state: str
    error_kind: str | None  # of the error that ended them; None when done
    jobs: int
    attempt_errors: dict[str, int]  # the errors that ended their earlier runs, by kind
    rewarded: int
    reward_sum: float
    passed: int
    generated_tokens: int
    malformed_tool_calls: int
    stage_s: dict[str, float]  # every attempt's seconds in the stage, summed over the jobs
    stage_runs: dict[str, int]  # the jobs that spent any in the stage
    staleness_known: int  # the jobs whose policy version span is known
    staleness_sum: int
    staleness_max: int | None


def _attempt_errors_of(kind: str) -> str:
    # A row's attempt_errors (a short JSON list) counted by kind; one written before kinds
    # reads as infra, as ErrorInfo's default. Not JSON: none (the query must not fail on it).
    return (
        "TOTAL((SELECT COUNT(*) FROM json_each(CASE WHEN json_valid(attempt_errors)"
        " THEN attempt_errors END) WHERE COALESCE(json_extract(value, '$.kind'), 'infra')"
        f" = '{kind}'))"
    )


_GROUPS = (
    "SELECT CAST(finished_at / ? AS INTEGER), tenant, state, error_kind, COUNT(*),"
    " COUNT(reward), TOTAL(reward), COUNT(CASE WHEN reward >= ? THEN 1 END),"
    " TOTAL(generated_tokens), TOTAL(malformed_tool_calls), "
    + ", ".join(f"TOTAL({s}_s), COUNT(CASE WHEN {s}_s > 0 THEN 1 END)" for s in STAGE_NAMES)
    + ", COUNT(policy_version_span), TOTAL(policy_version_span), MAX(policy_version_span), "
    + ", ".join(_attempt_errors_of(kind) for kind in ERROR_KINDS)
    # finished_at >= ?: a range of the jobs_finished_at index, so only the span's rows are read.
    + " FROM jobs WHERE finished_at >= ? AND seq IS NOT NULL GROUP BY 1, 2, 3, 4"
)


def finished_groups(conn: sqlite3.Connection, bucket_s: float, since: float) -> list[FinishedGroup]:
    """The results that finished at ``since`` or later, counted by bucket of ``bucket_s``
    seconds, tenant, state and error kind, in one query over the columns a result's write
    copies (a row written before store version 7 adds no tokens, stage seconds, malformed
    calls or staleness: those columns are NULL there)."""
    groups = []
    for row in conn.execute(_GROUPS, (bucket_s, PASS_REWARD, since)):
        bucket, tenant, state, kind, jobs, rewarded, reward_sum, passed, tokens, malformed = row[
            :10
        ]
        stages = row[10 : 10 + 2 * len(STAGE_NAMES)]
        known, span_sum, span_max, *attempts = row[10 + 2 * len(STAGE_NAMES) :]
        groups.append(
            FinishedGroup(
                bucket=int(bucket),
                tenant=tenant,
                state=state,
                error_kind=kind,
                jobs=jobs,
                attempt_errors={k: int(n) for k, n in zip(ERROR_KINDS, attempts, strict=True) if n},
                rewarded=rewarded,
                reward_sum=reward_sum,
                passed=passed,
                generated_tokens=int(tokens),
                malformed_tool_calls=int(malformed),
                stage_s=dict(zip(STAGE_NAMES, stages[0::2], strict=True)),
                stage_runs=dict(zip(STAGE_NAMES, stages[1::2], strict=True)),
                staleness_known=known,
                staleness_sum=int(span_sum),
                staleness_max=span_max,
            )
        )
    return groups
