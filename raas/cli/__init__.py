"""The ``raas`` command line: one module a concern, each adding its commands to ``main``."""

from __future__ import annotations

import click

import raas
from raas.cli import bench, compare, data, images, jobs, run, serve, slurm, usage


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
