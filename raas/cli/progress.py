"""What ``raas run``, ``raas submit`` and ``raas demo`` show while jobs run: a progress bar on a
terminal (a line every few seconds elsewhere), the Ctrl-C message, and job text made safe for
rich markup. The trainer SDK (raas.client) prints nothing: it tells these through its callbacks
(``run_requests``'s ``on_result`` and ``on_interrupt``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Self

from raas.helpers.terminal import counted, plain


def say_cancelling(n: int) -> None:
    """What ``raas run`` / ``raas submit`` print on Ctrl-C before cancelling their jobs."""
    jobs = counted(n, "unfinished job")  # Ctrl-C or SIGTERM alike: what happens, not which
    print(f"stopping: cancelling this run's {jobs} on the server", flush=True)


def markup(value: object) -> str:
    """Text from a job or a server inside rich markup: control characters shown as escapes
    (``plain``) and square brackets escaped, so ``[red]`` is shown, not applied."""
    from rich.markup import escape

    return escape(plain(value))


class Counting:
    """Progress over N jobs: a live bar on a terminal; elsewhere (a log, CI, a pipe) a line every
    ``every_s`` seconds and at the end, so a long CPU run is never silent."""

    def __init__(self, console: Any, total: int, label: str, every_s: float = 15.0) -> None:
        from rich.progress import Progress

        self.console, self.total, self.label, self.every_s = console, total, label, every_s
        self.done = 0
        self.failed = 0
        self._started = self._said = time.monotonic()
        self._bar = Progress(console=console) if console.is_terminal else None
        self._task = (
            self._bar.add_task(markup(label), total=total) if self._bar is not None else None
        )
        self._ticker: asyncio.Task[None] | None = None  # off a terminal: a line every every_s

    def __enter__(self) -> Self:
        if self._bar is not None:
            self._bar.__enter__()
            return self
        self.console.print(
            f"{markup(self.label)}: {self.total} job{'' if self.total == 1 else 's'}"
        )
        with contextlib.suppress(RuntimeError):  # no running loop: lines come with results
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self.done < self.total and (kind is None or not issubclass(kind, Exception)):
            self._say()  # where a run stopped; an error says so itself, in its one line

    async def _tick(self) -> None:
        while True:  # a line even when nothing finishes for a long while
            await asyncio.sleep(self.every_s)
            if time.monotonic() - self._said >= self.every_s:
                self._say()

    def advance(self, result: Any = None) -> None:
        self.done += 1
        if result is not None and getattr(result, "state", "done") != "done":
            self.failed += 1
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task)
        elif time.monotonic() - self._said >= self.every_s or self.done == self.total:
            self._say()

    def _say(self) -> None:
        self._said = time.monotonic()
        self.console.print(
            f"{markup(self.label)}: {self.done}/{self.total} finished ({self.failed} not done),"
            f" {self._said - self._started:.0f} s"
        )
