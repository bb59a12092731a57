"""Talking to a running server: `raas status`, `raas jobs` and `raas submit`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from raas.cli.output import api_key_option, exit_for_infra, run_client, run_keeping

if TYPE_CHECKING:  # the command's imports are made when it runs: `raas --help` stays quick
    from rich.table import Table

    from raas.wire import RunningJob


@click.command()
@click.argument("url")
@api_key_option()
def status(url: str, api_key: str | None) -> None:
    """Show a server's queues, active jobs per stage and totals."""
    from raas.client import AsyncRolloutClient
    from raas.helpers.terminal import plain

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
    """List the jobs in flight on the server at URL: each by its instance_id, its stage, turns
    and tokens so far (response, and the prompt's), elapsed; a row a job, in 80 columns (ids too
    long are cut with an ellipsis; the job id shows in full on a wider terminal)."""
    from rich.console import Console

    from raas.cli.progress import markup
    from raas.client import AsyncRolloutClient

    async def fetch() -> Any:
        async with AsyncRolloutClient(url, api_key=api_key) as client:
            return await client.running()

    running = run_client(fetch())
    console = Console()
    if not running:
        console.print(f"{markup(url)}: no jobs in flight")
        return
    title = f"{len(running)} jobs in flight on {markup(url)}"
    console.print(running_table(running, title, console.width))


def running_table(running: list[RunningJob], title: str, width: int) -> Table:
    """One line a job in ``width`` columns: the numbers keep their width, and the instance, task
    and job ids share the rest (4:2:1), cut with an ellipsis where it is too narrow; rich left
    to itself folds them over lines, or squeezes the numbers out, when it fits them."""
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    from raas.helpers.terminal import plain

    rows = []
    for j in running:  # what a job says is its submitter's: shown as text, never as markup
        task = j.data_source if j.task in (None, j.data_source) else f"{j.data_source} ({j.task})"
        stage = "queued" if j.state == "queued" else j.stage or j.state
        numbers = (j.turns, j.response_tokens, j.prompt_tokens, f"{j.elapsed_s:.0f} s", j.attempts)
        cells = [j.instance_id or "-", task, stage, *numbers, j.job_id]
        rows.append([plain(c) for c in cells])
    head = ["instance", "task", "stage", "turns", "tokens", "prompt", "elapsed", "try", "job"]
    shares = {0: 4, 1: 2, 8: 1}  # the columns of ids and names, and their parts of the room left
    natural = [max(cell_len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fixed = sum(n for i, n in enumerate(natural) if i not in shares)
    room = width - fixed - 2 * (len(head) - 1)  # between columns: a rule and a space
    widths = _shared(room, {i: natural[i] for i in shares}, shares)
    table = Table(
        title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True
    )
    for i, name in enumerate(head):
        table.add_column(
            name,
            justify="left" if i in shares or name == "stage" else "right",
            no_wrap=True,
            overflow="ellipsis",
            max_width=widths.get(i),
        )
    for row in rows:
        table.add_row(*map(Text, row))
    return table


def _shared(room: int, wants: dict[int, int], weights: dict[int, int]) -> dict[int, int]:
    """``room`` characters shared by columns by weight, none given more than it wants: those
    that want less than their part leave the rest to the others (4 each at the least)."""
    widths, weight = {}, sum(weights.values())
    for i in sorted(wants, key=lambda i: wants[i] / weights[i]):
        widths[i] = min(wants[i], max(room * weights[i] // weight, 4))
        room, weight = room - widths[i], weight - weights[i]
    return widths


@click.command(short_help="Run a task file on the server at URL; results as JSONL.")
@click.argument("url")
@click.argument("file", type=click.Path(exists=True, path_type=Path))
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
    """Run every task in FILE (JSONL or Parquet; or a Harbor task directory, or a directory of
    them) on the server at URL and write the results.

    Each row is a task instance (with `data_source`), a verl-format row, or a full request
    (`{"instance": ..., "sampling_params": ..., "job_id": ...}`), read as `raas run` reads it.
    """
    from rich.console import Console

    from raas.cli.progress import Counting, say_cancelling
    from raas.client import RolloutClient
    from raas.client.task_files import (
        TaskFileError,
        as_requests,
        keeping,
        read_tasks,
        run_requests,
        write_results,
    )
    from raas.helpers.terminal import plain
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
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"  # none scored: no mean
    click.echo(
        f"{len(results)} result{'' if len(results) == 1 else 's'} in {out}: "
        + ", ".join(f"{plain(k)} {v}" for k, v in sorted(by_state.items()))
        + f"; mean reward {mean}"
    )
    exit_for_infra(results)
