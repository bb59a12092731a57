"""Data in and out: `raas export` (results from a database or a server) and `raas datasets`
(bundled task sets)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from raas.cli.output import api_key_option, run_client
from raas.store.dashboard import SEARCH_CHARS, JobFilter
from raas.store.export import FORMATS

if TYPE_CHECKING:
    from raas.wire import ExportedResult, RolloutResult


def format_of(out: Path, fmt: str | None) -> str:
    """The file format: ``fmt`` if given, else ``out``'s suffix; a usage error when the two
    disagree or the suffix names neither (nothing is written as one thing under another's name)."""
    suffix = out.suffix.lower().lstrip(".")
    named = {"jsonl": "jsonl", "json": "jsonl", "parquet": "parquet"}.get(suffix)
    if fmt is None and named is None:
        raise click.UsageError(f"--out {out}: write a .jsonl or a .parquet file (not .{suffix})")
    if fmt is not None and named is not None and named != fmt:
        raise click.UsageError(f"--out {out} is a .{suffix} file but --format is {fmt}")
    return fmt or str(named)


@click.command(short_help="Finished trajectories for offline use, from a database or a server.")
@click.option(
    "--db",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The server's SQLite file, read directly (raas.db when neither --db nor --server is"
    " given).",
)
@click.option(
    "--tenant",
    metavar="NAME",
    help="With --db: only this tenant's jobs (`default`: the admin's own).",
)
@click.option(
    "--server",
    metavar="URL",
    help="Read from the raas server at URL instead (GET /v1/rollouts:export): what its key may"
    " see, a tenant's key its own jobs, the admin's every job.",
)
@api_key_option("With --server: the server's API key, a tenant's or the admin's")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="jsonl or parquet; by default, what --out's suffix says.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="A .jsonl or .parquet file.",
)
@click.option(
    "--state",
    type=click.Choice(["done", "failed", "timeout", "cancelled"]),
    help="Only results in this state.",
)
@click.option("--data-source", metavar="NAME", help="Only results of this data_source.")
@click.option("--error-type", metavar="TYPE", help="Only results that failed so (an error's type).")
@click.option("--min-reward", type=float, metavar="R", help="Only results rewarded R or more.")
@click.option("--max-reward", type=float, metavar="R", help="Only results rewarded R or less.")
@click.option(
    "--search",
    metavar="TEXT",
    help="Only results with TEXT (case aside) in their job id, instance_id, data_source, task,"
    f" error type or message, or judge's note; at most {SEARCH_CHARS} characters, % and _"
    " literal.",
)
def export(
    db: Path | None,
    tenant: str | None,
    server: str | None,
    api_key: str | None,
    fmt: str | None,
    out: Path,
    state: str | None,
    data_source: str | None,
    error_type: str | None,
    min_reward: float | None,
    max_reward: float | None,
    search: str | None,
) -> None:
    """Write finished trajectories for offline use, from a database (--db) or from a running
    server (--server URL), in the order the jobs finished.

    Each row is a result under the id its tenant knows the job by (`cd-7`), with the tenant in
    `tenant`: null for the admin's own jobs, so for every job of a server without tenants. JSONL
    holds a result a line (as RolloutResult reads it back); Parquet a column a field. From a
    server the rows come as JSON lines and Parquet is written here. The --out file appears only
    once it is whole: an export that breaks off leaves none. The filters are the dashboard's
    (its job list's "Export these" link writes the same rows)."""
    from raas.store.export import WRITERS
    from raas.store.export import export as from_db

    fmt = format_of(out, fmt)
    if server is not None and (db is not None or tenant is not None):
        raise click.UsageError(
            "--server exports what its key may see: give it without --db and --tenant (a"
            " tenant's key gets its own jobs)"
        )
    typed = click.get_current_context().get_parameter_source("api_key")
    if server is None and typed is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(
            "--api-key is for --server; --db reads the file itself (--tenant NAME picks a"
            " tenant's jobs)"
        )
    for name, reward in (("--min-reward", min_reward), ("--max-reward", max_reward)):
        if reward is not None and not math.isfinite(reward):
            raise click.BadParameter(f"{reward} is not a finite number", param_hint=f"'{name}'")
    if search is not None and len(search) > SEARCH_CHARS:
        raise click.BadParameter(
            f"{len(search)} characters: at most {SEARCH_CHARS}", param_hint="'--search'"
        )
    where = JobFilter(
        state=state,
        data_source=data_source,
        error_type=error_type,
        min_reward=min_reward,
        max_reward=max_reward,
        search=search or None,
    )
    part = out.with_name(out.name + ".part")  # renamed to OUT once every row is in
    try:
        if server is not None:
            n = run_client(_from_server(server, api_key, where, WRITERS[fmt], part))
        else:
            # One's own database, read here: a search reads every row, not the server's newest.
            own = replace(where, tenant=tenant, search_rows=None)
            n = from_db(db or _default_db(), fmt, part, own)
    except RuntimeError as e:  # Parquet without pyarrow, a database from a newer raas
        part.unlink(missing_ok=True)
        raise click.ClickException(str(e)) from e
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, out)
    click.echo(f"wrote {n} result{'' if n == 1 else 's'} to {out}")


