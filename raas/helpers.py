"""Helpers every layer shares: free ports, waiting until an HTTP endpoint answers, guarded child
processes, atomic writes, the server list, retries that honour ``Retry-After``, a request's
bearer token, and reading a model field's annotation.

Standard library, httpx and tenacity only, and nothing of raas, so that the trainer-side client,
the LLM and sandbox libraries and the server can all use them.
"""

from __future__ import annotations

import asyncio
import difflib
import email.utils
import errno
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

import httpx
from tenacity import RetryCallState
from tenacity.wait import wait_base

T = TypeVar("T")

# -- ports ------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class PortBusy(RuntimeError):
    """A server's address cannot be bound (in use, or not this machine's)."""


def check_port(host: str, port: int) -> None:
    """Raise PortBusy, in words a person can act on, unless a server could bind ``host:port``
    now (as uvicorn binds, with SO_REUSEADDR). Asked before a server starts, so that a busy
    port is said first, not after the app has logged that it is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortBusy(
                    f"{host}:{port} is in use (pass --port N, or stop what holds it)"
                ) from e
            raise PortBusy(f"{host}:{port} cannot be bound: {e.strerror}") from e


def is_loopback(host: str) -> bool:
    """Does binding ``host`` listen on this machine's loopback only (``localhost``,
    ``127.0.0.1``, ``::1``, or a name that resolves to nothing else)? ``0.0.0.0``, ``::`` and
    ``""`` (every interface) do not."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), None) if host else []
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found
    )


def port_free(host: str, port: int) -> bool:
    """Could a server bind ``host:port`` now?"""
    try:
        check_port(host, port)
    except PortBusy:
        return False
    return True


# -- waiting until a server answers -----------------------------------------------------------


class NotReady(RuntimeError):
    """A server did not answer in time, or what was to serve it has gone."""


def wait_until_answers(
    url: str,
    timeout_s: float,
    gone: Callable[[], str | None] | None = None,
    stop: threading.Event | None = None,
    interval_s: float = 0.1,
) -> bool:
    """Poll ``GET url`` until it answers 200. True once it does; False if ``stop`` is set first.

    ``gone`` is asked before every try and returns why the server can no longer come up (its
    process exited), which is raised at once instead of waiting out the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while stop is None or not stop.is_set():
        reason = gone() if gone is not None else None
        if reason is not None:
            raise NotReady(reason)
        try:
            if httpx.get(url, timeout=min(2.0, timeout_s)).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        if time.monotonic() >= deadline:
            raise NotReady(f"{url} did not answer within {timeout_s:g} s")
        if stop is not None:
            stop.wait(interval_s)
        else:
            time.sleep(interval_s)
    return False


def exited(
    proc: subprocess.Popen[Any], log: Path | None = None, name: str | None = None
) -> Callable[[], str | None]:
    """For ``wait_until_answers(gone=...)``: the child's exit code, the last line of its log
    (its error, not the traceback above it) and where the log is, on one line."""

    def reason() -> str | None:
        if proc.poll() is None:
            return None
        who = name or repr(proc.args)
        said = f"{who} exited with {proc.returncode}"
        if log is None:
            return said
        last = last_line(log.read_text(errors="replace")[-4000:])
        return said + (f": {last}" if last else "") + f" (its log: {log})"

    return reason


def last_line(text: str, limit: int = 300) -> str:
    """The last line of ``text`` that says something, without click's ``Error:``, cut at
    ``limit`` characters (transformers' errors list every model type it knows)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1].removeprefix("Error: ")
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Terminated(Exception):
    """SIGTERM (kill, Slurm's scancel, timeout) stopped a run, as a Ctrl-C would have."""


async def stopped_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Awaits ``coro``; SIGTERM cancels it, as asyncio.run does on Ctrl-C, so that its cleanup
    runs (its jobs cancelled on the server, the servers it started stopped); then Terminated.

    Only this task is cancelled: a KeyboardInterrupt raised in the loop would make asyncio.run
    cancel every task at once, the cleanup's own awaits included. Not by way of SIGINT, which a
    process a script starts in the background ignores. Outside the main thread SIGTERM is not
    this coroutine's to take, and it only awaits. The handler before is put back after."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    before = signal.getsignal(signal.SIGTERM)
    signalled: list[bool] = []

    def cancel() -> None:
        signalled.append(True)
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, cancel)
    except (ValueError, RuntimeError):  # not the main thread
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if signalled:
            raise Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if before is not None:
            signal.signal(signal.SIGTERM, before)


# -- child processes --------------------------------------------------------------------------

# The child gets SIGTERM when the process that started it dies, even by SIGKILL, so a crashed
# parent leaves no server behind. The parent-pid check closes the race where the parent died
# before prctl ran; exec keeps the pid. The signal follows the *thread* that forked. Linux only.
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None)\n"
    "if hasattr(libc, 'prctl'): libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(3)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def guarded(argv: Sequence[str]) -> list[str]:
    """``argv`` (a full path first) as a child that gets SIGTERM when this process dies."""
    return [sys.executable, "-c", _GUARD, str(os.getpid()), *argv]


