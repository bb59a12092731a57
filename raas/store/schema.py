"""The result store's schema, its versions, and one migration from each version to the next.

A database keeps its version in SQLite's ``PRAGMA user_version``. The versions raas has written:

1. the first store: a job's request, its state, and its result as JSON;
2. ``attempts`` and ``attempt_errors``: infra failures run a job again, and each attempt is kept;
3. ``error_type``, ``error_kind`` and ``response_tokens`` copied out of the result, with indexes,
   so that the dashboard counts and filters without parsing every result;
4. ``tenant``: whose job it is (raas.tenants); a job written before is the ``default`` tenant's.
5. the ``checkpoints`` table: jobs in flight's durable turn boundaries (raas.store.checkpoints).
6. ``stop_reason``, ``turns`` and ``job_group`` copied out of each result and request.
7. ``generated_tokens``, ``malformed_tool_calls``, ``init_s``, ``run_s``, ``eval_s`` and
   ``policy_version_span`` copied out of each result as it is written, so that the dashboard's
   plots over time are filled at a start from small columns, not from every result's JSON.

The raas releases that wrote versions 1 to 3 left ``user_version`` at 0; such a database is placed
by its columns. A new database is made at the current version directly; an older one is migrated
in one transaction when it is opened, so a migration that fails leaves it as it was. A database
from a newer raas is refused, never opened: this code would not know what its columns mean.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

# A job's durable turn boundaries while it is in flight (raas.agent.checkpoints): removed with
# the transaction that writes its result.
CHECKPOINTS_TABLE = """CREATE TABLE IF NOT EXISTS checkpoints (
    job_id    TEXT NOT NULL,
    turn      INTEGER NOT NULL,
    from_turn INTEGER NOT NULL,
    archive   TEXT,             -- the file name of its archive in the job's directory
    size      INTEGER NOT NULL DEFAULT 0,  -- its archive's bytes (the tenant's disk quota)
    data      TEXT NOT NULL,    -- the rest, as JSON
    PRIMARY KEY (job_id, turn)
)"""
# Today's schema, for a new database.
CREATE_TABLE = """CREATE TABLE jobs (
    job_id      TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    data_source TEXT,
    instance_id TEXT,
    request     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    seq         INTEGER UNIQUE,   -- finish order; NULL until the result is written
    finished_at REAL,
    reward      REAL,
    result      TEXT,
    attempts    INTEGER NOT NULL DEFAULT 1,
    attempt_errors TEXT,  -- JSON list of ErrorInfo: why each earlier attempt was run again
    -- Copied out of the result, so that the dashboard counts and filters without parsing it.
    error_type  TEXT,
    error_kind  TEXT,
    response_tokens INTEGER,
    tenant      TEXT NOT NULL DEFAULT 'default',  -- whose job; job_id is its key (raas.tenants)
    stop_reason TEXT,     -- the trajectory's (version 6): the dashboard's distributions
    turns       INTEGER,
    job_group   TEXT,     -- the request's group (GRPO's samples of a prompt)
    -- The plots over time (version 7); NULL in a row written before.
    generated_tokens INTEGER,      -- loss mask 1
    malformed_tool_calls INTEGER,
    init_s      REAL,              -- every attempt's seconds in the stage
    run_s       REAL,
    eval_s      REAL,
    policy_version_span INTEGER    -- newest token's policy version - oldest's; NULL: unknown
)"""
# The dashboard's filters and counts (version 3); version 1 had jobs_state_seq alone.
DASHBOARD_INDEXES = (
    "CREATE INDEX IF NOT EXISTS jobs_errors ON jobs(error_type, error_kind)",
    "CREATE INDEX IF NOT EXISTS jobs_source_seq ON jobs(data_source, seq)",
    "CREATE INDEX IF NOT EXISTS jobs_finished_at ON jobs(finished_at)",
)
# A tenant's pages of results (version 4).
TENANT_INDEX = "CREATE INDEX IF NOT EXISTS jobs_tenant_seq ON jobs(tenant, seq)"
CREATE = (
    CREATE_TABLE,
    "CREATE INDEX jobs_state_seq ON jobs(state, seq)",
    *DASHBOARD_INDEXES,
    TENANT_INDEX,
    CHECKPOINTS_TABLE,
)
# The columns each version added to the jobs table.
ADDED_COLUMNS = {
    2: {"attempts": "INTEGER NOT NULL DEFAULT 1", "attempt_errors": "TEXT"},
    3: {"error_type": "TEXT", "error_kind": "TEXT", "response_tokens": "INTEGER"},
    4: {"tenant": "TEXT NOT NULL DEFAULT 'default'"},
    6: {"stop_reason": "TEXT", "turns": "INTEGER", "job_group": "TEXT"},
    7: {
        "generated_tokens": "INTEGER",
        "malformed_tool_calls": "INTEGER",
        "init_s": "REAL",
        "run_s": "REAL",
        "eval_s": "REAL",
        "policy_version_span": "INTEGER",
    },
}


class NewerDatabase(RuntimeError):
    """The database was written by a newer raas than this one."""


def _columns(conn: sqlite3.Connection) -> set[str]:
    return {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}


def _add_columns(conn: sqlite3.Connection, columns: dict[str, str]) -> None:
    # raas before user_version added columns one ALTER (one commit) at a time, so a database it
    # stopped between two of them has the first: only what is missing is added.
    have = _columns(conn)
    for name, decl in columns.items():
        if name not in have:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")


def _add_attempts(conn: sqlite3.Connection) -> None:
    """1 -> 2: a job that failed for the infrastructure runs again; how often, and why, is kept.
    A job written before ran once."""
    _add_columns(conn, ADDED_COLUMNS[2])


def _add_error_columns(conn: sqlite3.Connection) -> None:
    """2 -> 3: what the dashboard counts and filters on, copied out of each result."""
    _add_columns(conn, ADDED_COLUMNS[3])
    # An error written before kinds (version 1) reads back as infra, the wire's default.
    conn.execute(
        "UPDATE jobs SET error_type = json_extract(result, '$.error.type'),"
        " error_kind = CASE WHEN json_extract(result, '$.error') IS NOT NULL"
        "     THEN COALESCE(json_extract(result, '$.error.kind'), 'infra') END,"
        " response_tokens = json_array_length(result, '$.trajectory.response_ids')"
        " WHERE result IS NOT NULL"
    )
    for index in DASHBOARD_INDEXES:
        conn.execute(index)


def _add_tenant(conn: sqlite3.Connection) -> None:
    """3 -> 4: whose job each is; every job written before is the default tenant's (a server
    without tenants), whose keys are its ids as they were."""
    _add_columns(conn, ADDED_COLUMNS[4])
    conn.execute(TENANT_INDEX)


def _add_checkpoints(conn: sqlite3.Connection) -> None:
    """4 -> 5: jobs in flight keep their turn boundaries; a database before had none."""
    conn.execute(CHECKPOINTS_TABLE)


def _add_trajectory_columns(conn: sqlite3.Connection) -> None:
    """5 -> 6: each result's stop reason and turns and each request's group, copied out of
    them once here, so that the dashboard's distributions read small columns, not every
    result's JSON."""
    _add_columns(conn, ADDED_COLUMNS[6])
    conn.execute(
        "UPDATE jobs SET stop_reason = json_extract(result, '$.trajectory.stop_reason'),"
        " turns = COALESCE(json_array_length(result, '$.trajectory.turns'), 0)"
        " WHERE result IS NOT NULL AND json_valid(result)"
    )
    conn.execute(
        "UPDATE jobs SET job_group = json_extract(request, '$.group')"
        " WHERE json_valid(request) AND json_type(request, '$.group') = 'text'"
    )


