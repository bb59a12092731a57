"""`raas compare A B`: two runs' results side by side, by data_source and in all."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from raas.cli.progress import markup
from raas.helpers.terminal import counted

if TYPE_CHECKING:
    from rich.table import Table

    from raas.client.compare import Compared, Figures

WIDTH = 80  # the table fits a terminal of 80 columns
NONE = "-"


@click.command(short_help="Two runs' results side by side: rewards, lengths, failures.")
@click.argument("a", metavar="A", type=click.Path(path_type=Path))
@click.argument("b", metavar="B", type=click.Path(path_type=Path))
def compare(a: Path, b: Path) -> None:
    """Compare run A with run B from their results: a JSONL results file as `raas run --out`,
    `raas submit --out` and `raas export --out FILE.jsonl` write them (or a run's folder, whose
    results.jsonl is read).

    For each data_source, and for all of them: jobs, mean reward and pass rate (reward >= 1)
    over the scored jobs (done, with a reward; a failure is not a 0), mean response tokens and
    turns over the jobs with a trajectory, the commonest stop reason (with its share of the
    jobs), and the failures (every job not done) by the kind of their error; each for A, for B
    and B-A."""
    from rich.console import Console

    from raas.client.compare import compare as side_by_side
    from raas.client.task_files import ResultFileError, read_results

    try:
        first, second = read_results(a), read_results(b)
    except ResultFileError as e:
        raise click.ClickException(str(e)) from e
    console = Console(width=WIDTH)
    for label, path, results in (("A", a, first), ("B", b, second)):
        console.print(f"{label}: {markup(path)} ({counted(len(results), 'result')})")
    console.print(compare_table(side_by_side(first, second)))


def compare_table(groups: list[Compared]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("data_source", overflow="fold", ratio=1)
    table.add_column("", no_wrap=True)
    for name in ("A", "B", "B-A"):
        table.add_column(name, justify="right", no_wrap=True)
    for n, group in enumerate(groups):
        for i, (label, cells) in enumerate(_rows(group.a, group.b)):
            table.add_row(markup(group.group) if i == 0 else "", label, *cells)
        if n < len(groups) - 1:
            table.add_section()
    return table


Row = tuple[str, tuple[str, str, str]]


def _rows(a: Figures, b: Figures) -> list[Row]:
    rows = [
        ("jobs", _each(a.jobs, b.jobs, "{:d}", "{:+d}")),
        ("mean reward", _each(a.mean_reward, b.mean_reward, "{:.3f}", "{:+.3f}")),
        ("pass rate", _each(a.pass_rate, b.pass_rate, "{:.1%}", "{:+.1%}")),
        ("response tokens", _each(a.response_tokens, b.response_tokens, "{:.1f}", "{:+.1f}")),
        ("turns", _each(a.turns, b.turns, "{:.2f}", "{:+.2f}")),
        ("stop reason", (_stop(a), _stop(b), _changed(a.stop_reason, b.stop_reason))),
        ("failed", _each(a.failed, b.failed, "{:d}", "{:+d}")),
    ]
    for kind in sorted({*a.failures, *b.failures}):
        failed = (a.failures.get(kind, 0), b.failures.get(kind, 0))
        rows.append((f"  {kind}", _each(*failed, "{:d}", "{:+d}")))
    return rows


def _each(a: float | None, b: float | None, shown: str, difference: str) -> tuple[str, str, str]:
    """A's and B's values and B-A, each as ``shown`` or ``difference`` says (NONE where a run
    has none)."""
    delta = NONE if a is None or b is None else difference.format(b - a)
    return _shown(a, shown), _shown(b, shown), delta


def _shown(value: float | None, shown: str) -> str:
    return NONE if value is None else shown.format(value)


def _stop(f: Figures) -> str:
    if f.stop_reason is None or f.stop_share is None:
        return NONE
    return f"{markup(f.stop_reason)} {f.stop_share:.0%}"


def _changed(a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return NONE
    return "same" if a == b else "other"
