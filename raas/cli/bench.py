"""`raas bench NAME`: a benchmark of the ``raas.bench`` package (prints, never asserts)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

import raas.bench

NOT_BENCHMARKS = {"forked", "jobload", "oci_fixtures"}  # shared helpers of the benchmarks


def known() -> list[str]:
    names = (m.name for m in pkgutil.iter_modules(raas.bench.__path__))
    return sorted(n for n in names if n not in NOT_BENCHMARKS and not n.startswith("_"))


@click.command(
    short_help="Run a benchmark (raas bench NAME -- -h): prints, never asserts.",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("name")
@click.pass_context
def bench(ctx: click.Context, name: str) -> None:
    """Run benchmark NAME: burst, dapo, docs, fork, gateway, harbor, images, judges, llm,
    pipeline, scale, soak, tenants or tools (docs: every run docs/benchmarks.md quotes, one
    after the other, as `make bench-docs`). Its own options come after `--`: `raas bench pipeline --
    --help`, `raas bench pipeline -- --jobs 96`. Benchmarks print medians and ratios against a
    baseline measured in the same run; they never assert."""
    if name not in known():
        raise click.UsageError(f"no benchmark {name!r} (have: {', '.join(known())})")
    module = importlib.import_module(f"raas.bench.{name}")
    sys.exit(module.main(list(ctx.args)))
