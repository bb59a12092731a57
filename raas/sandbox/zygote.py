"""Zygotes: one waiting process per sandbox template, which a new sandbox is forked from.

A cold start pays for an interpreter and the action server's imports (most of it: bwrap alone
runs ``/bin/true`` in a tenth of the time). A zygote (``inside/zygote.py``) has paid once: it
waits in a bwrap of the template (root, /etc, the action server's code, the seccomp filter), and
for each sandbox it forks a process that takes namespaces of its own (user, mount, PID, IPC,
UTS, cgroup, network), its own tmpfs mounts of the sandbox's sizes, drops every capability and
runs the action server. raas moves that process into the sandbox's cgroup before it may go on.

A zygote is started once per template and raas process, from a thread kept for it (bwrap's
``--die-with-parent`` follows the thread that started it, so a pool thread that ends would take
the zygote with it); it dies with raas, and at a clean exit is ended (``close_all``) as a
sandbox is closed: its namespace's init first. Nothing of a sandbox's (its limits, its fds) stays in
the zygote after the fork.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

from raas.sandbox import procs
from raas.sandbox.client import SandboxError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0
ANSWER_TIMEOUT_S = 10.0
MAX_MESSAGE = 1 << 20
# The fd the action server's listening socket has in a zygote's sandbox (inside/zygote.py).
LISTEN_FD = 3


class _Keeper(concurrent.futures.Executor):
    """One daemon thread that starts (and ends) zygotes, and lives as long as raas: bwrap's
    ``--die-with-parent`` follows the thread that started it. Not a ThreadPoolExecutor, whose
    thread is joined at exit before ``atexit`` runs ``close_all``: bwrap would kill the zygote
    first, leaving its namespace's init to the host's PID 1 (which may never reap it)."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._work = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raas-zygote", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._work.put((functools.partial(fn, *args, **kwargs), future))
        return future

    def _run(self) -> None:
        while True:
            fn, future = self._work.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the caller
                future.set_exception(e)


_keeper = _Keeper()
_zygotes: dict[str, Zygote] = {}
_starting: dict[str, asyncio.Future[Zygote]] = {}


@dataclasses.dataclass(frozen=True)
class Request:
    """One sandbox for a zygote to fork: the action server's arguments and environment, and
    the tmpfs mounts (path, bytes) of its own; ``lowers``: those of its mounts that are the
    upper layers of overlays (a fork of a sealed sandbox), each lower a detached mount, whose
    fd ``Zygote.fork`` passes in this order; then the ``joins`` fds of its cgroup's ``tasks``
    files (``SandboxCgroup.open_self_joins``)."""

    argv: list[str]
    env: dict[str, str]
    mounts: list[tuple[str, int]]
    hostname: str = "sandbox"
    lowers: list[str] = dataclasses.field(default_factory=list)
    joins: int = 0  # how many cgroup ``tasks`` files (fds after the lowers') it moves itself in


@dataclasses.dataclass(frozen=True)
class Forked:
    """A fork, held before its namespaces: its host PID, the pipe that lets it go on, and the
    read ends of its stdout and stderr."""

    pid: int
    go: int
    stdout: int
    stderr: int


class Zygote:
    """One started zygote: its bwrap process and the control socket raas speaks on."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        control: socket.socket,
        uid: int | None = None,
    ):
        self.process = process
        self.control = control
        self.uid = uid  # its host uid (raas as root), which its sandboxes run as
        self.on_kill: Callable[[], None] | None = None
        self._init: tuple[int, int] | None = None  # its namespace's init (bwrap's): PID, pidfd
        self.host_pid: int | None = None
        self._lock = threading.Lock()  # one request at a time on the control socket

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self) -> None:
        """Blocks until the zygote says it is ready (its PID, found on the host)."""
        self.control.settimeout(READY_TIMEOUT_S)
        try:
            message = self.control.recv(MAX_MESSAGE)
        except TimeoutError:
            raise SandboxError(f"zygote not ready within {READY_TIMEOUT_S:g} s") from None
        if not message:
            raise SandboxError(f"zygote failed to start: {self._stderr()}")
        ns_pid = json.loads(message)["ready"]
        self.host_pid = _host_pid(procs.descendants(self.process.pid), ns_pid)
        if self.host_pid is None:
            raise SandboxError("zygote: its process was not found")
        init = procs.parent_of(self.host_pid)
        fd = None if init is None else procs.open_pidfd(init)
        if init is not None and fd is not None and fd >= 0:
            self._init = (init, fd)
        if self.process.stderr is not None:  # it writes nothing once ready
            self.process.stderr.close()

    def _stderr(self) -> str:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.wait(timeout=2)
        if self.process.stderr is None:
            return "no error output"
        text = self.process.stderr.read().decode(errors="replace").strip()
        return text[-2000:] or f"exit status {self.process.returncode}"

    def fork(
        self,
        request: Request,
        listen_fd: int,
        lowers: Sequence[int] = (),
        joins: Sequence[int] = (),
    ) -> Forked:
        """Blocking (run it in a thread): a new sandbox forked, waiting on ``Forked.go``;
        ``lowers``: the fds of ``request.lowers``, ``joins`` those of its cgroup's ``tasks``
        files, passed on (the caller closes them)."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        ours = [out_r, err_r, go_w]
        try:
            with self._lock:
                message = json.dumps(dataclasses.asdict(request)).encode()
                fds = array.array("i", [listen_fd, out_w, err_w, go_r, *lowers, *joins])
                self.control.settimeout(ANSWER_TIMEOUT_S)
                try:
                    self.control.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                    answer = self.control.recv(MAX_MESSAGE)
                except (OSError, TimeoutError) as e:
                    self.kill()  # out of step with us now: the next sandbox starts a new one
                    raise SandboxError(f"zygote: {e}") from None
            if not answer:
                raise SandboxError(f"zygote exited: {self._stderr()}")
            reply: dict[str, Any] = json.loads(answer)
            if "error" in reply:
                raise SandboxError(f"zygote: {reply['error']}")
            assert self.host_pid is not None
            # The fork is the init of a PID namespace of its own, one below the zygote's.
            level = len(procs.ns_pids(self.host_pid)) - 1
            pid = _host_pid(set(procs.children_of(self.host_pid)), int(reply["pid"]), level)
            if pid is None:
                raise SandboxError("zygote: the new sandbox's process was not found")
            return Forked(pid, go_w, out_r, err_r)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, go_r):
                os.close(fd)

    def kill(self) -> None:
        """Ends the zygote, and with it every sandbox forked from it (its PID namespace): its
        namespace's init first, which bwrap then reaps as it exits. Killing bwrap first would
        leave that init to the host's PID 1, which in a container may never reap it."""
        with contextlib.suppress(OSError):
            self.control.close()
        if self._init is not None:
            pid, fd = self._init
            self._init = None
            procs.signal_pidfd(fd, pid)
            os.close(fd)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.stderr is not None:
            self.process.stderr.close()
        if self.on_kill is not None:
            on_kill, self.on_kill = self.on_kill, None
            on_kill()