def _add_series_columns(conn: sqlite3.Connection) -> None:
    """6 -> 7: what the plots over time count of each result, as columns. Rows written before
    keep NULL there (nothing is read out of their JSON): a backfill would parse every result
    ever stored, for the few that finished in the plots' last two hours before the upgrade,
    which count in the plots' jobs, rewards and errors, not in their tokens, stage seconds,
    malformed calls or staleness."""
    _add_columns(conn, ADDED_COLUMNS[7])


# MIGRATIONS[v - 1] takes a database from version v to v + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _add_attempts,
    _add_error_columns,
    _add_tenant,
    _add_checkpoints,
    _add_trajectory_columns,
    _add_series_columns,
]
VERSION = len(MIGRATIONS) + 1


def _version_by_shape(conn: sqlite3.Connection) -> int:
    """The version of a database from before user_version was kept (0: no jobs table yet).
    Every version after 3 is written to user_version, so only 1 to 3 are told apart here."""
    have = _columns(conn)
    if not have:
        return 0
    if not ADDED_COLUMNS[2].keys() <= have:
        return 1
    if not ADDED_COLUMNS[3].keys() <= have:  # also one that an old raas stopped adding them to
        return 2
    return 3


def _user_version(conn: sqlite3.Connection) -> int:
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    return int(version)


def _refuse_newer(version: int, path: str | Path) -> None:
    if version > VERSION:
        raise NewerDatabase(
            f"{path} was written by a newer raas (store version {version}; this raas reads up"
            f" to {VERSION}): upgrade raas to open it"
        )


def migrate(conn: sqlite3.Connection, path: str | Path) -> None:
    """Bring the database on ``conn`` (in autocommit mode) to VERSION, or make it new there."""
    if _user_version(conn) == VERSION:
        return  # the usual open: nothing written, no lock taken
    # IMMEDIATE: one process migrates; another opening the file at once waits, then finds it done.
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _user_version(conn) or _version_by_shape(conn)
        _refuse_newer(version, path)
        if version == 0:
            for statement in CREATE:
                conn.execute(statement)
        else:
            for step in MIGRATIONS[version - 1 :]:
                step(conn)
        conn.execute(f"PRAGMA user_version = {VERSION}")
    except BaseException:
        if conn.in_transaction:  # SQLite has rolled some failures (a full disk) back itself
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def check_version(path: str | Path) -> None:
    """Raise NewerDatabase if ``path`` was written by a newer raas; reads, never writes.
    Asked before a server starts, so that it is said in one line, not in a start-up traceback."""
    if not Path(path).exists():
        return
    conn = sqlite3.connect(path)
    try:
        _refuse_newer(_user_version(conn), path)
    finally:
        conn.close()
