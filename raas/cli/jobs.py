"""Talking to a running server: `raas status`, `raas jobs` and `raas submit`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from raas.cli.output import api_key_option, exit_for_infra, run_client, run_keeping


@click.command()
@click.argument("url")
@api_key_option()
def status(url: str, api_key: str | None) -> None:
    """Show a server's queues, active jobs per stage and totals."""
    from raas.client import AsyncRolloutClient
    from raas.helpers import plain

    async def fetch() -> Any:
        async with AsyncRolloutClient(url, api_key=api_key) as client:
            return await client.status(), await client.backends()

    st, backends = run_client(fetch())
    click.echo(
        f"{url}: {'accepting' if st.accepting else 'draining'}, up {st.uptime_s:.0f} s,"
        f" {st.in_flight} jobs in flight"
    )
    for name, s in st.stages.items():
        click.echo(
            f"  {plain(name):<5} active {s.active}/{s.workers}"
            f"  queued {s.queued}/{s.queue_capacity}"
        )
    click.echo("  finished: " + ", ".join(f"{plain(k)} {v}" for k, v in st.finished.items()))
    click.echo("  tasks: " + plain(", ".join(st.tasks)))
    if not backends:
        click.echo(
            "  LLM backends: none (agent tasks cannot run: raas serve --llm URL,"
            " or POST /v1/backends)"
        )
    for b in backends:
        health = "up" if b.healthy else f"DOWN ({plain(b.last_error or 'no answer')})"
        click.echo(
            f"  LLM {plain(b.url)} [{plain(b.protocol)}] {health},"
            f" sessions {b.sessions}/{b.capacity}"
        )


@click.command(short_help="The jobs in flight on a server: stage, turns, tokens, time.")
@click.argument("url")
@api_key_option()
def jobs(url: str, api_key: str | None) -> None:
    """List the jobs in flight on the server at URL: stage, turns and tokens so far, elapsed."""
    from rich.console import Console
    from rich.table import Table

    from raas.client import AsyncRolloutClient
    from raas.client.task_files import markup

    async def fetch() -> Any:
        async with AsyncRolloutClient(url, api_key=api_key) as client:
            return await client.running()

    running = run_client(fetch())
    console = Console()
    if not running:
        console.print(f"{markup(url)}: no jobs in flight")
        return
    table = Table(title=f"{len(running)} jobs in flight on {markup(url)}")
    for column in ("job", "task", "state", "turns", "tokens", "elapsed", "try"):
        table.add_column(column, overflow="fold")
    for j in running:  # what a job says is its submitter's: shown, never acted on
        table.add_row(
            markup(j.job_id),
            markup(j.data_source),
            markup(j.state),
            str(j.turns),
            str(j.response_tokens),
            f"{j.elapsed_s:.0f} s",
            str(j.attempts),
        )
    console.print(table)


@click.command(short_help="Run a task file on the server at URL; results as JSONL.")
@click.argument("url")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write results as JSONL.  [default: FILE.results.jsonl]",
)
@click.option(
    "--task",
    "task_name",
    help="The task (data_source) of rows that name none, e.g. swe for SWE-Gym's and SWE-bench's"
    " own rows; a row's own data_source wins.",
)
@click.option("--sampling-params", default=None, help="JSON object merged under each line's own.")
@click.option("--timeout-s", type=float, help="Per-job budget for lines that set none.")
@api_key_option()
def submit(
    url: str,
    file: Path,
    out: Path | None,
    task_name: str | None,
    sampling_params: str | None,
    timeout_s: float | None,
    api_key: str | None,
) -> None:
    """Run every task in FILE (JSONL or Parquet) on the server at URL and write the results.

    Each row is a task instance (with `data_source`), a verl-format row, or a full request
    (`{"instance": ..., "sampling_params": ..., "job_id": ...}`), read as `raas run` reads it.
    """
    from rich.console import Console

    from raas.client import RolloutClient
    from raas.client.task_files import (
        Counting,
        TaskFileError,
        as_requests,
        keeping,
        read_tasks,
        run_requests,
        say_cancelling,
        write_results,
    )
    from raas.helpers import plain
    from raas.wire import RolloutResult

    try:
        params = json.loads(sampling_params) if sampling_params else None
        tasks = read_tasks(file, task_name)
        requests = as_requests(tasks, params, timeout_s)
    except (TaskFileError, json.JSONDecodeError) as e:
        raise click.UsageError(str(e)) from e
    out = out or file.with_suffix(".results.jsonl")

    finished: list[RolloutResult] = []

    async def go() -> Any:
        with Counting(Console(), len(requests), file.name) as progress:
            arrived = keeping(finished, progress.advance)
            async with RolloutClient(url, api_key=api_key) as client:
                return await run_requests(
                    client,
                    requests,
                    arrived,
                    on_interrupt=say_cancelling,
                    names=[where for where, _ in tasks],
                )

    results = run_keeping(go(), finished, out)
    write_results(results, out)
    by_state: dict[str, int] = {}
    for r in results:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    rewards = [r.reward for r in results if r.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    click.echo(
        f"{len(results)} results in {out}: "
        + ", ".join(f"{plain(k)} {v}" for k, v in sorted(by_state.items()))
        + f"; mean reward {mean:.3f}"
    )
    exit_for_infra(results)
