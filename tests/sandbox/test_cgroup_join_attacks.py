"""Attacks on how a zygote's fork comes into its cgroup (raas.sandbox.zygote, cgroups.py): on
cgroup v1 raas (root) opens each hierarchy's ``tasks`` file of the sandbox's cgroup, the zygote
passes those fds to the fork, which writes ``0`` to each before anything else; the fork sets up
before raas lets it go (a byte on a pipe), and raas holds it by a pidfd opened meanwhile.

An open ``tasks`` fd moves any process its holder can name (the kernel checks the opener, root),
so none may outlive the fork's move, not in the fork, the zygote or raas, whatever fails; a
start that fails or is cancelled must leave no process outside its cgroup and touch no other
sandbox. Each attack's test fails if the attack works, beside a control that shows the check
sees what it looks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raas.sandbox import BwrapConfig, SandboxError, SandboxLimits, cgroups, procs
from raas.sandbox import bwrap as bwrap_module
from raas.sandbox import zygote as zygotes
from raas.sandbox.bwrap import BwrapSandbox
from tests.sandbox.test_zygote import waits_for_go
from tests.support.sandbox_shell import out

MiB = 1024 * 1024
LIMITS = SandboxLimits(action_timeout_s=30, max_processes=40, disk_bytes=32 * MiB)
CONFIG = BwrapConfig(limits=LIMITS)
DEADLINE_S = 30.0


def poll(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    """Blocking: whether ``condition`` comes true within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def fd_links(pid: int | str = "self") -> dict[str, str]:
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # closed meanwhile
                found[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return found


def cgroup_fds(pid: int | str = "self") -> set[str]:
    """What of the cgroup file systems ``pid`` holds open (a ``tasks`` file above all)."""
    return {link for link in fd_links(pid).values() if link.startswith(str(cgroups.ROOT))}


def pidfds_of(pid: int) -> set[str]:
    """Our fds that are pidfds of process ``pid``."""
    found = set()
    for fd, link in fd_links().items():
        if link != "anon_inode:[pidfd]":
            continue
        with contextlib.suppress(OSError):
            if f"Pid:\t{pid}\n" in Path(f"/proc/self/fdinfo/{fd}").read_text():
                found.add(fd)
    return found


def cgroup_of(pid: int) -> dict[str, str]:
    """Controller -> ``pid``'s cgroup path (v1), from /proc."""
    found = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            found[controller] = path
    return found


def in_cgroup(pid: int, group: cgroups.SandboxCgroup) -> bool:
    """Whether ``pid`` is in ``group`` in every hierarchy of it (v1)."""
    own = cgroup_of(pid)
    return all(
        str(d).endswith(own.get(controller, "\0")) and own[controller] != "/"
        for controller, d in group.dirs.items()
    )


def live_children(pid: int) -> set[int]:
    return {p for p in procs.children_of(pid) if procs.alive(p)}


def v1(sandbox: BwrapSandbox) -> cgroups.SandboxCgroup:
    if sandbox._cgroup is None or sandbox._cgroup.version != 1:
        pytest.skip("no cgroup v1 hierarchy raas can write")
    return sandbox._cgroup


def cgroup_dirs(sandbox: BwrapSandbox) -> list[Path]:
    """Where ``sandbox``'s cgroup is (or was) in each hierarchy, found without it."""
    found = cgroups.hierarchy()
    assert found is not None
    name = cgroups.parent_name(sandbox.dir.parent)
    return [base / name / sandbox.id for base in found.bases.values()]


@pytest.fixture
async def first() -> AsyncIterator[BwrapSandbox]:
    """A running fork (its zygote started): the other tenant, which must not be touched."""
    sandbox = BwrapSandbox(CONFIG)
    await sandbox.start()
    try:
        assert isinstance(sandbox.process, zygotes.ForkedProcess)
        v1(sandbox)
        yield sandbox
    finally:
        await sandbox.close()


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name`` is ``value`` meanwhile (an instance attribute over its class's)."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


class HeldLock:
    """Stands in for a zygote's request lock while another start's request is in flight: a
    thread that comes to take it says so, and waits till ``open``."""

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()
        self.waiting = threading.Event()
        self._opened = False

    def __enter__(self) -> HeldLock:
        self.waiting.set()
        self._gate.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self._gate.release()

    def open(self) -> None:
        if not self._opened:
            self._opened = True
            self._gate.release()


async def delivered() -> None:
    """Lets a task just cancelled take its CancelledError (a few turns of the loop: the
    scheduling of asyncio, not a wait on time)."""
    for _ in range(10):
        await asyncio.sleep(0)


# -- Attack: cancel a start while its request waits for the zygote (FIXED) ---------------------
# A start's request waits for the zygote's lock while another start's is in flight (many
# rollouts start at once). The start is cancelled meanwhile (a client gone, a deadline): its
# ``finally`` closed the cgroup's ``tasks`` fds (and the lowers) under the thread, which then
# sent those numbers: closed (EBADF: the zygote was killed as "out of step", and every other
# tenant's sandbox of it with it), or reused by then for any other file of raas (another
# sandbox's ``tasks`` file: the fork moves itself into that sandbox's cgroup; a socket: it
# writes ``0`` there); the fork it made, never let go, waited forever. Fixed: the fork's request
# runs to its end whatever is cancelled (``bwrap._to_its_end``), then what it made is undone.


@pytest.mark.parametrize("cancel", [True, False], ids=["cancelled", "control"])
async def test_a_start_cancelled_while_its_request_waits_breaks_no_other_sandbox(
    first: BwrapSandbox, cancel: bool
) -> None:
    key = first._zygote_key()
    zygote = zygotes._zygotes[key]
    assert zygote.host_pid is not None and isinstance(first.process, zygotes.ForkedProcess)
    held, finished = HeldLock(), threading.Event()
    real_fork = zygote.fork

    def fork(*args: Any) -> zygotes.Forked:
        try:
            return real_fork(*args)
        finally:
            finished.set()

    second = BwrapSandbox(CONFIG)
    with patched(zygote, "_lock", held), patched(zygote, "fork", fork):
        start = asyncio.create_task(second.start())
        try:
            assert await asyncio.to_thread(held.waiting.wait, DEADLINE_S)
            if cancel:
                start.cancel()
                await delivered()
            held.open()
            if cancel:
                with pytest.raises(asyncio.CancelledError):
                    await start
            else:
                await start
            assert await asyncio.to_thread(finished.wait, DEADLINE_S)
        finally:
            held.open()
            if not start.done():
                start.cancel()
                with contextlib.suppress(BaseException):
                    await start
            if cancel:
                await second.close()
    try:
        # The other tenant's sandbox, and the zygote, are untouched.
        assert zygotes._zygotes.get(key) is zygote and zygote.alive
        assert await out(first, "echo still here") == "still here"
        forks = {first.process.pid}
        if not cancel:  # the control: a start let through makes one more fork
            assert isinstance(second.process, zygotes.ForkedProcess)
            forks.add(second.process.pid)
            assert in_cgroup(second.process.pid, v1(second))
        # Nothing of the cancelled start lives on (its fork, let go or not), holds a cgroup
        # file of raas's, or is left of its cgroup.
        host_pid = zygote.host_pid
        assert await asyncio.to_thread(poll, lambda: live_children(host_pid) == forks), forks
        assert cgroup_fds() == set()
        if cancel:
            assert not [d for d in cgroup_dirs(second) if d.exists()]
    finally:
        await second.close()


# -- Attack: cancel a start while raas makes its cgroup and opens its files (FIXED) -------------
# Cancelled there, the start never learnt of the cgroup the thread made, nor of the ``tasks``
# fds it opened (as root): both were left, the cgroup until raas restarts, the fds for good.
# Fixed as the one above.


async def start_cancelled_in(
    sandbox: BwrapSandbox, owner: object, name: str, cancel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start ``sandbox`` with ``owner.name`` (the blocking call that makes its cgroup) held in
    its thread; cancel the start there (or, ``cancel`` false, the control: let it through), let
    the call go on, and check that no cgroup of it is left once it is closed."""
    entered, gate, finished = threading.Event(), threading.Event(), threading.Event()
    real = getattr(owner, name)

    def held(*args: Any) -> Any:
        entered.set()
        gate.wait(DEADLINE_S)
        try:
            return real(*args)
        finally:
            finished.set()

    monkeypatch.setattr(owner, name, held)
    start = asyncio.create_task(sandbox.start())
    try:
        assert await asyncio.to_thread(entered.wait, DEADLINE_S)
        if cancel:
            start.cancel()
            await delivered()
        gate.set()
        if cancel:
            with pytest.raises(asyncio.CancelledError):
                await start
        else:
            await start
            assert all(d.is_dir() for d in cgroup_dirs(sandbox))  # the control: it was made
        assert await asyncio.to_thread(finished.wait, DEADLINE_S)
        await sandbox.close()
        assert not [d for d in cgroup_dirs(sandbox) if d.exists()]
    finally:
        gate.set()
        if not start.done():
            start.cancel()
            with contextlib.suppress(BaseException):
                await start
        await sandbox.close()


@pytest.mark.parametrize("cancel", [True, False], ids=["cancelled", "control"])
async def test_a_start_cancelled_while_its_cgroup_is_made_leaves_none(
    first: BwrapSandbox, cancel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = BwrapSandbox(CONFIG)
    await start_cancelled_in(second, bwrap_module, "_cgroup_to_join", cancel, monkeypatch)
    assert isinstance(second.process, zygotes.ForkedProcess) != cancel  # forked, if let through
    assert cgroup_fds() == set()
    assert await out(first, "echo still here") == "still here"


# -- The same, on a cold start (bwrap started as it is, behind a gate; FIXED) --------------------
# A cold start's cgroup was made by a thread a cancellation did not wait for: the cgroup was left
# till raas restarts. Its join by PID, likewise cancelled, could write a PID after the gate was
# killed and reaped, one another process may have taken. Both now run to their end.


@pytest.mark.parametrize("cancel", [True, False], ids=["cancelled", "control"])
async def test_a_cold_start_cancelled_while_its_cgroup_is_made_leaves_none(
    cancel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = BwrapSandbox(BwrapConfig(limits=LIMITS, zygote=False))
    await start_cancelled_in(sandbox, cgroups, "create", cancel, monkeypatch)
    assert sandbox.process is None or not isinstance(sandbox.process, zygotes.ForkedProcess)


# -- Attack: a fork that dies before it is let go (FIXED) ------------------------------------------
# raas opens the fork's pidfd while the fork sets itself up, "while its PID can name no other
# process". But the fork can die before: its own memory cap is hit in its set-up (it is in its
# cgroup first; a config's ``sandbox_memory_bytes`` has no floor), or anything of its uid kills
# it. The zygote reaps it at once and its PID is free (pid_max is 32768 on many hosts): the
# pidfd raas opened may be of any process that took the PID, held by an abandoned
# ForkedProcess; and the "go" written to a pipe no one reads raised BrokenPipeError, not the
# SandboxError callers handle. Fixed: a go that cannot be written drops the pidfd (it signals
# nothing) and fails the start with SandboxError (bwrap.py); a go written means the fork was
# alive, so the pidfd opened before it is the fork's.


def started_at(pid: int) -> str | None:
    """When the process with PID ``pid`` started (its stat's field 22), None where there is
    none: with the PID, which process it is."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def place_at(pid: int, tries: int = 50) -> int | None:
    """A process of ours (``sleep``) with PID ``pid`` (ns_last_pid: as root), or None."""
    for _ in range(tries):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        child = os.posix_spawn("/bin/sleep", ["sleep", "600"], {})
        if child == pid:
            return child
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    return None


@pytest.mark.parametrize("fate", ["dies", "dies, its PID taken", "control"])
async def test_a_fork_that_dies_before_go_fails_its_start_and_holds_nothing(
    first: BwrapSandbox, fate: str
) -> None:
    zygote = zygotes._zygotes[first._zygote_key()]
    real_fork = zygote.fork
    victims: list[int] = []

    def fork(*args: Any) -> zygotes.Forked:
        forked = real_fork(*args)
        if fate != "control":
            born = started_at(forked.pid)
            os.kill(forked.pid, signal.SIGKILL)
            # Reaped, its PID free (or already another's: other processes of a loaded machine
            # take PIDs too, and a zombie keeps its start time till reaped).
            assert poll(lambda: started_at(forked.pid) != born)
            if fate == "dies, its PID taken":
                placed = place_at(forked.pid)
                if placed is not None:
                    victims.append(placed)
        return forked

    second = BwrapSandbox(CONFIG)
    try:
        with patched(zygote, "fork", fork):
            if fate == "control":
                await second.start()
                assert await out(second, "echo ok") == "ok"
            else:
                with pytest.raises(SandboxError):
                    await second.start()
        if fate == "dies, its PID taken" and not victims:
            pytest.skip("could not place a process at the dead fork's PID (ns_last_pid)")
        for victim in victims:  # a stranger with the fork's PID: raas holds nothing of it
            assert pidfds_of(victim) == set()
            await second.close()
            assert procs.alive(victim)
        assert await out(first, "echo still here") == "still here"
    finally:
        await second.close()
        for victim in victims:
            os.kill(victim, signal.SIGKILL)
            await asyncio.to_thread(os.waitpid, victim, 0)


# -- Attack: a join that fails half-way keeps the other ``tasks`` fds (FIXED) ---------------------
# ``join_cgroup`` closed each fd after its write, in a loop that a failed write left: the
# hierarchies after it stayed open (root's ``tasks`` files, each able to move any process the
# holder names) through the fork's whole set-up, until raas let it go. Fixed: every fd is closed
# whatever fails (inside/zygote.py). The attack here sends the zygote the request raas would,
# with a ``tasks`` fd that cannot be written first.


@pytest.fixture
def scratch_cgroup(first: BwrapSandbox) -> Iterator[cgroups.SandboxCgroup]:
    """A cgroup of the test's own (no caps), beside the sandboxes'."""
    name = f"atk-{uuid.uuid4().hex[:8]}"
    group = cgroups.create(first.dir.parent, name, cgroups.Caps(None, None, None))
    assert group is not None
    try:
        yield group
    finally:
        group.remove()


@pytest.mark.parametrize("broken", [True, False], ids=["first-fails", "control"])
async def test_a_fork_whose_join_fails_keeps_no_cgroup_file_open(
    first: BwrapSandbox, scratch_cgroup: cgroups.SandboxCgroup, broken: bool
) -> None:
    zygote = zygotes._zygotes[first._zygote_key()]
    joins = scratch_cgroup.open_self_joins()
    if broken:  # read-only: its write fails (EBADF), the others are root's, writable
        os.close(joins[0])
        joins[0] = os.open(next(iter(scratch_cgroup.dirs.values())) / "tasks", os.O_RDONLY)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("")
        listener.listen(1)
        args = first.server_args(zygotes.LISTEN_FD, "/tmp")
        request = zygotes.Request(args, {}, [("/tmp", MiB)], joins=len(joins))
        try:
            forked = await asyncio.to_thread(zygote.fork, request, listener.fileno(), (), joins)
        finally:
            for fd in joins:
                os.close(fd)
        try:
            assert await asyncio.to_thread(waits_for_go, forked.pid, forked.go)
            # Set up, waiting for go: it holds no cgroup file, and is in its cgroup or in none.
            assert cgroup_fds(forked.pid) == set()
            assert in_cgroup(forked.pid, scratch_cgroup) == (not broken)
            os.write(forked.go, b"g")
            with os.fdopen(forked.stderr, "rb") as err, os.fdopen(forked.stdout, "rb") as o:
                line = await asyncio.to_thread(o.readline)
                if broken:
                    assert line == b""
                    said = await asyncio.to_thread(err.read)
                    assert b"sandbox set-up" in said and b"Bad file descriptor" in said, said
                else:
                    assert line.startswith(b"RAAS-ACTION-SERVER-READY"), line
        finally:
            os.close(forked.go)
            procs.kill({forked.pid})
            assert await asyncio.to_thread(poll, lambda: not procs.alive(forked.pid))


# -- Attack: processes made, or work charged, before the move (HELD) ----------------------------
# A fork moves itself (on v1) before anything else, then sets up; only raas's code runs before
# its move, and the sandbox's first process (the action server) is forked after. A fork of a
# sealed sandbox runs ``rm`` over the sealed server's scratch files after go, in its cgroup. So
# every process of the sandbox, from its init on, is in its cgroup in every hierarchy, and the
# cgroup holds nothing else: nothing to escape the caps by.


@pytest.mark.parametrize("kind", ["fresh", "of a sealed sandbox"])
async def test_every_process_of_a_fork_is_in_its_cgroup_and_nothing_else(
    first: BwrapSandbox, kind: str
) -> None:
    parent = None
    if kind == "fresh":
        sandbox = BwrapSandbox(CONFIG)
    else:
        parent = BwrapSandbox(CONFIG)
        await parent.start()
        # Scratch of the sealed server's name for the fork's ``rm`` (after go) to remove.
        await out(parent, "mkdir -p /tmp/.raas-x/y && touch /tmp/.raas-x/y/z /tmp/.raas-f")
        assert await parent.seal()
        child = await parent.fork()
        assert isinstance(child, BwrapSandbox)
        sandbox = child
    try:
        if sandbox.client is None:  # a fork comes started
            await sandbox.start()
        group = v1(sandbox)
        if parent is not None:
            gone = "test ! -e /tmp/.raas-x && test ! -e /tmp/.raas-f && echo gone"
            assert await out(sandbox, gone) == "gone"
        await out(sandbox, "sleep 1000 & setsid sleep 1000 > /dev/null 2>&1 < /dev/null &")
        pids = sandbox.host_pids()
        assert len(pids) >= 4  # init, server, bash, the sleeps
        outside = {}
        for pid in pids:
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile (a command's)
                # One exiting (a command's) leaves its cgroup after its memory (so its command
                # line): it runs nothing more.
                if not in_cgroup(pid, group) and procs.command_line(pid) not in ("", "?"):
                    outside[pid] = (procs.command_line(pid), cgroup_of(pid))
        assert not outside, outside
        assert sandbox._pidns is not None
        for pid in group.pids():  # nothing but the sandbox's own (one gone meanwhile: none)
            assert procs.pid_namespace(pid) in (sandbox._pidns, None), pid
        # The control: the check tells the zygote and the other tenant's processes apart.
        zygote = zygotes._zygotes[first._zygote_key()]
        assert zygote.host_pid is not None
        assert not in_cgroup(zygote.host_pid, group)
        assert not any(in_cgroup(pid, group) for pid in first.host_pids())
        assert all(in_cgroup(pid, v1(first)) for pid in first.host_pids())
    finally:
        await sandbox.close()
        if parent is not None:
            await parent.close()


# -- Attack: a host user reads the zygote's or a fork's fds, or writes a ``tasks`` file (HELD) --
# An unprivileged host user (another uid than the sandboxes') cannot list or open the fds of
# the zygote or of a fork (/proc/PID/fd: the ptrace check), nor open a sandbox cgroup's
# ``tasks`` file for writing (root's, 0644): what it could move a process by.

PROBE = r"""
import os, sys
for path in sys.argv[1:]:
    try:
        if path.endswith("/fd"):
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_WRONLY))
        print("reached", path)
    except OSError as e:
        print("denied", e.errno)
"""


@pytest.mark.parametrize("user", [65534, 0], ids=["nobody", "control-root"])
async def test_a_host_user_reaches_no_fd_of_the_zygote_or_a_fork_nor_a_tasks_file(
    first: BwrapSandbox, user: int
) -> None:
    zygote = zygotes._zygotes[first._zygote_key()]
    assert zygote.host_pid is not None and isinstance(first.process, zygotes.ForkedProcess)
    group = v1(first)
    paths = [f"/proc/{zygote.host_pid}/fd", f"/proc/{first.process.pid}/fd"]
    paths += [str(d / "tasks") for d in group.dirs.values()]
    probe = await asyncio.create_subprocess_exec(
        "/usr/bin/python3",
        "-c",
        PROBE,
        *paths,
        user=user,
        group=user,
        extra_groups=[],
        stdout=asyncio.subprocess.PIPE,
        cwd="/",
    )
    said, _ = await probe.communicate()
    lines = said.decode().splitlines()
    assert len(lines) == len(paths), lines
    if user == 0:
        assert all(line.startswith("reached") for line in lines), lines
    else:
        assert not [line for line in lines if line.startswith("reached")], lines
