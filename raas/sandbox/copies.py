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

A copy is bound only once verified (``verify``, at each sandbox start): this process keeps in
memory, never only on disk, the digest of each copy's content (every file's bytes, mode and
name, every link's target), taken when it made the copy (``remember``) or, for one another
process made, computed from the sources and compared with the copy's own (``adopt``). At each
bind every entry of the copy is looked at (``lstat``): all ours, none writable by others, none
set-uid; where any changed since (its inode, size, times), the content is hashed again and a
copy that no longer holds what was staged is refused (``StagedCopyError``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from raas.sandbox.client import SandboxError

MANIFEST = ".raas-copy.json"
PREFIX = "py-"
STAGING_PREFIX = ".staging-"

log = logging.getLogger(__name__)

# Copies this process holds: path -> the fd that holds its shared lock (kept open for the
# process's life; closing it gives the lock up).
_held: dict[str, int] = {}
# What a copy is: one entry of its content, (kind, mode, the file's sha256 or the link's target)
# by its path in the copy ("a/b"), as ``digest`` reads them.
Entry = tuple[str, int, str]


class StagedCopyError(SandboxError):
    """A staged copy raas will not bind: it is not what was staged, or others could change it."""


@dataclass
class _Verified:
    """A copy this process verified: which directory it is, its content's digest, and the
    digest of its entries' inodes, sizes and times (``_signature``) when last verified."""

    dev: int
    ino: int
    digest: str
    signature: str


_verified: dict[str, _Verified] = {}


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
    (staging / MANIFEST).chmod(0o644)


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
            fd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a remover holds it
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise StagedCopyError(f"staged copy {copy} cannot be held ({e.strerror}): remove it") from e
    if not _same(copy, fd):
        os.close(fd)
        return False
    _held[str(copy)] = fd
    return True


def _same(copy: Path, fd: int) -> bool:
    """Whether ``fd`` is the directory at ``copy`` now (not one removed since)."""
    try:
        return os.fstat(fd).st_nlink > 0 and os.lstat(copy).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def file_sha256(path: Path | str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest(entries: dict[str, Entry]) -> str:
    """The digest of a copy's content (``Entry`` by path)."""
    h = hashlib.sha256()
    for path, (kind, mode, content) in sorted(entries.items()):
        h.update(f"{path}\0{kind}\0{mode:o}\0{content}\n".encode())
    return h.hexdigest()


def _walk(copy: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry of ``copy`` (itself first, as "."), links not followed; a StagedCopyError
    at the first that is not ours, is writable by others, is set-uid or set-gid, or is not a
    directory, file or link (where a host could have put it, no one else may change it)."""
    # Plain strings and scandir, not pathlib: this runs over every entry at each sandbox start.
    uid = os.geteuid()
    top = os.lstat(copy)
    if not stat.S_ISDIR(top.st_mode):
        _refuse(copy, ".", "is not a directory (a link?)")
    _check(copy, ".", top, uid)
    yield ".", top
    todo = [(str(copy), "")]
    while todo:
        path, rel = todo.pop()
        with os.scandir(path) as found:
            entries = sorted(found, key=lambda e: e.name)
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            _check(copy, name, st, uid)
            yield name, st
            if stat.S_ISDIR(st.st_mode):
                todo.append((entry.path, name))


def _check(copy: Path, rel: str, st: os.stat_result, uid: int) -> None:
    kind = stat.S_IFMT(st.st_mode)
    if st.st_uid != uid:
        _refuse(copy, rel, f"is owned by uid {st.st_uid}, not you")
    if kind == stat.S_IFLNK:
        return
    if kind not in (stat.S_IFDIR, stat.S_IFREG):
        _refuse(copy, rel, "is not a file or a directory")
    if st.st_mode & 0o022:
        _refuse(copy, rel, f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})")
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        _refuse(copy, rel, "is set-uid or set-gid")


def _refuse(copy: Path, rel: str, problem: str) -> NoReturn:
    raise StagedCopyError(f"staged copy {copy}: {rel} {problem}: not bound; remove {copy}")


def _signature(copy: Path) -> str:
    lines = [
        f"{rel}\0{st.st_ino} {st.st_mode} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n"
        for rel, st in _walk(copy)
    ]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _content(copy: Path) -> dict[str, Entry]:
    """What ``copy`` holds, as ``digest`` reads it (its manifest left out: its key may differ
    between two sets of the same files, and it says nothing that is bound)."""
    entries: dict[str, Entry] = {}
    for rel, st in _walk(copy):
        if rel in (".", MANIFEST):
            continue
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            entries[rel] = ("l", 0, os.readlink(copy / rel))
        elif stat.S_ISDIR(st.st_mode):
            entries[rel] = ("d", mode, "")
        else:
            entries[rel] = ("f", mode, file_sha256(copy / rel))
    return entries


def _record(copy: Path, content_digest: str, signature: str) -> None:
    st = os.lstat(copy)
    _verified[str(copy)] = _Verified(st.st_dev, st.st_ino, content_digest, signature)


def remember(copy: Path) -> None:
    """Take the digest of ``copy``, which this process has just made (and holds)."""
    signature = _signature(copy)
    _record(copy, digest(_content(copy)), signature)


def adopt(copy: Path, expected: dict[str, Entry]) -> None:
    """Verify ``copy``, which another process made, against what staging its sources gives
    (``expected``), and remember it; a StagedCopyError naming the first difference if not."""
    signature = _signature(copy)
    found = _content(copy)
    if found != expected:
        differs = sorted(set(found.items()) ^ set(expected.items()))[0][0]
        raise StagedCopyError(
            f"staged copy {copy} does not hold what its sources do ({differs} differs): not"
            f" bound; remove {copy}, and raas stages it again"
        )
    _record(copy, digest(found), signature)


def current(copy: Path) -> bool:
    """Whether ``copy`` is one this process verified, and still the same directory (cheap:
    ``verify`` looks at its files when it is bound)."""
    record = _verified.get(str(copy))
    try:
        st = os.lstat(copy)
    except OSError:
        return False
    return record is not None and (st.st_dev, st.st_ino) == (record.dev, record.ino)


def verify(copy: Path) -> None:
    """Before ``copy`` is bound: it is the copy this process verified, in a runtime root no one
    else may write in, and every entry of it is still ours, writable by no one else and, if
    anything of it changed since, holds the same content; else a StagedCopyError."""
    from raas.sandbox.runtime import check_root

    check_root(copy.parent)
    record = _verified.get(str(copy))
    if record is None:
        raise StagedCopyError(f"{copy} was not staged by this process: not bound")
    if not current(copy):
        raise StagedCopyError(
            f"staged copy {copy} was removed or replaced since it was staged: not bound"
        )
    signature = _signature(copy)
    if signature == record.signature:
        return
    if digest(_content(copy)) != record.digest:
        raise StagedCopyError(
            f"staged copy {copy} changed since it was staged (its files are not what was"
            f" copied): not bound; remove {copy}, and raas stages it again"
        )
    record.signature = signature  # touched, not changed


def verify_binds(hosts: Iterable[str], root: Path) -> None:
    """``verify`` each copy that one of ``hosts`` (host paths to bind) lies in; one under
    ``root`` (the runtime root) in a ``py-`` directory this process did not verify is refused."""
    checked: set[Path] = set()
    for host in hosts:
        path = Path(host)
        copy = next((Path(c) for c in _verified if path.is_relative_to(c)), None)
        if copy is None and path.is_relative_to(root) and path != root:
            first = root / path.relative_to(root).parts[0]
            copy = first if first.name.startswith(PREFIX) else None
        if copy is not None and copy not in checked:
            verify(copy)
            checked.add(copy)


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
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