def _default_db() -> Path:
    db = Path("raas.db")
    if not db.is_file():
        raise click.BadParameter(
            f"no {db} here: give the server's database (--db FILE) or its URL (--server URL)",
            param_hint="'--db'",
        )
    return db


async def _from_server(
    url: str,
    api_key: str | None,
    where: JobFilter,
    write: Callable[[Iterable[RolloutResult], Path], int],
    out: Path,
) -> int:
    """Write the rows the server at ``url`` streams with ``write`` (a file writer of
    raas.store.export), on a thread, as they come; ``where`` (of no tenant: the server's key
    says whose) sent as the route's filters."""
    from raas.client import AsyncRolloutClient

    async with (
        AsyncRolloutClient(url, api_key=api_key) as client,
        contextlib.aclosing(
            client.export(
                where.state,
                data_source=where.data_source,
                error_type=where.error_type,
                min_reward=where.min_reward,
                max_reward=where.max_reward,
                search=where.search,
            )
        ) as rows,
    ):
        loop = asyncio.get_running_loop()

        def pulled() -> Iterator[ExportedResult]:  # on the writer's thread
            while True:
                row = asyncio.run_coroutine_threadsafe(anext(rows, None), loop).result()
                if row is None:
                    return
                yield row

        return await asyncio.to_thread(write, pulled(), out)


@click.group()
def datasets() -> None:
    """The bundled task sets."""


@datasets.command("list")
def datasets_list() -> None:
    """Name, size and description of every bundled set."""
    from raas.tasks.datasets import BUNDLED

    for s in BUNDLED.values():
        name = f"{s.name:<10} {len(s.load()):>4}  "
        click.echo(
            textwrap.fill(s.description, 80, initial_indent=name, subsequent_indent=" " * 17)
        )


@datasets.command("export")
@click.argument("name")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="A .parquet or .jsonl file.",
)
def datasets_export(name: str, out: Path) -> None:
    """Write a bundled set as Parquet (or JSONL)."""
    from raas.tasks.datasets import DatasetError, bundled

    fmt = format_of(out, None)
    try:
        rows = bundled(name)
    except DatasetError as e:
        raise click.UsageError(str(e)) from e
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.Table.from_pylist([{"task": json.dumps(r), **_flat(r)} for r in rows]), out
        )
    else:
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    click.echo(f"wrote {len(rows)} tasks of {name} to {out}")


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """The scalar fields of a task, as Parquet columns (the whole task is in `task`)."""
    return {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool)) and k != "task"}


@datasets.command("check")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The image store the tasks' images come from and are built into (default: raas's).",
)
@click.option("--jobs", type=click.IntRange(1, 16), default=2, show_default=True)
def datasets_check(path: Path, store: Path | None, jobs: int) -> None:
    """Check a Harbor task directory, or a dataset of them, before training on it.

    Each task is built and run twice with no model: once with its solution/solve.sh run where
    the agent works (the gold policy: it must score 1), once with nothing done (a no-op agent:
    it must score 0). Prints a line a task; exits 1 if a task is broken (it does not build or
    start), its gold fails, or its no-op already passes.
    """
    from raas.helpers.task_dirs import TaskDirError, read_task_dir, task_dirs

    try:
        instances = [read_task_dir(task) for task in task_dirs(path)]
    except TaskDirError as e:
        raise click.UsageError(str(e)) from e
    checks = asyncio.run(_check_all(instances, store, jobs))
    click.echo(f"{'task':<28} {'gold':>5} {'no-op':>6} {'s':>6}  verdict")
    for check in checks:
        gold = "-" if check.gold is None else f"{check.gold:g}"
        no_op = "-" if check.no_op is None else f"{check.no_op:g}"
        line = f"{check.name[:28]:<28} {gold:>5} {no_op:>6} {check.seconds:>6.1f}  {check.verdict}"
        click.echo(line)
        if check.error:  # whole: its end says what to do
            click.echo(textwrap.fill(check.error, 80, initial_indent="  ", subsequent_indent="  "))
    bad = [c for c in checks if not c.ok]
    click.echo(f"{len(checks) - len(bad)} of {len(checks)} tasks ok")
    if bad:
        raise SystemExit(1)


async def _check_all(instances: list[dict[str, Any]], store: Path | None, jobs: int) -> list[Any]:
    from raas.sandbox import BwrapConfig
    from raas.tasks.harbor.check import check_task
    from raas.tasks.harbor.instance import HarborInstance
    from raas.tasks.services import TaskServices

    for instance in instances:  # a task that is not one is said before anything runs
        try:
            HarborInstance.model_validate(instance)
        except ValueError as e:
            raise click.UsageError(f"{instance.get('name')}: {e}") from e
    config = BwrapConfig() if store is None else BwrapConfig(image_store=store)
    services = TaskServices(llm=None, sandbox_config=config)  # type: ignore[arg-type]
    gate = asyncio.Semaphore(jobs)

    async def one(instance: dict[str, Any]) -> Any:
        async with gate:
            check = await check_task(services, instance)
        click.echo(f"checked {check.name}: {check.verdict}", err=True)
        return check

    try:
        return list(await asyncio.gather(*(one(i) for i in instances)))
    finally:
        await services.close()
