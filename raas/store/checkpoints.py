"""The store's side of durable turn boundaries (raas.agent.checkpoints): a job's rows in the
``checkpoints`` table and its archives in a directory of its own, beside the database.

The directory (``DB.checkpoints/``, one directory a job named by a hash of its key) is made
0700 and checked at every use to be a directory of raas's own user that no one else can write
(a database may lie on a shared disk): raas reads back, and unpacks into sandboxes, only what
it wrote there. What is removed is removed by the file descriptors of directories so checked,
never through a link, and only in them: never what another user put where raas would look.

The rows are the store's: a row is added only for a job still in flight, the rows after the turn
a new row goes on from are removed with it (another run's), and every row of a job goes in the
transaction that writes its result; the job's directory goes after it. At each open, the
directories and rows of jobs no longer in flight are removed (a crash between a result and its
directory's removal).

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


# A directory opened so never goes through a link (ELOOP), whatever it points to.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _is_own(st: os.stat_result) -> bool:
    """A directory of this user that no one else can write (so nothing in it is another's)."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_own(path: Path, parent: int | None = None) -> int:
    """An fd of the directory ``path`` (its name in the directory ``parent``, where one is
    given), opened without following a link and checked to be raas's own: FileNotFoundError
    where there is none, CheckpointDirError where it is not raas's own. The check is of what was
    opened, so nothing can be swapped in between."""
    try:
        fd = os.open(path.name if parent is not None else path, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError:  # a link, not a directory, or one this user cannot read (someone else's)
        raise _not_own(path) from None
    if not _is_own(os.fstat(fd)):
        os.close(fd)
        raise _not_own(path)
    return fd


def _not_own(path: Path) -> CheckpointDirError:
    return CheckpointDirError(
        f"{path} is not a directory of this user that only it can write: checkpoints are"
        " neither written there nor read back (remove it, or keep the database in a directory"
        " that only this user can write)"
    )


def own_dir(path: Path) -> Path:
    """``path`` as a directory only this user can write, made 0700 if missing; a directory
    that is a link, someone else's or open to others is refused (CheckpointDirError)."""
    try:
        path.mkdir(mode=0o700)  # never through a link: a link there is "exists"
    except FileExistsError:
        pass
    except OSError as e:
        raise CheckpointDirError(f"cannot make {path}: {e}") from None
    try:
        os.close(_open_own(path))
    except FileNotFoundError:  # removed since: by someone else
        raise _not_own(path) from None
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
    no error. Only in directories of raas's own (checked), never through a link, and it never
    raises: the result it follows is written."""
    try:
        root = _open_own(root_of(db))
    except (OSError, CheckpointDirError):  # none, or not raas's: nothing of it is removed
        return
    try:
        if names is None:
            _remove(root, dir_name(job_id))
        else:
            _remove_archives(root, root_of(db) / dir_name(job_id), names)
    finally:
        os.close(root)


def _remove_archives(root: int, folder: Path, names: list[str]) -> None:
    try:
        fd = _open_own(folder, root)
    except (OSError, CheckpointDirError):
        return
    try:
        for name in names:
            if name not in ("", ".", "..") and "/" not in name and "\0" not in name:
                _remove(fd, name)
    finally:
        os.close(fd)


def _remove(parent: int, name: str) -> bool:
    """Remove the entry ``name`` of the directory ``parent`` (raas's own): a file or a link
    itself (never what it points to), or a directory of raas's own with all in it (shutil's
    rmtree by fd never follows a link); someone else's directory is left, and said. Returns
    whether it went."""
    try:
        st = os.lstat(name, dir_fd=parent)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
        elif _is_own(st):
            shutil.rmtree(name, dir_fd=parent)
        else:
            log.warning("left %s in the checkpoints' directory: it is not raas's own", name)
            return False
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning("could not remove %s from the checkpoints' directory: %s", name, e)
        return False
    return True


def tidy(conn: sqlite3.Connection, db: Path) -> int:
    """Remove the rows and directories of jobs no longer in flight, and whatever else lies in
    the checkpoints' directory; returns how many entries went."""
    with conn:
        conn.execute("BEGIN")
        conn.execute(
            "DELETE FROM checkpoints WHERE job_id NOT IN"
            " (SELECT job_id FROM jobs WHERE seq IS NULL)"
        )
    try:
        root = _open_own(root_of(db))
    except FileNotFoundError:
        return 0
    except CheckpointDirError as e:  # its checkpoints are refused too (job_dir): said once here
        log.error("%s", e)
        return 0
    try:
        unfinished = conn.execute("SELECT job_id FROM jobs WHERE seq IS NULL")
        live = {dir_name(job_id) for (job_id,) in unfinished}
        return sum(_remove(root, name) for name in os.listdir(root) if name not in live)
    finally:
        os.close(root)
