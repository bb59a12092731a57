"""Caps on a sandbox as a whole (memory, processes, CPU) through a cgroup of its own.

Each sandbox gets one cgroup, ``raas-<hash of its runtime directory>/<sandbox id>`` below the
server's own cgroup, so two servers never share a parent and a server restarted on the same
runtime directory finds (and removes) what its dead predecessor left. A sandbox's first process
(bwrap, or what starts apptainer) is moved in before it runs anything, through the gate of
``raas.sandbox.namespaced``; a zygote's fork moves itself in on v1 (``open_self_joins``).

Where: cgroup v1 (a ``memory``, ``pids`` and ``cpu`` hierarchy raas can write, as root in a
container that mounts them), or cgroup v2 where raas's own cgroup can enable ``memory`` and
``pids`` for its children (a delegated subtree whose processes live in a leaf; ``cpu`` too where
it is delegated, else no CPU cap). Where neither can be written, there is no cap on the sandbox
as a whole, said once in the log: the per-process limits of the action server (RLIMIT_AS,
RLIMIT_NPROC) still hold.

Tested for real on v1 only. The machine raas is developed on mounts v1 ``memory``, ``pids`` and
``cpu`` hierarchies and a v2 one with no controllers; a controller is in one hierarchy at a time
for the whole kernel (a private mount namespace sees the same v2 hierarchy), and moving
``memory`` or ``pids`` to v2 would need the v1 hierarchies emptied and unmounted machine-wide.
So the v2 branch (``_v2``, ``memory.max``, ``pids.max``, ``cpu.max``) follows the kernel's
cgroup-v2 documentation and has not run against a kernel.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
EMPTY_WAIT_S = 5.0
PARENT_TRIES = 8


@dataclass(frozen=True)
class Caps:
    """What a sandbox's cgroup holds it to (None: no cap)."""

    memory_bytes: int | None
    tasks: int | None
    cpus: float | None


@dataclass(frozen=True)
class Hierarchy:
    """Where raas makes its cgroups: v2's one directory, or v1's one a controller."""

    version: int
    bases: dict[str, Path]  # controller (v2: "unified") -> raas's own cgroup in its hierarchy


def _own_paths() -> dict[str, str]:
    """Controller -> this process's cgroup path, from /proc/self/cgroup (v2: key "")."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _probe(base: Path) -> bool:
    """Whether raas can make (and remove) a cgroup under ``base``."""
    probe = base / f"raas-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def _v1() -> Hierarchy | None:
    own = _own_paths()
    bases = {}
    for controller in CONTROLLERS:
        if controller not in own:
            return None
        base = ROOT / controller / own[controller].lstrip("/")
        if not base.is_dir() or not _probe(base):
            return None
        bases[controller] = base
    return Hierarchy(1, bases)


def _v2() -> Hierarchy | None:
    own = _own_paths()
    if "" not in own or not (ROOT / "cgroup.controllers").exists():
        return None
    base = ROOT / own[""].lstrip("/")
    try:
        if not _enable_v2(base) >= {"memory", "pids"} or not _probe(base):
            return None
    except OSError:  # EBUSY: raas's cgroup holds processes itself
        return None
    return Hierarchy(2, {"unified": base})


def _enable_v2(cgroup: Path) -> set[str]:
    """Enable for the children of v2 ``cgroup`` what raas caps that it has (``cpu`` may not be
    delegated: asking for a controller a cgroup lacks fails the whole write); what is enabled.
    """
    available = set((cgroup / "cgroup.controllers").read_text().split())
    enabled = set((cgroup / "cgroup.subtree_control").read_text().split())
    wanted = [c for c in CONTROLLERS if c in available and c not in enabled]
    if wanted:
        _write(cgroup / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
    return set((cgroup / "cgroup.subtree_control").read_text().split())


_finding = threading.Lock()


def hierarchy() -> Hierarchy | None:
    """Where sandboxes' cgroups go, or None (said once in the log) where none can be made."""
    with _finding:  # sandboxes start from several threads at once: one looks, once
        return _hierarchy()


@functools.cache
def _hierarchy() -> Hierarchy | None:
    found = _v2() or _v1()
    if found is None:
        log.warning(
            "no writable cgroup (v2 delegated subtree, or v1 memory, pids and cpu): sandboxes"
            " have no cap on memory, processes or CPU as a whole, only per process (rlimits)"
        )
    return found


def parent_name(runtime_dir: Path) -> str:
    """The cgroup that holds the sandboxes of ``runtime_dir``."""
    return "raas-" + hashlib.sha256(str(runtime_dir).encode()).hexdigest()[:12]


