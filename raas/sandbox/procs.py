"""Finding and killing a sandbox's processes on the host, by PID namespace or by ancestry.

Never by name: only processes that provably belong to one sandbox are touched.
"""

from __future__ import annotations

import contextlib
import os
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
    for pid in [near, *sorted(descendants(near))]:
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


def children_of(pid: int) -> list[int]:
    return [p for p in _pids() if parent_of(p) == pid]


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
