"""The ``raas`` command line: one module a concern, each adding its commands to ``main``."""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

import raas
from raas.cli import bench, compare, data, images, jobs, run, serve, slurm, usage


class Commands(click.Group):
    """raas's commands: Ctrl-C before a command has work of its own to stop (an engine still
    starting, say) exits as a shell's interrupted command does (130), not click's ``Aborted!``
    and 1. A command that has work to stop says so itself (``raas.cli.output.run_keeping``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(128 + signal.SIGINT)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(raas.__version__, prog_name="raas")
def main() -> None:
    """raas: Rollout-as-a-Service for RL of multi-turn LLM agents.

    A trainer sends tasks over HTTP; raas runs each rollout through three worker pools (INIT sets
    the task up, RUN runs the agent loop, EVAL computes the reward) and returns trajectories and
    rewards. Start with `raas serve`, or `raas demo` to see one end to end.
    """


for command in (
    serve.serve,
    serve.engine,
    jobs.status,
    jobs.jobs,
    jobs.submit,
    usage.usage,
    data.export,
    run.demo,
    run.run,
    compare.compare,
    data.datasets,
    images.images,
    slurm.slurm,
    bench.bench,
):
    main.add_command(command)

__all__ = ["main"]