PARENT_NAME = re.compile(r"raas-[0-9a-f]{12}")  # parent_name's (not a probe's: raas-probe-PID)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@dataclass
class SandboxCgroup:
    """One sandbox's cgroup: a directory in each hierarchy."""

    version: int
    dirs: dict[str, Path]

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def join(self, pid: int) -> None:
        for procs in self.procs_files():
            _write(procs, str(pid))

    def open_self_joins(self) -> list[int]:
        """v1: each hierarchy's ``tasks`` file, open for writing, for a single-threaded process
        to move itself into by writing ``0`` (the kernel's check is on who opened it). That
        move takes no global lock; ``join``'s, of a process by PID, waits out an RCU grace
        period (milliseconds). v2 moves only whole processes, always under that lock: none."""
        if self.version != 1:
            return []
        fds: list[int] = []
        try:
            for d in self.dirs.values():
                fds.append(os.open(d / "tasks", os.O_WRONLY | os.O_CLOEXEC))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files():
            with contextlib.suppress(OSError):
                found |= {int(p) for p in procs.read_text().split()}
        return found

    def remove(self) -> bool:
        """Kill what is left in it and remove it; True if it is gone."""
        deadline = time.monotonic() + EMPTY_WAIT_S
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        gone = True
        for d in self.dirs.values():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.error("cannot remove the sandbox cgroup %s: %s", d, e)
                gone = False
        return gone


def create(runtime_dir: Path, sandbox_id: str, caps: Caps) -> SandboxCgroup | None:
    """A cgroup for sandbox ``sandbox_id`` of ``runtime_dir`` holding it to ``caps``; None where
    there is no writable hierarchy. Blocking (file writes): run it in a thread.
    """
    found = hierarchy()
    if found is None:
        return None
    group = SandboxCgroup(found.version, {})
    try:
        for controller, base in found.bases.items():
            group.dirs[controller] = _make_child(base / parent_name(runtime_dir), sandbox_id, found)
        _set_caps(group, caps)
    except OSError:
        group.remove()
        raise
    return group


def _make_child(parent: Path, name: str, found: Hierarchy) -> Path:
    """``parent/name``, made with its parent where that is missing. A parent may be removed
    between the two (``sweep_parents`` takes every empty one, whoever's): it is made again."""
    for _ in range(PARENT_TRIES):
        try:
            parent.mkdir(exist_ok=True)
            if found.version == 2:
                _enable_v2(parent)
            (parent / name).mkdir()
            return parent / name
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"the cgroup {parent} was removed {PARENT_TRIES} times while in use")


def sweep_parents() -> int:
    """Remove every empty sandbox parent cgroup of raas's own cgroup; how many went.

    A parent (``raas-<hash>``) outlives its last sandbox: a server removes its own when it lets
    its runtime directory go, but one of a directory that nobody claimed (a library's temporary
    runtime root, a test's) stays for good. An empty one holds nothing: the kernel refuses to
    remove one with a sandbox in it, and one removed while a sandbox is being made in it is made
    again (``_make_child``). Blocking."""
    found = hierarchy()
    if found is None:
        return 0
    gone = 0
    for base in found.bases.values():
        with contextlib.suppress(OSError):
            for parent in base.iterdir():
                if PARENT_NAME.fullmatch(parent.name) and parent.is_dir():
                    with contextlib.suppress(OSError):  # EBUSY: it holds a sandbox
                        parent.rmdir()
                        gone += 1
    return gone


def _set_caps(group: SandboxCgroup, caps: Caps) -> None:
    if group.version == 2:
        d = group.dirs["unified"]
        if caps.memory_bytes:
            _write(d / "memory.max", str(caps.memory_bytes))
            with contextlib.suppress(FileNotFoundError):
                _write(d / "memory.swap.max", "0")
        if caps.tasks:
            _write(d / "pids.max", str(caps.tasks))
        if caps.cpus and (d / "cpu.max").exists():
            _write(d / "cpu.max", f"{int(caps.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        return
    if caps.memory_bytes:
        memory = group.dirs["memory"]
        _write(memory / "memory.limit_in_bytes", str(caps.memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # with swap accounting: no swap past it
            _write(memory / "memory.memsw.limit_in_bytes", str(caps.memory_bytes))
    if caps.tasks:
        _write(group.dirs["pids"] / "pids.max", str(caps.tasks))
    if caps.cpus:
        cpu = group.dirs["cpu"]
        _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(int(caps.cpus * CPU_PERIOD_US)))


def remove_all(runtime_dir: Path) -> None:
    """Kill and remove every sandbox cgroup of ``runtime_dir`` (a dead server's leftovers)."""
    found = hierarchy() if _exists_any(runtime_dir) else None
    if found is None:
        return
    name = parent_name(runtime_dir)
    parents = {c: base / name for c, base in found.bases.items()}
    ids = {d.name for p in parents.values() if p.is_dir() for d in p.iterdir() if d.is_dir()}
    for sandbox_id in ids:
        SandboxCgroup(found.version, {c: p / sandbox_id for c, p in parents.items()}).remove()
    for parent in parents.values():
        with contextlib.suppress(OSError):
            parent.rmdir()


def _exists_any(runtime_dir: Path) -> bool:
    """Whether a parent cgroup of ``runtime_dir`` may exist (cheap: no probe of hierarchies)."""
    name = parent_name(runtime_dir)
    own = _own_paths()
    candidates = [ROOT / own.get("", "/").lstrip("/") / name]
    candidates += [ROOT / c / own.get(c, "/").lstrip("/") / name for c in CONTROLLERS]
    return any(p.is_dir() for p in candidates)
