"""Waiting until a server answers, and why one that cannot come up did not."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


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
