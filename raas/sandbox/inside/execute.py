"""The exec action: a fresh process from argv, never the agent's shell.

Judges run their commands this way. The program gets no terminal, only the environment the
caller gives, its stdin from the request, and pipes for stdout and stderr; its exit status comes
from the kernel (waitpid), and nothing the agent did to its own shell (a function named ``git``,
an alias, a forged end-of-command marker on the pty) is involved. The program runs in a session
of its own, and at the deadline its whole process group is killed.

Before the first program starts, the action server makes itself non-dumpable: a process of the
same uid (the program, or anything the agent left running) can then neither ptrace it nor read
its memory, environment or file descriptors under /proc, which is where the requests it relays
(stdin that a judge sends: tests, expected values) would otherwise be found.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

PR_SET_DUMPABLE = 4
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_protected = False


def protect_self() -> None:
    """prctl(PR_SET_DUMPABLE, 0) on this process, once (ctypes is imported only here: it is a
    tenth of the server's start, and only judges need it)."""
    global _protected
    if _protected:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    _protected = True


async def _read_capped(stream: asyncio.StreamReader | None, limit: int) -> list[Any]:
    """The stream's first ``limit`` bytes and how many more it wrote (read to the end, so that
    the program never blocks on a full pipe)."""
    kept = bytearray()
    cut = 0
    if stream is None:
        return [b"", 0]
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return [bytes(kept), cut]
        room = limit - len(kept)
        kept += chunk[:room]
        cut += max(0, len(chunk) - room)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_process(
    argv: list[str],
    stdin: bytes,
    cwd: str,
    env: dict[str, str],
    timeout_s: float,
    max_output: int,
) -> dict[str, Any]:
    """Run ``argv`` to its end or the deadline; its exit code, output and what was cut."""
    protect_self()
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        return {
            "exit_code": 127,
            "stdout": "",
            "stderr": f"cannot run {argv[0]!r}: {e}",
            "timed_out": False,
            "stdout_cut_bytes": 0,
            "stderr_cut_bytes": 0,
        }

    async def feed() -> None:
        assert process.stdin is not None
        try:
            process.stdin.write(stdin)
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program did not read all of it: its business
        finally:
            process.stdin.close()

    async def finish() -> list[Any]:
        await feed()
        out, err = await asyncio.gather(
            _read_capped(process.stdout, max_output), _read_capped(process.stderr, max_output)
        )
        await process.wait()
        return [out, err]

    timed_out = False
    try:
        out, err = await asyncio.wait_for(finish(), timeout_s)
    except asyncio.TimeoutError:
        timed_out = True
        _kill_group(process.pid)
        await process.wait()
        out, err = [b"", 0], [b"", 0]
    _kill_group(process.pid)  # what it left running in its group goes with it
    code = process.returncode if process.returncode is not None else -signal.SIGKILL
    return {
        "exit_code": code,
        "stdout": out[0].decode("utf-8", "replace"),
        "stderr": err[0].decode("utf-8", "replace"),
        "timed_out": timed_out,
        "stdout_cut_bytes": out[1],
        "stderr_cut_bytes": err[1],
    }


def clean_env(given: Any, home: str) -> dict[str, str]:
    """The program's environment: exactly ``given`` (names and values as strings), with PATH,
    HOME and a UTF-8 locale where it does not say otherwise; nothing of the server's own. The
    default PATH is the sandbox's (an image's own, where it sets one)."""
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    if given is None:
        return env
    if not isinstance(given, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in given.items()
    ):
        raise ValueError("env must be an object of strings")
    env.update(given)
    return env
