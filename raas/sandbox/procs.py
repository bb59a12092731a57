"""Finding and killing a sandbox's processes on the host, by PID namespace or by ancestry.

Never by name: only processes that provably belong to one sandbox are touched. A process named
by a file (a dead server's launch record) is killed only once ``sandbox_process`` proves it that
sandbox's, through a pidfd (``open_pidfd``) that keeps its PID from naming another meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from pathlib import Path

PROC = Path("/proc")
# These run on every sandbox's start and close, over every process of the host: plain os calls
# on string paths, not pathlib (a scan of a few hundred processes took 5 ms with it).


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()


def pid_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot: with the PID, it names one process."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def pin_namespace(ns: int, near: int) -> int | None:
    """An open file descriptor on PID namespace ``ns``, found on ``near`` or a descendant of it;
    None if no such process is left.

    A namespace is known by its inode number, and the kernel gives a freed number to the next
    namespace made, often at once: a sandbox that went on killing "everything in namespace N"
    after its own namespace died killed a sandbox just started in the next one (its start failed
    with SIGKILL and no error output). While this descriptor is open the namespace, and its
    number, stay taken.
    """
    for pid in [near, *subtree(near)]:
        if pid_namespace(pid) != ns:
            continue
        try:
            fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if os.fstat(fd).st_ino == ns:
            return fd
        os.close(fd)
    return None


def init_of(ns: int, near: int) -> int | None:
    """The init of PID namespace ``ns``: the first process in it at or below ``near``."""
    return next((pid for pid in [near, *subtree(near)] if pid_namespace(pid) == ns), None)


def children_of(pid: int) -> list[int]:
    """``pid``'s children: from the kernel's list of each of its threads' children (a read of
    a few files, not a scan of every process, which a start and a close of a sandbox paid
    several times); a scan where the kernel keeps no such list (CONFIG_PROC_CHILDREN)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                found += [int(child) for child in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}"):
                return []
            return [p for p in _pids() if parent_of(p) == pid]  # no lists in this kernel
        except OSError:
            continue
    return found


def subtree(root: int) -> list[int]:
    """``root``'s descendants, parents before their children (``children_of``, level by level)."""
    found: list[int] = []
    level = children_of(root)
    while level:
        found += level
        level = [child for pid in level for child in children_of(pid)]
    return found


def command_line(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def in_namespace(ns: int) -> set[int]:
    """Host PIDs of every process in the PID namespace ``ns``."""
    return {p for p in _pids() if pid_namespace(p) == ns}


def descendants(root: int) -> set[int]:
    parents = {p: parent_of(p) for p in _pids()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def ns_pids(pid: int) -> list[int]:
    """What host PID ``pid`` is in each PID namespace it is in, outermost first (/proc's
    NSpid); empty if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return [int(n) for n in line.split()[1:]]
    except (OSError, ValueError):
        return []
    return []


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def open_pidfd(pid: int) -> int | None:
    """A pidfd on ``pid`` (it names that process, never a later one with its PID), or None if
    it is gone. Where the kernel has none (before 5.3): -1, and a signal goes by PID."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM):
            return -1
        return None


def signal_pidfd(fd: int, pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process of ``fd`` (``open_pidfd``); by PID where ``fd`` is -1."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if fd < 0:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)


def sandbox_process(pid: int, start: int, directory: Path, cgroup: str) -> str | None:
    """None if ``pid`` provably is the process raas launched for the sandbox whose directory is
    ``directory``, else why not. It must have started at ``start`` (with the PID, that names one
    process of this boot), be ours (for root, any uid: its sandboxes run as others), and show
    what only raas's launch gives it: its working directory is ``directory`` (a launch starts
    there), a mount of its own namespace lies in it (an image's root, apptainer's tmpfs), its
    cgroup is the sandbox's (``cgroup``: the path's end), or an argument names a file in it
    (apptainer's). Anyone can write a PID and read a start time; none of these."""
    started = start_time(pid)
    if started is None:
        return "it is gone"
    if started != start:
        return f"it started at {started}, not at {start} as recorded: another process"
    uid = uid_of(pid)
    if uid is None:
        return "it is gone"
    if uid != os.geteuid() and os.geteuid() != 0:
        return f"it is uid {uid}'s, not yours"
    if _same_file(f"/proc/{pid}/cwd", directory):
        return None
    inside = os.path.realpath(directory) + "/"
    if not _same_file(f"/proc/{pid}/ns/mnt", Path("/proc/self/ns/mnt")) and any(
        m.startswith(inside) for m in _mount_points(pid)
    ):
        return None
    if cgroup and any(line.endswith(cgroup) for line in _read(pid, "cgroup").splitlines()):
        return None
    if any(inside in arg for arg in _read(pid, "cmdline").split("\0")):
        return None
    return "nothing of it is that sandbox's (its directory, mounts, cgroup, arguments)"


def _same_file(a: str, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _read(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _mount_points(pid: int) -> list[str]:
    """The mount points of ``pid``'s mount namespace (mountinfo's 5th field, unescaped)."""
    points = []
    for line in _read(pid, "mountinfo").splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
    return points


def kill_under(root: int, members: set[int]) -> set[int]:
    """SIGKILL those of ``members`` (descendants of ``root``) still under ``root``: each pinned
    by a pidfd, its parent checked while all are pinned, then killed through it, so that no PID
    freed and taken again meanwhile is killed. Returns those killed."""
    pinned: dict[int, int] = {}
    try:
        for pid in members:
            fd = open_pidfd(pid)
            if fd is not None:
                pinned[pid] = fd
        tree = {root, *pinned}
        ours = [pid for pid in pinned if parent_of(pid) in tree]
        for pid in ours:
            signal_pidfd(pinned[pid], pid)
        return set(ours)
    finally:
        for fd in pinned.values():
            if fd >= 0:
                os.close(fd)


def kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z"


def empty_namespace(ns: int, timeout_s: float) -> set[int]:
    """SIGKILL everything in PID namespace ``ns`` until nothing in it is alive (or the timeout).

    Returns the survivors. Looping matters: a fork bomb may fork between listing and killing.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        members = {p for p in in_namespace(ns) if alive(p)}
        if not members or time.monotonic() >= deadline:
            return members
        kill(members)
        wait_gone(members, max(deadline - time.monotonic(), 0.0))


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """Block until none of ``pids`` is alive, or the timeout; returns the survivors."""
    deadline = time.monotonic() + timeout_s
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.002)
        left = {p for p in left if alive(p)}
    return left
