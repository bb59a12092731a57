"""Where sandboxes keep their files on the host, and the cleanup after a server that died.

``runtime_root()`` (``<base>/raas-<uid>``: ``$RAAS_SANDBOX_DIR``, else ``$XDG_RUNTIME_DIR``
where it is the user's own and 0700 and raas is not root, else the temporary directory) is
shared by every process of the user; a library user who creates sandboxes directly keeps them
there. A server claims a directory of its own under it with ``claim_runtime_dir(key)``, keyed by
what a restarted server knows again (raas passes a hash of its database path), and passes
``runtime.path`` as its sandbox config's ``runtime_dir``. The claim holds a lock (``flock``) for
the process's life. Each sandbox records the PID and start time of the process it launched; a
claim that finds entries left by a dead predecessor kills what they recorded, but only a process
that proves to be that sandbox's (``procs.sandbox_process``): a record is a file, and never
decides by itself which process is killed.

On a shared host the root is what keeps other users out (anyone may make ``/tmp/raas-<uid>``
first): it is checked on every use (``check_root``: a directory, not a link, the user's own,
that no one else may write in or list: 0700, or 0711 for root, whose sandboxes run as other uids
that must reach the copies bound into them), tightened where no one else could have written in
it, and refused in one line naming it otherwise; so is each directory above it (the owner's or
root's; writable by others only with the sticky bit, as ``/tmp``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from raas.paths import host_paths
from raas.sandbox import cgroups, procs
from raas.sandbox.client import SandboxError

LAUNCH_RECORD = "launched.json"
# How long killing one dead predecessor's sandbox may take (it is SIGKILL: moments).
KILL_WAIT_S = 10.0

log = logging.getLogger(__name__)


class RuntimeDirError(SandboxError):
    """A runtime directory raas will not use: someone else could write in it."""


def runtime_root() -> Path:
    """Where sandboxes keep their sockets: short paths (a Unix socket path has ~100 bytes).
    Made, or checked, on every call (``check_root``); a RuntimeDirError where it is unsafe."""
    root = _root_path()
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    check_root(root)
    return root


NAME_KEY = ".name-key"
NAME_KEY_BYTES = 32


def name_key() -> bytes:
    """A secret of raas's user, kept in its runtime root (0600): what names a staged copy mixes
    in, so that the name of a copy (bound into sandboxes, world-readable as it must be where
    each sandbox runs as a uid of its own) cannot be worked out from what anyone may stat of
    its sources. Made once, atomically; every raas process of the user shares it."""
    root = runtime_root()
    key = root / NAME_KEY
    for _ in range(3):
        with contextlib.suppress(FileNotFoundError):
            return _read_key(key)
        made = root / f"{NAME_KEY}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_bytes(NAME_KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs
            os.link(made, key)
        os.unlink(made)
    return _read_key(key)


def _read_key(key: Path) -> bytes:
    fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise RuntimeDirError(
                f"{key} is not raas's own secret (uid {st.st_uid}, {_mode(st)}): remove it"
            )
        data = os.read(fd, NAME_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != NAME_KEY_BYTES:
        raise RuntimeDirError(f"{key} holds {len(data)} bytes, not {NAME_KEY_BYTES}: remove it")
    return data


def _root_path() -> Path:
    return _base() / f"raas-{os.getuid()}"


def _root_mode() -> int:
    # As root, each sandbox runs as a uid of its own, which must pass through to reach the
    # copies bound into it (``pydeps.stage_copy``): others may enter, never list or write.
    return 0o711 if os.geteuid() == 0 else 0o700


def _base() -> Path:
    """The directory the root is made in: ``$RAAS_SANDBOX_DIR``, else ``$XDG_RUNTIME_DIR`` (not
    as root: it is 0700, and the sandboxes' uids must pass through), else the temporary one."""
    chosen = host_paths().sandbox_dir
    if chosen:
        base = Path(chosen)
        base.mkdir(parents=True, exist_ok=True)
    else:
        base = _xdg_runtime_dir() or Path(tempfile.gettempdir())
    base = Path(os.path.realpath(base))
    _check_above(base)
    return base


def _xdg_runtime_dir() -> Path | None:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if not xdg or not os.path.isabs(xdg) or os.geteuid() == 0:
        return None
    try:
        st = os.stat(xdg)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return Path(xdg)
    _warn_once(f"XDG_RUNTIME_DIR {xdg} is not a 0700 directory of yours: not used")
    return None


@functools.cache
def _warn_once(message: str) -> None:
    log.warning("%s", message)


def _check_above(base: Path) -> None:
    """Every directory from / down to ``base``: root's or ours, and writable by no one else but
    with the sticky bit (``/tmp``); else whoever may write there could replace the root."""
    for directory in [*reversed(base.parents), base]:
        st = os.lstat(directory)
        if st.st_uid not in (0, os.geteuid()):
            problem = f"is owned by uid {st.st_uid}, who could replace what raas keeps in it"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problem = f"is writable by others (mode {_mode(st)}, no sticky bit)"
        else:
            continue
        raise RuntimeDirError(
            f"the runtime directory's parent {directory} {problem}: set RAAS_SANDBOX_DIR to a"
            " directory of your own"
        )


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def check_root(root: Path) -> None:
    """``root`` (the runtime root) is a directory, not a link, ours, and no one else may write
    in or list it; one with no write bit for others is tightened (no one else can have put
    anything in it), any other is refused: a RuntimeDirError naming it and what to do."""
    wanted = _root_mode()
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if os.path.islink(root):
            problem = f"is a symbolic link (to {os.readlink(root)})"
        elif os.path.lexists(root):
            problem = f"is not a directory ({e.strerror})"
        else:
            problem = f"cannot be opened ({e.strerror})"
        raise RuntimeDirError(
            f"the runtime directory {root} {problem}: remove it, or set RAAS_SANDBOX_DIR to a"
            " directory of your own"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            problem = f"is owned by uid {st.st_uid}, not you (uid {os.geteuid()})"
        elif st.st_mode & 0o022:
            # Others could write in it: what is there may be theirs (a staged copy, a record).
            problem = f"is writable by others (mode {_mode(st)})"
        else:
            if stat.S_IMODE(st.st_mode) != wanted:
                os.fchmod(fd, wanted)
            return
    finally:
        os.close(fd)
    raise RuntimeDirError(
        f"the runtime directory {root} {problem}: remove it (what is in it may be another"
        " user's), or set RAAS_SANDBOX_DIR to a directory of your own"
    )


def check_runtime_dir(directory: Path) -> None:
    """A sandboxes' runtime directory (a sandbox's ``dir.parent``), checked at each start: the
    root (``check_root``) or a directory below it, each directory from the root down ours, not
    a link and writable by no one else; or a config's own directory elsewhere, so and in safe
    directories (``_check_above``). A RuntimeDirError naming the first that is not."""
    root = _root_path()
    if directory.is_relative_to(root):
        runtime_root()
        below = directory.relative_to(root).parts
        path = root
        for part in below:
            path = path / part
            _check_own(path)
    else:
        _check_own(directory)
        _check_above(Path(os.path.realpath(directory.parent)))


def _check_own(directory: Path) -> None:
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a link?)"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not you (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by others (mode {_mode(st)})"
    else:
        return
    raise RuntimeDirError(f"the sandboxes' runtime directory {directory} {problem}: remove it")


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
    process and provably that sandbox's (``procs.sandbox_process``: a record is a file, which
    anyone who could write there could have made); True if it was. A record naming another
    process is ignored, and said in the log.
    """
    recorded = _recorded(sandbox_dir)
    if recorded is None:
        return False
    pid, start = recorded
    pidfd = procs.open_pidfd(pid)  # from here on, ``pid`` names this process or none
    if pidfd is None:
        return False
    try:
        cgroup = f"/{cgroups.parent_name(sandbox_dir.parent)}/{sandbox_dir.name}"
        why_not = procs.sandbox_process(pid, start, sandbox_dir, cgroup)
        if why_not is not None:
            if why_not != "it is gone":
                log.warning(
                    "the launch record of %s names process %d, not killed: %s",
                    sandbox_dir,
                    pid,
                    why_not,
                )
            return False
        _kill_tree(pid, start, pidfd, timeout_s)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    log.warning("killed process %d (and its descendants) of sandbox %s", pid, sandbox_dir)
    return True


def _kill_tree(pid: int, start: int, pidfd: int, timeout_s: float) -> None:
    def same() -> bool:
        return procs.start_time(pid) == start and procs.alive(pid)

    deadline = time.monotonic() + timeout_s
    # Its descendants first: once it is gone they would be reparented and not found again.
    while same() and time.monotonic() < deadline:
        members = {p for p in procs.descendants(pid) if procs.alive(p)}
        if not members:
            break
        killed = procs.kill_under(pid, members)
        if not killed:
            break
        procs.wait_gone(killed, max(deadline - time.monotonic(), 0.0))
    if same():
        procs.signal_pidfd(pidfd, pid)
        procs.wait_gone({pid}, max(deadline - time.monotonic(), 0.0))


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
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
    try:
        clean(path)  # what a dead holder left
        path.mkdir(mode=0o711, exist_ok=True)
        _check_own(path)
    except BaseException:
        os.close(fd)
        raise
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
    cgroups.sweep_parents()  # and the empty parents of directories nobody claimed
