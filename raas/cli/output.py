"""What every command shares: calling a server from the command line, and logging."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import textwrap
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

T = TypeVar("T")
CAUSE_CHARS = 300  # of an error's cause on the last line


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine; a server's error or an unreachable server is one line that says
    what to do."""
    import httpx

    from raas.client import RaasHTTPError, ServerDown
    from raas.helpers import NotReady

    try:
        return asyncio.run(coro)
    except NotReady as e:  # an engine or service started here did not come up
        raise click.ClickException(str(e)) from e
    except RaasHTTPError as e:
        raise click.ClickException(_said(e)) from e
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
        raise click.ClickException(f"bad server URL: {e} (give it as http://HOST:PORT)") from e
    except ServerDown as e:
        # A server that answered (401, 404) or a URL httpx cannot use is not one that is down.
        for url, error in e.errors.items():
            if isinstance(error, RaasHTTPError):
                raise click.ClickException(f"{url}: {_said(error)}") from e
            if isinstance(error, httpx.UnsupportedProtocol | httpx.InvalidURL):
                raise click.ClickException(
                    f"bad server URL {url}: {error} (give it as http://HOST:PORT)"
                ) from e
        raise click.ClickException(
            f"{e} (start one with `raas serve --port PORT`, or check the URL and port)"
        ) from e
    except (httpx.TransportError, OSError) as e:
        where = _url_of(e)
        raise click.ClickException(
            f"no raas server is answering{where}: {e or type(e).__name__}"
            " (start one with `raas serve --port PORT`, or check the URL and port)"
        ) from e


def _said(error: Any) -> str:
    """A server's error answer, with what to do for the two a person gets by mistake."""
    hint = {
        401: " (give the server's key: --api-key KEY or RAAS_API_KEY)",
        404: " (give the server's base URL, http://HOST:PORT, without a path)",
    }.get(error.status_code, "")
    return f"{error}{hint}"


def _url_of(error: BaseException) -> str:
    """`` at URL`` of the server a request error was for, when the error knows it."""
    import httpx

    if not isinstance(error, httpx.RequestError):
        return ""
    try:
        return f" at {error.request.url.copy_with(path='/', query=None)}"
    except RuntimeError:  # httpx raises when the error carries no request
        return ""


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def exit_for_infra(results: list[Any]) -> None:
    """Exit 1 when rollouts failed because nothing could run them (kind infra): a run whose
    backends or sandboxes were missing is not a success, whatever the rewards say."""
    from raas.run import infra_errors

    if errors := infra_errors(results):
        failed = len(errors)
        # The commonest cause, on the last line a person reads (the table cuts it short).
        cause, times = Counter(f"{e.type}: {e.message}" for e in errors).most_common(1)[0]
        more = f" ({times} of them; the others: the why column)" if times < failed else ""
        raise click.ClickException(
            f"{failed} of {len(results)} rollouts could not run (errors of kind infra){more}:"
            f" {textwrap.shorten(cause, CAUSE_CHARS)}"
        )


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
        self._task = self._bar.add_task(label, total=total) if self._bar is not None else None
        self._ticker: asyncio.Task[None] | None = None  # off a terminal: a line every every_s

    def __enter__(self) -> Counting:
        if self._bar is not None:
            self._bar.__enter__()
            return self
        self.console.print(f"{self.label}: {self.total} jobs")
        with contextlib.suppress(RuntimeError):  # no running loop: lines come with results
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self.done < self.total:
            self._say()

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
            f"{self.label}: {self.done}/{self.total} finished ({self.failed} not done),"
            f" {self._said - self._started:.0f} s"
        )
