"""Where sandboxes keep their files on the host, and the cleanup after a server that died.

``runtime_root()`` (``/tmp/raas-<uid>``) is shared by every process of the user; a library user
who creates sandboxes directly keeps them there. A server claims a directory of its own under it
with ``claim_runtime_dir(key)``, keyed by what a restarted server knows again (raas passes a hash
of its database path), and passes ``runtime.path`` as its sandbox config's ``runtime_dir``. The
claim holds a lock (``flock``) for the process's life. Each sandbox records the PID and start
time of the process it launched; a claim that finds entries left by a dead predecessor kills
what they recorded (when the PID still names that very process) and removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from raas.sandbox import cgroups, procs

LAUNCH_RECORD = "launched.json"
# How long killing one dead predecessor's sandbox may take (it is SIGKILL: moments).
KILL_WAIT_S = 10.0

log = logging.getLogger(__name__)


def runtime_root() -> Path:
    """Where sandboxes keep their sockets: short paths (a Unix socket path has ~100 bytes)."""
    root = Path(os.environ.get("RAAS_SANDBOX_DIR") or tempfile.gettempdir()) / f"raas-{os.getuid()}"
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def record_launch(sandbox_dir: Path, pid: int) -> None:
    """Note in ``sandbox_dir`` which process its sandbox is, for a successor to kill."""
    record = {"pid": pid, "start": procs.start_time(pid), "boot": _boot_id()}
    (sandbox_dir / LAUNCH_RECORD).write_text(json.dumps(record))


def _recorded(sandbox_dir: Path) -> tuple[int, int] | None:
    """The recorded (pid, start time), if the record is readable and from this boot."""
    try:
        record = json.loads((sandbox_dir / LAUNCH_RECORD).read_text())
        pid, start, boot = int(record["pid"]), int(record["start"]), str(record["boot"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (pid, start) if boot == _boot_id() else None


def kill_recorded(sandbox_dir: Path, timeout_s: float = KILL_WAIT_S) -> bool:
    """Kill the process ``sandbox_dir`` recorded and everything under it, if it is still that
    process (same PID and start time); True if it was.
    """
    recorded = _recorded(sandbox_dir)
    if recorded is None:
        return False
    pid, start = recorded

    def same() -> bool:
        return procs.start_time(pid) == start and procs.alive(pid)

    if not same():
        return False
    deadline = time.monotonic() + timeout_s
    # Its descendants first: once it is gone they would be reparented and not found again.
    while same() and time.monotonic() < deadline:
        members = {p for p in procs.descendants(pid) if procs.alive(p)}
        if not members:
            break
        procs.kill(members)
        procs.wait_gone(members, max(deadline - time.monotonic(), 0.0))
    if same():
        procs.kill({pid})
        procs.wait_gone({pid}, max(deadline - time.monotonic(), 0.0))
    log.warning("killed process %d (and its descendants) of sandbox %s", pid, sandbox_dir)
    return True


def clean(directory: Path) -> None:
    """Kill the recorded processes of every entry of ``directory`` and remove the entries, and
    its sandboxes' cgroups.
    """
    with contextlib.suppress(FileNotFoundError):
        for entry in list(directory.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                kill_recorded(entry)
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
    cgroups.remove_all(directory)


def _lock(path: Path) -> int | None:
    """An open fd holding an exclusive flock on ``path``, or None if another process holds it.

    Retries when the file was replaced (unlinked by its releaser) between open and lock, so a
    lock is only ever held on the file that is at ``path``.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@dataclass
class RuntimeDir:
    """A server's own directory for its sandboxes, held (locked) until ``release``."""

    path: Path
    fallback: bool
    _lock_path: Path = field(repr=False)
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        """Kill what is left of its sandboxes, remove the directory and give up the lock."""
        if self._fd is None:
            return
        clean(self.path)
        with contextlib.suppress(OSError):
            self.path.rmdir()
        with contextlib.suppress(FileNotFoundError):
            self._lock_path.unlink()  # before unlocking: see _lock
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RuntimeDir:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _take(path: Path, fd: int, fallback: bool) -> RuntimeDir:
    clean(path)  # what a dead holder left
    path.mkdir(mode=0o711, exist_ok=True)
    return RuntimeDir(path, fallback, path.with_name(path.name + ".lock"), fd)


def runtime_dir_of(key: str) -> Path:
    """The directory ``claim_runtime_dir(key)`` claims (unless a live process holds it)."""
    return runtime_root() / ("srv-" + hashlib.sha256(key.encode()).hexdigest()[:12])


def claim_runtime_dir(key: str) -> RuntimeDir:
    """This server's sandbox directory, ``<runtime_root>/srv-<hash of key>``. If a live process
    holds it, a fresh directory of this process's own (logged). First, what every dead server
    left (a predecessor with the same key, or any other) is killed and removed.
    """
    root = runtime_root()
    name = runtime_dir_of(key).name
    # Every dead server's directory, this key's fallbacks and other keys' among them: a server
    # killed on a database no server opens again (a test's, a temporary run's) would otherwise
    # leave its directory, and any sandbox it had, for ever. A live server's is locked: skipped.
    _release_dead(root)
    path = root / name
    fd = _lock(path.with_name(name + ".lock"))
    if fd is not None:
        return _take(path, fd, fallback=False)
    while True:
        path = root / f"{name}-{secrets.token_hex(4)}"
        lock_path = path.with_name(path.name + ".lock")
        if lock_path.exists():
            continue
        fd = _lock(lock_path)
        if fd is not None:
            break
    log.warning("sandbox directory %s is held by another live process: using %s", root / name, path)
    return _take(path, fd, fallback=True)


def _release_dead(root: Path) -> None:
    for lock_path in sorted(root.glob("srv-*.lock")):
        fd = _lock(lock_path)
        if fd is not None:  # its holder is gone
            left = lock_path.with_name(lock_path.name.removesuffix(".lock"))
            RuntimeDir(left, True, lock_path, fd).release()
