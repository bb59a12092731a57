"""Staged copies under the runtime root (``py-<digest>``): held while used, removed when not.

``pydeps.staged_binds`` copies host files (an agents' virtualenv is ~730 MB) into
``runtime_root()`` so that a sandbox's unprivileged user can read them. A copy is named by a
digest of what it holds, so a new checkout, a rebuilt venv or an edited agent makes a new one;
without a clean-up the old ones fill the disk (a CI machine that clones afresh each run filled
/tmp with twenty copies of the same venv). So:

- a process holds a shared ``flock`` on each copy it binds, for its whole life (the lock goes
  with the process, also when it is killed);
- each copy records the set of host paths it was made from (``MANIFEST``, its *sources*, and a
  ``key`` naming that set);
- after it makes a new copy, a process removes every other copy that no process holds and that
  either was made from the same sources (an older version of them) or whose sources are gone
  (a deleted clone or venv), and every staging directory whose maker died mid-copy.

A copy still in use is never removed: its holder's lock makes the remover's exclusive
``LOCK_NB`` fail. Removing an unused copy costs, at worst, copying it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from pathlib import Path

MANIFEST = ".raas-copy.json"
PREFIX = "py-"
STAGING_PREFIX = ".staging-"

log = logging.getLogger(__name__)

# Copies this process holds: path -> the fd that holds its shared lock (kept open for the
# process's life; closing it gives the lock up).
_held: dict[str, int] = {}


def lock_staging(staging: Path) -> int:
    """An fd holding an exclusive lock on a staging directory this process just made: a
    remover takes only a staging directory whose maker is gone.
    """
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def write_manifest(staging: Path, key: str, sources: list[str]) -> None:
    """Record in a copy what it was made from (read by ``evict``)."""
    (staging / MANIFEST).write_text(json.dumps({"key": key, "sources": sorted(sources)}))


def hold(copy: Path, fd: int | None = None) -> bool:
    """Hold a shared lock on ``copy`` for this process's life; False if it was removed before
    the lock was taken (make it again). ``fd``: the staging fd of a copy this process has just
    renamed into place, converted from exclusive to shared.
    """
    held = _held.pop(str(copy), None)
    if held is not None:
        if _same(copy, held):
            _held[str(copy)] = held
            if fd is not None:
                os.close(fd)
            return True
        os.close(held)  # removed by hand since (a /tmp clean-up): hold the new one
    try:
        if fd is None:
            fd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a remover holds it
    except FileNotFoundError:
        return False
    if not _same(copy, fd):
        os.close(fd)
        return False
    _held[str(copy)] = fd
    return True


def _same(copy: Path, fd: int) -> bool:
    """Whether ``fd`` is the directory at ``copy`` now (not one removed since)."""
    try:
        return os.fstat(fd).st_nlink > 0 and os.stat(copy).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def evict(root: Path, key: str, keep: Path) -> None:
    """Remove what no process holds under ``root``: older copies of ``key``'s sources, copies
    whose sources are gone (or that record none: made before copies recorded them), and
    staging directories whose maker died. ``keep`` (the copy just made) stays.
    """
    for entry in sorted(root.iterdir()):
        if entry == keep or str(entry) in _held:
            continue
        if entry.name.startswith(STAGING_PREFIX):
            _remove_unheld(entry, "a staging directory its maker left")
        elif entry.name.startswith(PREFIX) and entry.is_dir():
            why = _obsolete(entry, key)
            if why:
                _remove_unheld(entry, why)


def _obsolete(copy: Path, key: str) -> str | None:
    try:
        manifest = json.loads((copy / MANIFEST).read_text())
        copied_from, sources = str(manifest["key"]), [str(s) for s in manifest["sources"]]
    except (OSError, ValueError, KeyError, TypeError):
        return "a copy that does not say what it was made from"
    if copied_from == key:
        return "an older copy of the same files"
    if not all(os.path.exists(source) for source in sources):
        return "a copy of files that are gone"
    return None


def _remove_unheld(entry: Path, why: str) -> None:
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return  # a live process uses it
    try:
        log.info("removing %s: %s", entry, why)
        shutil.rmtree(entry, ignore_errors=True)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
