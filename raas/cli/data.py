"""Data in and out: `raas export` (results from a database) and `raas datasets` (bundled task
sets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


@click.command()
@click.option(
    "--db",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default="raas.db",
    show_default=True,
    help="The server's SQLite file.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option(
    "--state",
    type=click.Choice(["done", "failed", "timeout", "cancelled"]),
    help="Only results in this state.",
)
def export(db: Path, fmt: str, out: Path, state: str | None) -> None:
    """Write finished trajectories from a database for offline use."""
    from raas.store.export import export as do_export

    try:
        n = do_export(db, fmt, out, state)
    except RuntimeError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {n} results to {out}")


@click.group()
def datasets() -> None:
    """The bundled task sets."""


@datasets.command("list")
def datasets_list() -> None:
    """Name, size and description of every bundled set."""
    from raas.tasks.datasets import BUNDLED

    for s in BUNDLED.values():
        click.echo(f"{s.name:<10} {len(s.load()):>4}  {s.description}")


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

    try:
        rows = bundled(name)
    except DatasetError as e:
        raise click.UsageError(str(e)) from e
    if out.suffix == ".parquet":
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