def _host_pid(candidates: set[int], ns_pid: int, level: int = -1) -> int | None:
    """Which of ``candidates`` (host PIDs) is ``ns_pid`` in the PID namespace ``level`` deep
    (/proc's NSpid: 0 the outermost, -1 each one's own)."""
    for pid in candidates:
        found = procs.ns_pids(pid)
        if -len(found) <= level < len(found) and found[level] == ns_pid:
            return pid
    return None


async def get(key: str, start: Callable[[], Zygote]) -> Zygote:
    """The zygote of template ``key``, started by ``start`` (blocking, on the keeper thread)
    when there is none or it died. Concurrent callers share one start."""
    zygote = _zygotes.get(key)
    if zygote is not None and zygote.alive:
        return zygote
    pending = _starting.get(key)
    if pending is not None and pending.get_loop() is asyncio.get_running_loop():
        return await asyncio.shield(pending)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Zygote] = loop.create_future()
    _starting[key] = future
    try:
        if zygote is not None:
            await loop.run_in_executor(_keeper, zygote.kill)
        zygote = await loop.run_in_executor(_keeper, start)
        _zygotes[key] = zygote
        future.set_result(zygote)
        return zygote
    except BaseException as e:
        future.set_exception(e)
        future.exception()  # retrieved: a caller may not be waiting
        raise
    finally:
        if _starting.get(key) is future:
            del _starting[key]


def own_pids() -> set[int]:
    """Host PIDs of the zygotes themselves (bwrap, its init, the zygote), which outlive the
    sandboxes they fork: what a count of processes left after closing sandboxes leaves out."""
    pids: set[int] = set()
    for zygote in _zygotes.values():
        pids.add(zygote.process.pid)
        if zygote.host_pid is not None:
            pids |= {zygote.host_pid, procs.parent_of(zygote.host_pid) or zygote.host_pid}
    return pids


def close_all() -> None:
    """Ends every zygote (each takes its sandboxes with it): at exit, and for tests."""
    while _zygotes:
        _, zygote = _zygotes.popitem()
        zygote.kill()


atexit.register(close_all)


class ForkedProcess:
    """What a zygote's sandbox has for the process a cold start launches (the fork, its
    namespaces' init): PID, stdout and stderr, wait and signals. It is the zygote's child, not
    raas's: its end is seen through a pidfd, and its status is not."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader):
        self.pid = pid
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self.returncode: int | None = None
        self._pidfd = procs.open_pidfd(pid)
        if self._pidfd == -1:
            raise SandboxError("a zygote's sandbox needs pidfds (Linux 5.3 or newer)")
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        if self._pidfd is None:
            self._done()
        else:
            loop.add_reader(self._pidfd, self._done)

    def _done(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self.returncode = -signal.SIGKILL if self.returncode is None else self.returncode
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    def release(self) -> None:
        """Lets go of the pidfd without a signal (it may name a process that took the PID of a
        fork that died before the pidfd was opened), as if the process had ended."""
        self._done()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self._pidfd is not None:
            procs.signal_pidfd(self._pidfd, self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def reader(fd: int) -> asyncio.StreamReader:
    """An asyncio reader over the read end of a pipe (which it takes)."""
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(stream, loop=loop)
    await loop.connect_read_pipe(lambda: protocol, os.fdopen(fd, "rb", buffering=0))
    return stream
