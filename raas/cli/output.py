"""What every command shares: calling a server from the command line, and logging."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
CAUSE_CHARS = 300  # of an error's cause on the last line


def key_on_command_line(instead: str) -> str:
    return (
        "warning: --api-key on the command line is visible to every user of this machine (ps,"
        f" /proc/PID/cmdline): give it as {instead}"
    )


def _warn_if_typed(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    typed = param.name is not None and ctx.get_parameter_source(param.name)
    if value is not None and typed is ParameterSource.COMMANDLINE:
        click.echo(key_on_command_line("RAAS_API_KEY"), err=True)
    return value


def api_key_option(what: str = "The server's API key") -> Callable[[F], F]:
    """``--api-key``, from RAAS_API_KEY when not given; given, it warns that ps shows it."""
    return click.option(
        "--api-key",
        envvar="RAAS_API_KEY",
        callback=_warn_if_typed,
        help=f"{what} (or RAAS_API_KEY, which ps does not show).",
    )


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine; a server's error or an unreachable server is one line that says
    what to do."""
    import httpx

    from raas.client import RaasHTTPError, ServerDown
    from raas.helpers.readiness import NotReady
    from raas.helpers.terminal import plain

    try:
        return asyncio.run(coro)
    except NotReady as e:  # an engine or service started here did not come up
        raise click.ClickException(str(e)) from e
    except RaasHTTPError as e:
        raise click.ClickException(_said(e)) from e
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
        hint = "" if "http://HOST:PORT" in str(e) else " (give it as http://HOST:PORT)"
        raise click.ClickException(f"bad server URL: {e}{hint}") from e
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
            f"{plain(e)} (start one with `raas serve --port PORT`, or check the URL and port)"
        ) from e
    except httpx.RemoteProtocolError as e:  # it answered, then broke off (a stop, a restart)
        raise click.ClickException(
            f"the server{_url_of(e)} closed the connection mid-answer: {plain(e)} (stopped or"
            " restarted? run this again once it answers)"
        ) from e
    except (httpx.TransportError, OSError) as e:
        where = _url_of(e)
        raise click.ClickException(
            f"no raas server is answering{where}: {plain(e or type(e).__name__)}"
            " (start one with `raas serve --port PORT`, or check the URL and port)"
        ) from e


def run_keeping(coro: Coroutine[Any, Any, T], finished: list[Any], out: Path) -> T:
    """``run_client`` for a run of jobs that appends each result to ``finished`` as it comes:
    on Ctrl-C or SIGTERM (once the run has cancelled its unfinished jobs) those results go to
    ``out`` and the exit status is a shell's for the signal (130, 143), with one line instead
    of ``Aborted!``."""
    from raas.client.task_files import write_results
    from raas.helpers.sigterm import Terminated, stopped_by_sigterm
    from raas.helpers.terminal import counted

    try:
        return run_client(stopped_by_sigterm(coro))
    except (KeyboardInterrupt, Terminated) as e:
        write_results(finished, out)
        how = "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted"
        if finished:
            done = counted(len(finished), "result")
            verb = "is" if len(finished) == 1 else "are"
            click.echo(f"{how}: the {done} that had finished {verb} in {out}")
        else:
            click.echo(f"{how}: no result had finished ({out} holds none)")
        sys.exit(128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT))


def _said(error: Any) -> str:
    """A server's error answer, with what to do for the two a person gets by mistake."""
    from raas.helpers.terminal import plain

    hint = {
        401: " (give the server's key: RAAS_API_KEY=KEY, or --api-key KEY)",
        404: _not_found_hint(getattr(error, "server", None)),
    }.get(error.status_code, "")
    return f"{plain(error)}{hint}"


def _not_found_hint(server: str | None) -> str:
    """A 404 from a URL with a path: the path is the mistake; from a bare HOST:PORT, what
    answers there is no raas server (an inference engine, say)."""
    import httpx

    if server is None or httpx.URL(server).path not in ("", "/"):
        return " (give the server's base URL, http://HOST:PORT, without a path)"
    return (
        f" ({server} is not a raas server: it has no /v1 routes; give the URL of `raas serve`,"
        " not of an inference server)"
    )


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
    from raas.client.task_files import infra_errors
    from raas.helpers.terminal import plain

    if errors := infra_errors(results):
        failed = len(errors)
        # The commonest cause, on the last line a person reads (the table cuts it short).
        cause, times = Counter(f"{e.type}: {e.message}" for e in errors).most_common(1)[0]
        more = f" ({times} of them; the others: the why column)" if times < failed else ""
        raise click.ClickException(
            f"{failed} of {len(results)} rollouts could not run (errors of kind infra){more}:"
            f" {textwrap.shorten(plain(cause), CAUSE_CHARS)}"
        )
