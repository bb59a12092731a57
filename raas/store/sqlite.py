"""Durable job records and results in SQLite.

Every job is recorded when it is accepted and its result is written before the job is reported
finished, so a restart loses nothing: finished results are read back, and jobs that were in
flight are found and reported as failed. All SQLite calls run on one dedicated thread (SQLite
connections belong to a thread, and one writer keeps the finish order simple), never on the event
loop. The calls made in one turn of the event loop go to that thread together, in order, and
their answers come back together: a hop between threads costs more than a small SQLite
statement, and a job makes about six calls.

A write the disk refuses (full, an I/O error, a read-only file) is a StoreWriteError, and the
store says it cannot write (``write_error``, once in the log) until a write succeeds again:
the pipeline then refuses submissions and keeps finished results until they can be written.
Rows are written only if they read back, and rows that cannot be read are skipped where results
are listed (raas.store.records).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from raas.store import checkpoints as turn_rows
from raas.store import dashboard
from raas.store.dashboard import EVERY_JOB, FinishedGroup, JobFilter, Tally
from raas.store.records import COLUMNS, ERRORS, JobRecord, Quarantine, storable
from raas.store.schema import VERSION, migrate
from raas.wire import DashboardStats, Distributions, ErrorInfo, JobSummary, RolloutResult

T = TypeVar("T")

log = logging.getLogger(__name__)


# One call to the store thread: what it runs, and the event loop's future for its answer
# (None for a note that nobody waits for).
_Call = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any] | None"]
_Answer = tuple["asyncio.Future[Any]", Any, BaseException | None]


class DatabaseInUse(RuntimeError):
    """Another live server (or ``raas run``) holds the database: one writer a database."""


def hold_database(path: str | Path) -> int:
    """An exclusive hold on the database at ``path`` for this process (a lock on ``PATH.lock``,
    released when the fd closes or the process dies); DatabaseInUse if another process has it.

    A server numbers results in memory (``seq``) and keeps tallies as one writer: two servers
    on one database would give two results the same number, and one of them could never be
    written. The lock is on a file of its own, not the database, because on NFS ``flock`` is
    emulated with the same POSIX locks SQLite takes.
    """
    lock = Path(f"{path}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DatabaseInUse(
            f"{path} is in use by another raas server (or raas run): give this one a database"
            " of its own (--db FILE)"
        ) from None
    return fd


class StoreWriteError(Exception):
    """The database refused a write (a full disk, an I/O error, a read-only file): nothing of
    that call was written, and the same call may succeed once the cause is gone."""


def connect(path: str | Path) -> sqlite3.Connection:
    """Open the database at ``path``, made or migrated to today's schema (see schema.py)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        migrate(conn, path)  # first: a database from a newer raas is refused untouched
        conn.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a committed write survives a crash of the process (not of the OS).
        conn.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


@dataclass(frozen=True)
class Page:
    """A page of finished jobs, and the cursor after it (past rows that could not be read)."""

    records: list[JobRecord]
    next_since: int


class ResultStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raas-store")
        self._conn: sqlite3.Connection | None = None
        self._hold: int | None = None  # hold_database's fd, while open
        self._seq = 0
        self._tally = Tally()  # used on the store's thread only
        self._pending: list[_Call] = []  # calls of this event-loop turn, not yet sent
        self._quarantine = Quarantine(str(self.path))  # used on the store's thread only
        # Why the last write failed, and since when; None while writes succeed. Set on the
        # store's thread, read anywhere (one assignment of a tuple).
        self._write_failure: tuple[str, float] | None = None

    # -- the store's thread ---------------------------------------------------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._enqueue(fn, future)
        return await future

    def _note(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``fn`` on the store thread after the calls made before it; nobody waits."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a script): straight to the thread
            self._executor.submit(self._run_batch, [(fn, None)], None)
            return
        self._enqueue(fn, None)

    def _enqueue(
        self, fn: Callable[[sqlite3.Connection], Any], future: asyncio.Future[Any] | None
    ) -> None:
        self._pending.append((fn, future))
        if len(self._pending) == 1:  # the first of this turn: send them all at its end
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self._executor.submit(self._run_batch, batch, asyncio.get_running_loop())

    def _run_batch(self, batch: list[_Call], loop: asyncio.AbstractEventLoop | None) -> None:
        """On the store thread: every call in order; the answers go back in one wake-up."""
        answers: list[_Answer] = []
        for fn, future in batch:
            value: Any = None
            error: BaseException | None = None
            try:
                value = self._with_conn(fn)
            except Exception as e:
                error = e
            if future is not None:
                answers.append((future, value, error))
            elif error is not None and self._write_failure is None:
                # (While the store cannot write, that is said once, not for every state.)
                log.error("could not record a job state: %s", error)
        if answers and loop is not None:
            # RuntimeError: the loop has closed, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, answers)

    def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError("the result store is not open")
        return fn(self._conn)

    def _write(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run the write ``fn`` (on the store's thread); what the disk refuses raises
        StoreWriteError, and the store says whether it can write from then on."""
        try:
            value = fn(conn)
        except sqlite3.OperationalError as e:  # full, I/O error, read-only, locked too long
            if conn.in_transaction:  # SQLite rolls some failures back itself
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if self._write_failure is None:
                log.error(
                    "the result store cannot write to %s (%s): submissions are refused and"
                    " finished results are held until it can; it is tried again by itself",
                    self.path,
                    e,
                )
                self._write_failure = (str(e), time.time())
            raise StoreWriteError(f"cannot write to {self.path}: {e}") from e
        if self._write_failure is not None:
            log.warning(
                "the result store writes to %s again (it could not for %.0f s)",
                self.path,
                time.time() - self._write_failure[1],
            )
            self._write_failure = None
        return value

    # -- opening and closing --------------------------------------------------------------------

    async def open(self) -> None:
        def _open() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._hold = hold_database(self.path)
            try:
                self._conn = connect(self.path)
            except BaseException:
                os.close(self._hold)
                self._hold = None
                raise
            (max_seq,) = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()
            self._seq = int(max_seq)
            self._tally = Tally.count(self._conn)
            try:
                turn_rows.tidy(self._conn, self.path)
            except sqlite3.Error as e:  # a read-only database: nothing to tidy now
                log.warning("could not remove the checkpoints of finished jobs: %s", e)

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, _open)

    async def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._hold is not None:
                os.close(self._hold)
                self._hold = None

        self._flush()  # what was asked before closing runs before it
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)

    # -- health ---------------------------------------------------------------------------------

    @property
    def write_error(self) -> str | None:
        """Why the store cannot write now (its last write failed), or None."""
        failure = self._write_failure
        if failure is None:
            return None
        reason, since = failure
        return f"cannot write to {self.path} for {time.time() - since:.0f} s: {reason}"

    @property
    def last_seq(self) -> int:
        """The number of the last result written (results are numbered in finish order)."""
        return self._seq

    @property
    def unreadable_rows(self) -> int:
        """How many rows were found unreadable (and skipped) since the store opened."""
        return len(self._quarantine.job_ids)

    async def probe(self) -> bool:
        """Whether a write succeeds now: one that changes nothing but needs room on the disk
        (the schema version written again)."""

        def _probe(conn: sqlite3.Connection) -> None:
            conn.execute(f"PRAGMA user_version = {VERSION}")

        try:
            await self._call(lambda conn: self._write(conn, _probe))
        except StoreWriteError:
            return False
        return True

    # -- writing --------------------------------------------------------------------------------

    async def add_jobs(self, records: list[JobRecord]) -> None:
        """Record accepted jobs, all or none; StoreWriteError when the disk refuses."""
        rows = [
            (
                r.job_id,
                r.state,
                r.data_source,
                r.instance_id,
                json.dumps(r.request),
                r.created_at,
                r.tenant,
                group if isinstance(group := r.request.get("group"), str) else None,
            )
            for r in records
        ]

        def _add(conn: sqlite3.Connection) -> None:
            with conn:
                conn.execute("BEGIN")
                conn.executemany(
                    "INSERT INTO jobs (job_id, state, data_source, instance_id, request,"
                    " created_at, tenant, job_group) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
            self._tally.sources.update(r.data_source for r in records)

        await self._call(lambda conn: self._write(conn, _add))

    def note_state(self, job_id: str, state: str) -> None:
        """Record a state change without waiting for it.

        The single store thread runs calls in the order they were made, so a later result write
        always lands after it; a state note that arrives after the result changes nothing.
        """

        def _note(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE jobs SET state = ? WHERE job_id = ? AND seq IS NULL", (state, job_id)
            )

        self._note(_note)

    def note_attempt(self, job_id: str, attempts: int, errors: list[ErrorInfo]) -> None:
        """Record that a job runs again (and why) without waiting, as ``note_state`` does."""
        payload = ERRORS.dump_json(errors).decode()

        def _note(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE jobs SET state = 'queued', attempts = ?, attempt_errors = ?"
                " WHERE job_id = ? AND seq IS NULL",
                (attempts, payload, job_id),
            )

        self._note(_note)

    async def save_result(self, job_id: str, result: RolloutResult) -> RolloutResult:
        """Write a finished result; returns what was written: ``result``, or, where it would not
        read back, a failed result saying why (raas.store.records). StoreWriteError when the
        disk refuses: nothing was written, and the same call may be made again."""

        def _save(conn: sqlite3.Connection) -> RolloutResult:
            # Read back here, on the store's thread: a long trajectory takes milliseconds.
            stored, payload = storable(result)
            error_type = stored.error.type if stored.error else None
            error_kind = stored.error.kind if stored.error else None
            tokens = len(stored.trajectory.response_ids)
            seq = self._seq + 1
            conn.execute("BEGIN")
            row = conn.execute(
                "SELECT state, error_type, error_kind, reward, data_source, seq FROM jobs"
                " WHERE job_id = ?",
                (job_id,),
            ).fetchone()
            source = row[4] if row is not None else None
            before = row[:4] if row is not None and row[5] is not None else None
            written = conn.execute(
                "UPDATE jobs SET state = ?, seq = ?, finished_at = ?, reward = ?, result = ?,"
                " error_type = ?, error_kind = ?, response_tokens = ?, stop_reason = ?,"
                " turns = ?, generated_tokens = ?, malformed_tool_calls = ?, init_s = ?,"
                " run_s = ?, eval_s = ?, policy_version_span = ? WHERE job_id = ?",
                (
                    stored.state,
                    seq,
                    time.time(),
                    stored.reward,
                    payload,
                    error_type,
                    error_kind,
                    tokens,
                    stored.trajectory.stop_reason,
                    len(stored.trajectory.turns),
                    sum(stored.trajectory.loss_mask),
                    stored.trajectory.malformed_tool_calls(),
                    stored.timing.init_s,
                    stored.timing.run_s,
                    stored.timing.eval_s,
                    stored.trajectory.policy_version_span(),
                    job_id,
                ),
            ).rowcount
            turn_rows.drop_rows(conn, job_id)  # a job's checkpoints go with its result
            conn.execute("COMMIT")
            self._seq = seq
            turn_rows.remove_files(self.path, job_id)
            if before is not None:  # a result written over: its counts go
                old_state, old_type, old_kind, old_reward = before
                self._tally.add(old_state, old_type, old_kind, old_reward, -1, source)
            if written:
                self._tally.add(stored.state, error_type, error_kind, stored.reward, 1, source)
            return stored

        return await self._call(lambda conn: self._write(conn, _save))

    # -- checkpoints (raas.store.checkpoints) ---------------------------------------------------

    def checkpoint_dir(self, job_id: str) -> Path:
        """The directory of ``job_id``'s archives, made and checked to be raas's own (a
        CheckpointDirError where it is not). Touches the disk: call it off the event loop."""
        return turn_rows.job_dir(self.path, job_id)

    async def add_checkpoint(
        self,
        job_id: str,
        from_turn: int,
        turn: int,
        archive: str | None,
        data: dict[str, Any],
        *,
        size: int = 0,
        tenant_cap: int | None = None,
    ) -> bool:
        """Keep a turn boundary of a job in flight (the rows after ``from_turn`` go, and their
        archives); False, its archive removed, where it is not kept (the job has a result, or
        its tenant would hold more than ``tenant_cap`` bytes). StoreWriteError when the disk
        refuses."""

        def _add(conn: sqlite3.Connection) -> bool:
            kept, gone = turn_rows.add(
                conn, job_id, from_turn, turn, archive, data, size=size, tenant_cap=tenant_cap
            )
            if gone:  # most turns replace nothing: no directory to open and check
                turn_rows.remove_files(self.path, job_id, gone)
            return kept

        return await self._call(lambda conn: self._write(conn, _add))

    async def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """The job's checkpoint rows by turn (raas.store.checkpoints.rows)."""
        return await self._call(lambda conn: turn_rows.rows(conn, job_id))

    # -- reading --------------------------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        """The job's record; one whose row cannot be read reads as failed, saying so."""

        def _get(conn: sqlite3.Connection) -> JobRecord | None:
            row = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            return self._quarantine.read_or_stand_in(row) if row else None

        return await self._call(_get)

    async def unfinished(self) -> list[JobRecord]:
        """The jobs without a result, oldest first (those whose rows cannot be read skipped)."""

        def _unfinished(conn: sqlite3.Connection) -> list[JobRecord]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE seq IS NULL ORDER BY created_at"
            ).fetchall()
            return [r for r in map(self._quarantine.read, rows) if r is not None]

        return await self._call(_unfinished)

    async def finished(
        self, where: JobFilter = EVERY_JOB, since: int = 0, limit: int = 100
    ) -> Page:
        """Finished jobs that ``where`` takes (a tenant's, a state's...) in finish order, after
        the cursor ``since``; a row that cannot be read is skipped (and counted), and the
        cursor goes past it."""

        def _page(conn: sqlite3.Connection) -> Page:
            records: list[JobRecord] = []
            last = since
            rows = _iter_finished(conn, self._quarantine, where, since, limit)
            for seq, found in rows:
                last = seq
                if found is not None:
                    records.append(found)
            return Page(records, last)

        return await self._call(_page)

    async def summaries(
        self, where: JobFilter, before: int | None = None, limit: int = 100
    ) -> tuple[list[JobSummary], int | None]:
        """Finished jobs newest first (the dashboard's list), and the next page's cursor."""
        return await self._call(lambda conn: dashboard.summaries(conn, where, before, limit))

    async def distributions(self, last: int, tenant: str | None = None) -> Distributions:
        """How the ``last`` finished jobs (``tenant``'s) ended, their turns and lengths."""
        return await self._call(lambda conn: dashboard.distributions(conn, last, tenant))

    async def finished_groups(self, bucket_s: float, since: float) -> list[FinishedGroup]:
        """What the plots over time count of the results finished at ``since`` or later, by
        bucket of ``bucket_s`` seconds, tenant, state and error kind (one query)."""
        return await self._call(lambda conn: dashboard.finished_groups(conn, bucket_s, since))

    async def stats(self, tenant: str | None = None) -> DashboardStats:
        """Counts over every finished job (or only ``tenant``'s): by state, by error, in recent
        windows."""
        if tenant is None:
            return await self._call(lambda conn: dashboard.stats(conn, self._tally))
        # A tenant's are counted on each call (the kept tally is the whole table's).
        return await self._call(
            lambda conn: dashboard.stats(conn, Tally.count(conn, tenant), tenant=tenant)
        )


def _deliver(answers: list[_Answer]) -> None:
    for future, value, error in answers:
        if future.cancelled():  # its caller stopped waiting (the call has run all the same)
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


def _iter_finished(
    conn: sqlite3.Connection,
    quarantine: Quarantine,
    where: JobFilter,
    since: int,
    limit: int | None,
) -> Iterator[tuple[int, JobRecord | None]]:
    """(seq, record) of each finished job ``where`` takes, in finish order; None for a row that
    cannot be read."""
    condition, args = where.where()
    sql = f"SELECT {COLUMNS} FROM jobs WHERE seq > ? AND {condition} ORDER BY seq"
    args = [since, *args]
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    for row in conn.execute(sql, args):
        yield row[6], quarantine.read(row)


def iter_finished(path: str | Path, where: JobFilter = EVERY_JOB) -> Iterator[JobRecord]:
    """Every finished job in a database that ``where`` takes (a tenant's, a state's...), in
    finish order (for export; blocking). A row that cannot be read is skipped, and said in the
    log."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no raas database at {path}")
    conn = connect(path)
    try:
        for _, found in _iter_finished(conn, Quarantine(str(path)), where, 0, None):
            if found is not None:
                yield found
    finally:
        conn.close()
