"""`raas usage`: what each tenant used of a server over a period."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import click

from raas.cli.output import api_key_option, run_client

if TYPE_CHECKING:  # the command's imports are made when it runs: `raas --help` stays quick
    from rich.table import Table

    from raas.wire import UsageReport

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """``90s``, ``15m``, ``2h``, ``1d`` (a bare number is seconds), as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value)
    if match is None:
        raise click.BadParameter(f"{value!r} is not a duration such as 90s, 15m, 2h or 1d")
    number, unit = match.groups()
    return float(number) * _UNITS[unit or "s"]


@click.command(short_help="What each tenant used of a server over a period.")
@click.argument("url")
@click.option(
    "--since",
    "since_s",
    callback=duration,
    metavar="DURATION",
    default="1d",
    show_default=True,
    help="The period, back from now: 90s, 15m, 2h, 1d (the server keeps a day, in memory).",
)
@api_key_option()
def usage(url: str, since_s: float, api_key: str | None) -> None:
    """Print, a row a tenant, what the server at URL did for each over the period (from its
    GET /v1/usage): jobs accepted, finished done and not done (failed, timed out or cancelled),
    seconds inside the stages (INIT, RUN and EVAL together), seconds holding a sandbox, and LLM
    tokens in (each call's prompt) and out (generated). Finished jobs count in the minute they
    finished. A tenant's key prints its own row only, the admin's every tenant's. The same
    counters, since the server started, are in its /metrics with the label `tenant`
    (raas_tenant_*, for the admin's key only)."""
    from rich.console import Console

    from raas.client import AsyncRolloutClient

    async def fetch() -> UsageReport:
        async with AsyncRolloutClient(url, api_key=api_key) as client:
            return await client.usage(since_s)

    report = run_client(fetch())
    console = Console()
    if not report.tenants:
        console.print(f"no jobs in the last {_period(report.since_s)}")
        return
    console.print(usage_table(report))


def usage_table(report: UsageReport) -> Table:
    from rich.table import Table

    table = Table(title=f"usage over the last {_period(report.since_s)}", title_justify="left")
    table.add_column("tenant", overflow="ellipsis", max_width=16, no_wrap=True)
    for name in ("jobs", "done", "not done", "stage s", "sandbox s", "tokens in", "tokens out"):
        table.add_column(name, justify="right")
    for t in report.tenants:
        done = t.finished.get("done", 0)
        table.add_row(
            t.tenant,
            str(t.submitted),
            str(done),
            str(sum(t.finished.values()) - done),
            f"{sum(t.stage_s.values()):.0f}",
            f"{t.sandbox_s:.0f}",
            _count(t.tokens_in),
            _count(t.tokens_out),
        )
    return table


def _count(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _period(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.0f}s"