def terminate(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM (a raas server then drains), SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# -- files ------------------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in one rename: a reader sees the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_run_dir(parent: Path, label: str = "") -> Path:
    """A directory of its own for one run under ``parent`` (made here): ``YYYYmmdd-HHMMSS``,
    then ``-LABEL``, then ``-2``, ``-3``... if a run of the same second holds that name, so a
    run never writes over another's results."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(label).name)  # a model's directory: its name
    stamp = time.strftime("%Y%m%d-%H%M%S") + (f"-{label}" if label else "")
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{parent}: no free name for {stamp}")


class ServerListError(RuntimeError):
    pass


def write_server_list(path: Path, urls: Sequence[str]) -> None:
    """The list a deployment writes for the trainer, one ``http://host:port`` a line."""
    write_atomic(path, "".join(u.rstrip("\n") + "\n" for u in urls))


def read_server_list(path: str | Path, wait: float = 0.0, poll_s: float = 0.5) -> list[str]:
    """The URLs in ``path``; with ``wait`` > 0, wait up to that many seconds for it to appear.

    Deployments write the file in one rename once every server answers, so a file that exists
    is complete. Blank lines and ``#`` comments are skipped.
    """
    path = Path(path)
    deadline = time.monotonic() + wait
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                waited = f" after waiting {wait:g} s" if wait > 0 else ""
                raise ServerListError(f"no server list at {path}{waited}") from None
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
            continue
        urls = []
        for n, line in enumerate(text.splitlines(), 1):
            url = line.strip()
            if not url or url.startswith("#"):
                continue
            if not url.startswith(("http://", "https://")):
                raise ServerListError(f"{path}: line {n} is not an http(s) URL: {url!r}")
            urls.append(url)
        if not urls:
            raise ServerListError(f"{path} lists no servers")
        return [u.rstrip("/") for u in urls]


# -- retries ----------------------------------------------------------------------------------


def retry_after_s(headers: Mapping[str, str], default: float | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``default``."""
    value = headers.get("retry-after") or headers.get("Retry-After")
    if value is None:
        return default
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(when.timestamp() - time.time(), 0.0)


class wait_retry_after(wait_base):
    """Wait what the server asked for (the exception's ``retry_after_s``), else ``fallback``."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        asked = getattr(exc, "retry_after_s", None)
        if isinstance(asked, int | float):
            return float(asked)
        return float(self.fallback(retry_state))


# -- bearer tokens ----------------------------------------------------------------------------


def bearer_token(scope: Mapping[str, Any]) -> bytes | None:
    """The token of an ASGI request's ``Authorization: Bearer`` header, as the bytes sent."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = bytes(value).partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


# The headers that carry an API key as it is: Anthropic's clients', then Google's.
API_KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def api_keys_given(scope: Mapping[str, Any]) -> list[bytes]:
    """An ASGI request's keys given as they are, not as a bearer token: its ``x-api-key`` and
    ``x-goog-api-key`` headers, then its query's ``key`` (how Google's clients may send one)."""
    names = {n.encode() for n in API_KEY_HEADERS}
    out = [bytes(v).strip() for n, v in scope.get("headers", ()) if n in names]
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    return out + [k.encode() for k in query_keys(query)]


def query_keys(query: str) -> list[str]:
    """The ``key`` parameters of a query string (``key=<token>``, as Google's API takes one)."""
    return parse_qs(query, keep_blank_values=True).get("key", []) if "key=" in query else []


def offered_tokens(headers: Mapping[str, str], query: str = "") -> list[str]:
    """The tokens a request offers (header names in lower case): ``Authorization: Bearer``'s
    (OpenAI's clients, Anthropic's with an auth token), then ``x-api-key``'s (Anthropic's),
    ``x-goog-api-key``'s (Google's), and its ``query``'s ``key`` (Google's too)."""
    out = []
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        out.append(given.strip())
    out += [headers[name].strip() for name in API_KEY_HEADERS if name in headers]
    return out + query_keys(query)


# -- annotations ------------------------------------------------------------------------------


def without_none(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` as ``(X, True)``; anything else as ``(annotation, False)`` (a union of
    several types other than None stays as it is)."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return annotation, False
    args = typing.get_args(annotation)
    rest = [a for a in args if a is not type(None)]
    if len(rest) != 1:
        return annotation, False
    return rest[0], len(rest) < len(args)


# What a terminal acts on instead of showing: C0 and C1 controls (ESC starts a sequence that can
# retitle the window, move the cursor, write the clipboard), DEL, and the bidirectional marks
# and overrides that reorder the text around them.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(value: object) -> str:
    """Text from a job or a server (an instance id, a data_source, an error message) that is
    safe to print on a terminal: each control character shown as its escape (``\\x1b``)."""
    return CONTROL_CHARACTERS.sub(lambda m: ascii(m.group())[1:-1], str(value))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the choice closest to a mistyped ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""
