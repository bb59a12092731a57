"""The result store opens every database an earlier raas wrote, keeping every row.

Each tests/fixtures/store/vN.sql is a database as the raas releases of store version N wrote it:
their CREATE statements and a few rows (finished, failed with a partial trajectory, queued, in
flight) with that version's columns and result JSON. Version 3 was also written with its
user_version (3) by the raas that kept it, before version 4 (tenants) came; version 4 was
written with its user_version (4) until version 5 (checkpoints) came, version 5 until
version 6 (stop reasons and turns as columns), and version 6 until version 7 (what the plots
over time count, as columns).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from raas.store import schema
from raas.store.dashboard import JobFilter
from raas.store.sqlite import JobRecord, ResultStore, connect
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory

FIXTURES = Path(__file__).parents[1] / "fixtures" / "store"
# The versions raas wrote before it kept user_version (each fixture's user_version is 0).
UNVERSIONED = [1, 2, 3]
# The versions raas wrote with their user_version (the fixture sets it).
VERSIONED = [4, 5, 6]
RESTART = ErrorInfo(
    type="server_restart",
    message="the service stopped while this job was run",
    kind="infra",
    stage="run",
)
SANDBOX = ErrorInfo(type="SandboxError", message="the action server died", stage="init")


def written_by(version: int, db: Path, extra_sql: str = "") -> Path:
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript((FIXTURES / f"v{version}.sql").read_text() + extra_sql)
    return db


def user_version(db: Path) -> int:
    with closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def dump(db: Path) -> list[str]:
    """Everything in the file but user_version: the schema and every row."""
    with closing(sqlite3.connect(db)) as conn:
        return list(conn.iterdump())


def shape(db: Path) -> tuple[dict[str, set[tuple[object, ...]]], dict[str, list[str]]]:
    """Each table's columns (in any order) and each index's columns."""
    with closing(sqlite3.connect(db)) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        columns = {
            t: {tuple(row[1:]) for row in conn.execute(f"PRAGMA table_info({t})")} for t in tables
        }
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")]
        indexes = {n: [r[2] for r in conn.execute(f"PRAGMA index_info({n})")] for n in names}
    return columns, indexes


def jobs_rows(db: Path) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT * FROM jobs ORDER BY job_id").fetchall()


async def test_a_new_database_is_made_at_the_current_version(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "new.db")
    await store.open()
    await store.close()
    # A version 8 needs a fixture of version 7 as that raas writes it (user_version 7), here.
    assert user_version(tmp_path / "new.db") == schema.VERSION
    assert [*UNVERSIONED, *VERSIONED] == list(range(1, schema.VERSION))
    assert all((FIXTURES / f"v{v}.sql").is_file() for v in range(1, schema.VERSION))


@pytest.mark.parametrize(
    ("version", "extra_sql"),
    [
        *((v, "") for v in [*UNVERSIONED, *VERSIONED]),
        # An old raas added columns one commit at a time: one stopped between two of them.
        (1, "ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;"),
        (2, "ALTER TABLE jobs ADD COLUMN error_type TEXT;"),
        # Version 3 as the raas that kept user_version wrote it (the same table and rows).
        (3, "PRAGMA user_version = 3;"),
    ],
)
async def test_a_database_from_an_earlier_version_opens_with_every_row(
    tmp_path: Path, version: int, extra_sql: str
) -> None:
    db = written_by(version, tmp_path / "old.db", extra_sql)
    before_open = jobs_rows(db)
    store = ResultStore(db)
    await store.open()
    if version >= 4:  # 4 -> 5 adds a table, 5 -> 6 and 6 -> 7 columns: every value is kept
        assert [row[: len(before_open[0])] for row in jobs_rows(db)] == before_open
    # 5 -> 6 copied each result's stop reason and turns out of it, for the distributions.
    with closing(sqlite3.connect(db)) as conn:
        copied = conn.execute(
            "SELECT job_id, stop_reason, turns, job_group FROM jobs ORDER BY job_id"
        )
        assert copied.fetchall() == [
            ("done-1", "finish", 0, None),
            ("failed-2", None, 0, None),
            ("queued-3", None, None, None),
            ("run-4", None, None, None),
        ]
        # 6 -> 7 reads nothing out of the results: the plots' columns of older rows stay NULL.
        plotted = conn.execute(
            "SELECT generated_tokens, malformed_tool_calls, init_s, run_s, eval_s,"
            " policy_version_span FROM jobs"
        )
        assert set(plotted.fetchall()) == {(None,) * 6}

    done, failed = (await store.finished()).records
    assert (done.job_id, done.state, done.seq, done.data_source) == (
        "done-1",
        "done",
        1,
        "countdown",
    )
    assert done.instance_id == "c-7" and done.created_at == 100.0
    assert done.request["instance"]["numbers"] == [3, 4]
    assert done.result is not None and done.result.reward == 1.0
    assert done.result.trajectory.response_ids == [3, 4, 5]
    assert done.result.trajectory.logprobs == [-0.5, -0.25, 0.0]
    assert (done.attempts, done.attempt_errors) == (1, [])
    assert done.tenant == "default"  # a job from before tenants is the default tenant's

    assert (failed.job_id, failed.state, failed.seq) == ("failed-2", "failed", 2)
    assert failed.request["timeout_s"] == 30.0 and failed.data_source == "probe"
    assert failed.result is not None and failed.result.stage_failed == "run"
    # The partial trajectory of a failed job is kept.
    assert failed.result.trajectory.response_ids == [7, 8]
    assert failed.result.trajectory.loss_mask == [1, 1]
    error = failed.result.error
    assert error is not None
    if version == 1:  # before error kinds and attempts: an error reads back as infra, one attempt
        assert (error.type, error.kind, error.stage) == ("RuntimeError", "infra", None)
        assert (failed.attempts, failed.attempt_errors) == (1, [])
    else:
        assert (error.type, error.kind, error.stage) == ("PolicyError", "policy", "run")
        assert (failed.attempts, failed.attempt_errors) == (2, [SANDBOX])
        assert failed.result.attempt_errors == [SANDBOX]

    queued, running = await store.unfinished()
    assert (queued.job_id, queued.state, queued.seq, queued.result) == (
        "queued-3",
        "queued",
        None,
        None,
    )
    assert queued.instance_id == "p-3" and queued.request["instance"]["instance_id"] == "p-3"
    assert (queued.attempts, queued.attempt_errors) == (1, [])
    assert (running.job_id, running.state, running.instance_id) == ("run-4", "run", None)
    expected = (1, []) if version == 1 else (2, [RESTART])
    assert (running.attempts, running.attempt_errors) == expected
    assert queued.tenant == running.tenant == "default"
    # The checkpoints' table (version 5) is there, empty, and keeps a row of a job in flight.
    assert await store.checkpoints("run-4") == []
    await store.add_checkpoint("run-4", 0, 1, None, {"delta": {}})
    assert [r["turn"] for r in await store.checkpoints("run-4")] == [1]

    # The dashboard's columns: written by version 3, read out of each result before it.
    error_type = "RuntimeError" if version == 1 else "PolicyError"
    error_kind = "infra" if version == 1 else "policy"
    stats = await store.stats()
    assert stats.finished == {"done": 1, "failed": 1}
    assert [(f.type, f.kind, f.count) for f in stats.failures] == [(error_type, error_kind, 1)]
    assert stats.data_sources == ["countdown", "probe"]
    listed, _ = await store.summaries(JobFilter(error_type=error_type))
    assert [(s.job_id, s.error_kind, s.response_tokens) for s in listed] == [
        ("failed-2", error_kind, 2)
    ]
    (summary,), _ = await store.summaries(JobFilter(state="done"))
    assert (summary.response_tokens, summary.attempts) == (3, 1)
    assert (summary.error_type, summary.error_kind) == (None, None)

    # The store goes on where the old one stopped: the next result comes after the old ones.
    result = RolloutResult(
        job_id="queued-3",
        state="done",
        data_source="probe",
        trajectory=Trajectory(response_ids=[9]),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
    )
    assert await store.save_result("queued-3", result) == result
    assert (record := await store.get("queued-3")) is not None and record.seq == 3
    await store.add_jobs([JobRecord("new-5", "queued", "probe", None, {}, 200.0)])
    await store.add_jobs([JobRecord("a~new-5", "queued", "probe", None, {}, 200.0, tenant="a")])
    assert (record := await store.get("a~new-5")) is not None and record.tenant == "a"
    await store.close()

    assert user_version(db) == schema.VERSION
    new = tmp_path / "new.db"
    connect(new).close()
    assert shape(db) == shape(new)  # migrated, it is what a new database is
    before = dump(db)
    connect(db).close()
    assert dump(db) == before and user_version(db) == schema.VERSION  # a second open: no change


async def test_a_database_from_a_newer_raas_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "newer.db"
    connect(db).close()
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
        conn.execute("ALTER TABLE jobs ADD COLUMN from_the_future TEXT")
    before = dump(db)
    with pytest.raises(schema.NewerDatabase) as refused:
        await ResultStore(db).open()
    message = str(refused.value)
    assert "\n" not in message and "upgrade raas" in message
    assert f"{db} was written by a newer raas (store version {schema.VERSION + 1}" in message
    with pytest.raises(schema.NewerDatabase):
        schema.check_version(db)
    assert dump(db) == before and user_version(db) == schema.VERSION + 1


def test_a_migration_that_fails_midway_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = written_by(1, tmp_path / "old.db")
    before = dump(db)

    def fails_after_a_change(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE jobs ADD COLUMN half_done TEXT")
        conn.execute("UPDATE jobs SET state = 'broken'")
        raise sqlite3.OperationalError("disk I/O error")

    good = schema.MIGRATIONS[0]
    monkeypatch.setattr(schema, "MIGRATIONS", [good, fails_after_a_change])
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        connect(db)
    assert dump(db) == before and user_version(db) == 0  # not even the first step stayed
    monkeypatch.undo()
    connect(db).close()
    assert user_version(db) == schema.VERSION
