"""A persistent bash on a pty: cwd, environment and background jobs survive between commands.

Each command is written to a file and ``source``d by an interactive bash (so any syntax works and
job control puts each command in its own process group), followed by a ``printf`` of a marker that
carries ``$?``. Completion is the marker appearing on the pty, never a sleep. On timeout the
foreground process group gets SIGINT, then SIGKILL; a shell that will not come back is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import re
import shutil
import signal
import struct
import termios
import uuid
from typing import Any

from outbuf import OutputBuffer

INTERRUPT_GRACE_S = 1.0
# A marker of an earlier, interrupted command that bash printed late.
STALE_MARKER = re.compile(r"\n?__RAAS_DONE_[0-9a-f]{16}_-?\d+__\n")


def marker_re(*markers: str) -> re.Pattern[bytes]:
    """The line ``printf`` writes for any of ``markers``, with the exit code as group 1."""
    names = b"|".join(re.escape(m.encode()) for m in markers)
    return re.compile(b"\n?(?:" + names + b")_(-?\\d+)__\n")


BASH_ARGV = ["bash", "--noprofile", "--norc", "--noediting", "-i"]
# Python ignores SIGPIPE and a parent may have ignored SIGINT: commands must see the default
# dispositions (`yes | head` ends quietly, SIGINT interrupts).
DEFAULTS = (signal.SIGPIPE, signal.SIGINT, signal.SIGQUIT, signal.SIGXFSZ)


def _quiet_wide_terminal(fd: int) -> None:
    """The shell's terminal as raas reads it, set before bash starts (in the child, so nothing
    races it; no stty process per sandbox): no echo of what raas types, "\n" kept as is, and
    1000 columns so that nothing a command prints is wrapped."""
    attrs = termios.tcgetattr(fd)
    attrs[1] &= ~termios.ONLCR  # oflag
    attrs[3] &= ~termios.ECHO  # lflag
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    rows, _, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8)))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, 1000, 0, 0))


class ShellDied(Exception):
    pass


class Shell:
    def __init__(self, cwd: str, env: dict[str, str], scratch_dir: str) -> None:
        self.cwd = cwd
        self.env = env
        self.scratch_dir = scratch_dir
        self.pid = 0
        self.fd = -1
        self.lock = asyncio.Lock()
        self._buffer: OutputBuffer | None = None
        self._wakeup = asyncio.Event()
        self._eof = False
        self._starting: asyncio.Future[None] | None = None

    @property
    def alive(self) -> bool:
        return self.pid > 0 and not self._eof

    async def start(self) -> None:
        started = self._spawn()
        pid, fd = started if started is not None else self._fork()
        self.pid, self.fd = pid, fd
        self._eof = False
        os.set_blocking(fd, False)
        asyncio.get_running_loop().add_reader(fd, self._on_readable)
        setup = "PS1=''; PS2=''; PROMPT_COMMAND=''; unset HISTFILE MAILCHECK"
        await self._run(setup, timeout_s=10.0, max_output=4096)

    def _spawn(self) -> tuple[int, int] | None:
        """bash on a new pty by posix_spawn, which vforks: no copy of this process's page
        tables and pages, which a fork makes and exec drops at once (most of a shell's start).
        None where it cannot (a libc without setsid for posix_spawn, no bash on PATH, the
        shell's directory not this process's): then ``_fork``."""
        bash = shutil.which("bash", path=self.env.get("PATH", os.defpath))
        try:
            here = os.path.samefile(".", self.cwd)  # the child's directory is this one
        except OSError:
            here = False
        if bash is None or not here:
            return None
        master, slave = os.openpty()  # neither inherited: closed in bash as it starts
        try:
            _quiet_wide_terminal(slave)
            # The session's leader opens the pty: it becomes its controlling terminal.
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, os.ttyname(slave), os.O_RDWR, 0),
                (os.POSIX_SPAWN_DUP2, 0, 1),
                (os.POSIX_SPAWN_DUP2, 0, 2),
            ]
            pid = os.posix_spawn(
                bash, BASH_ARGV, self.env, file_actions=actions, setsid=True, setsigdef=DEFAULTS
            )
        except (NotImplementedError, AttributeError, OSError):
            os.close(master)
            return None
        finally:
            os.close(slave)
        return pid, master

    def _fork(self) -> tuple[int, int]:
        pid, fd = pty.fork()
        if pid == 0:  # the child: bash with the pty as its controlling terminal
            try:
                for sig in DEFAULTS:
                    signal.signal(sig, signal.SIG_DFL)
                _quiet_wide_terminal(0)
                os.chdir(self.cwd)
                os.execvpe("bash", BASH_ARGV, self.env)
            finally:
                os._exit(127)
        return pid, fd

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: the shell is gone
            data = b""
        if not data:
            self._eof = True
            asyncio.get_running_loop().remove_reader(self.fd)
        elif self._buffer is not None:
            self._buffer.feed(data)
        self._wakeup.set()

    async def _wait_for(self, pattern: re.Pattern[bytes], timeout_s: float) -> Any | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        buffer = self._buffer
        assert buffer is not None
        while True:
            match = buffer.find(pattern)
            if match is not None:
                return match
            if self._eof:
                raise ShellDied()
            left = deadline - loop.time()
            if left <= 0:
                return None
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), left)

    def _send(self, text: str) -> None:
        data = text.encode()
        while data:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                continue
            data = data[n:]

    def start_soon(self) -> None:
        """Start bash in the background: the server answers meanwhile, and the first command
        waits for it (a bash that fails to start is started again by that command)."""

        async def start() -> None:
            async with self.lock:
                await self.start()

        self._starting = asyncio.ensure_future(start())
        self._starting.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def run(self, command: str, timeout_s: float, max_output: int) -> dict[str, Any]:
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._starting)
            self._starting = None
        async with self.lock:
            if not self.alive:
                await self._restart()
            return await self._run(command, timeout_s, max_output)

    async def _run(self, command: str, timeout_s: float, max_output: int) -> dict[str, Any]:
        nonce = uuid.uuid4().hex[:16]
        # One script file per shell, overwritten by each command: no `rm` (a fork) per call.
        script = os.path.join(self.scratch_dir, f".raas-cmd-{os.getpid()}")
        with open(script, "w") as f:  # noqa: ASYNC230 - a few bytes to a tmpfs
            f.write(command + "\n")
        marker = "__RAAS_DONE_" + nonce
        pattern = marker_re(marker)
        buffer = self._buffer = OutputBuffer(max_output)
        self._send(f" source {script}; printf '\\n{marker}_%s__\\n' \"$?\"\n")
        timed_out = False
        restarted = False
        try:
            match = await self._wait_for(pattern, timeout_s)
            if match is None:
                timed_out = True
                match, restarted = await self._interrupt(marker)
        except ShellDied:
            match, restarted = None, True
            await self._restart()
        self._buffer = None
        if match is not None:
            recent = buffer.recent()
            cut_at_end = len(recent) - match.start()
            exit_code = int(match.group(1))
        else:
            cut_at_end = 0
            exit_code = -1
        output, cut = buffer.text(cut_at_end)
        result = {
            "output": STALE_MARKER.sub("", output),
            "exit_code": exit_code,
            "timed_out": timed_out,
            "output_cut_bytes": cut,
            "shell_restarted": restarted,
        }
        if restarted:
            result["note"] = (
                "the shell had to be restarted: its state (cwd, variables, jobs) is lost"
            )
        return result

    async def _interrupt(self, marker: str) -> Any:
        """Stop the foreground job; returns (marker match or None, whether bash was restarted).

        Interactive bash aborts the rest of a command line whose job died of SIGINT, so the
        command's own marker may never come: each signal is followed by a probe line that
        prints a fresh marker, and whichever marker comes first ends the wait.
        """
        for sig in (signal.SIGINT, signal.SIGKILL):
            self._signal_foreground(sig)
            probe = "__RAAS_DONE_" + uuid.uuid4().hex[:16]
            self._send(f" printf '\\n{probe}_%s__\\n' {128 + sig}\n")
            try:
                match = await self._wait_for(marker_re(marker, probe), INTERRUPT_GRACE_S)
            except ShellDied:
                break
            if match is not None:
                return match, False
        await self._restart()
        return None, True

    def _signal_foreground(self, sig: int) -> None:
        try:
            group = os.tcgetpgrp(self.fd)
        except OSError:
            group = -1
        try:
            if group > 0 and group != self.pid:
                os.killpg(group, sig)
            elif sig == signal.SIGINT:
                os.kill(self.pid, sig)  # a builtin loop: interactive bash aborts it on SIGINT
        except ProcessLookupError:
            pass

    async def _restart(self) -> None:
        self.close()
        await self.start()

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self.fd)
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if self.pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0
