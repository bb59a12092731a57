"""`raas bench NAME`: a benchmark of the ``raas.bench`` package (prints, never asserts)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

import raas.bench

NOT_BENCHMARKS = {"forked", "jobload"}  # shared helpers of the benchmarks


def known() -> list[str]:
    names = (m.name for m in pkgutil.iter_modules(raas.bench.__path__))
    return sorted(n for n in names if n not in NOT_BENCHMARKS and not n.startswith("_"))


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("name")
@click.pass_context
def bench(ctx: click.Context, name: str) -> None:
    """Run benchmark NAME (e.g. `raas bench pipeline -- --jobs 96`); prints, never asserts."""
    if name not in known():
        raise click.UsageError(f"no benchmark {name!r} (have: {', '.join(known())})")
    module = importlib.import_module(f"raas.bench.{name}")
    sys.exit(module.main(list(ctx.args)))
