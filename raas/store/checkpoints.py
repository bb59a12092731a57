"""The store's side of durable turn boundaries (raas.agent.checkpoints): a job's rows in the
``checkpoints`` table and its archives in a directory of its own, beside the database.

The directory (``DB.checkpoints/``, one directory a job named by a hash of its key) is made
0700 and checked at every use to be a directory of raas's own user that no one else can write
(a database may lie on a shared disk): raas reads back, and unpacks into sandboxes, only what
it wrote there. The rows are the store's: a row is added only for a job still in flight, the
rows after the turn a new row goes on from are removed with it (another run's), and every row
of a job goes in the transaction that writes its result; the job's directory goes after it.
At each open, the directories and rows of jobs no longer in flight are removed (a crash
between a result and its directory's removal).

Every function taking a connection runs on the store's thread (raas.store.sqlite).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class CheckpointDirError(RuntimeError):
    """The checkpoints' directory is not raas's own: nothing in it is trusted."""


def root_of(db: Path) -> Path:
    """The checkpoints' directory of the database at ``db``."""
    return db.with_name(db.name + ".checkpoints")


def dir_name(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:32]


def own_dir(path: Path) -> Path:
    """``path`` as a directory only this user can write, made 0700 if missing; a directory
    that is a link, someone else's or open to others is refused (CheckpointDirError)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise CheckpointDirError(f"cannot make {path}: {e}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise CheckpointDirError(
            f"{path} is not a directory of this user that only it can write: checkpoints are"
            " neither written there nor read back (remove it)"
        )
    return path


def job_dir(db: Path, job_id: str) -> Path:
    """The directory of ``job_id``'s archives, made and checked (with its parent)."""
    return own_dir(own_dir(root_of(db)) / dir_name(job_id))


def add(
    conn: sqlite3.Connection,
    job_id: str,
    from_turn: int,
    turn: int,
    archive: str | None,
    data: dict[str, Any],
    *,
    size: int = 0,
    tenant_cap: int | None = None,
) -> tuple[bool, list[str]]:
    """Keep a row for a job in flight, its archive of ``size`` bytes; the job's rows after
    ``from_turn`` go with it. Not kept for a job that has a result (the row comes too late), nor
    where its tenant's rows would hold more than ``tenant_cap`` bytes of archives with it.
    Returns whether it was kept, and the archives no row names any more (to remove)."""
    with conn:
        conn.execute("BEGIN")
        job = conn.execute(
            "SELECT tenant FROM jobs WHERE job_id = ? AND seq IS NULL", (job_id,)
        ).fetchone()
        refused = [archive] if archive is not None else []
        if job is None:
            return False, refused
        if tenant_cap is not None:
            (held,) = conn.execute(
                "SELECT COALESCE(SUM(c.size), 0) FROM checkpoints c JOIN jobs j USING (job_id)"
                " WHERE j.tenant = ? AND j.seq IS NULL AND NOT (c.job_id = ? AND c.turn > ?)",
                (job[0], job_id, from_turn),
            ).fetchone()
            if held + size > tenant_cap:
                return False, refused
        gone = [
            name
            for (name,) in conn.execute(
                "SELECT archive FROM checkpoints WHERE job_id = ? AND turn > ?",
                (job_id, from_turn),
            )
            if name is not None
        ]
        conn.execute("DELETE FROM checkpoints WHERE job_id = ? AND turn > ?", (job_id, from_turn))
        conn.execute(
            "INSERT INTO checkpoints (job_id, turn, from_turn, archive, size, data)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, turn, from_turn, archive, size, json.dumps(data)),
        )
    return True, gone


def rows(conn: sqlite3.Connection, job_id: str) -> list[dict[str, Any]]:
    """The job's rows by turn, each its data with ``turn``, ``from_turn`` and ``archive``; a row
    whose data does not read is left out (the chain stops before it)."""
    found = []
    for turn, from_turn, archive, data in conn.execute(
        "SELECT turn, from_turn, archive, data FROM checkpoints WHERE job_id = ? ORDER BY turn",
        (job_id,),
    ):
        try:
            row = json.loads(data)
        except ValueError:
            continue
        if isinstance(row, dict):
            found.append({**row, "turn": turn, "from_turn": from_turn, "archive": archive})
    return found


def drop_rows(conn: sqlite3.Connection, job_id: str) -> None:
    """Remove the job's rows (inside the caller's transaction: the result's)."""
    conn.execute("DELETE FROM checkpoints WHERE job_id = ?", (job_id,))


def remove_files(db: Path, job_id: str, names: list[str] | None = None) -> None:
    """Remove the job's directory (``names`` None) or those archives of it; what is not there is
    no error. Never follows a link."""
    folder = root_of(db) / dir_name(job_id)
    if not folder.is_dir() or folder.is_symlink():
        return
    if names is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in names:
        if "/" not in name and name not in ("", ".", ".."):
            (folder / name).unlink(missing_ok=True)


def tidy(conn: sqlite3.Connection, db: Path) -> int:
    """Remove the rows and directories of jobs no longer in flight; returns the directories."""
    with conn:
        conn.execute("BEGIN")
        conn.execute(
            "DELETE FROM checkpoints WHERE job_id NOT IN"
            " (SELECT job_id FROM jobs WHERE seq IS NULL)"
        )
    root = root_of(db)
    if not root.is_dir() or root.is_symlink():
        return 0
    try:
        own_dir(root)
    except CheckpointDirError as e:
        log.error("%s", e)
        return 0
    unfinished = conn.execute("SELECT job_id FROM jobs WHERE seq IS NULL")
    live = {dir_name(job_id) for (job_id,) in unfinished}
    removed = 0
    for entry in root.iterdir():
        if entry.name not in live:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed += 1
    return removed
