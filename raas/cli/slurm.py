"""`raas slurm`: an sbatch script that runs one raas server per node."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from raas.cli.serve import setting_option
from raas.deploy.slurm import (
    NO_KEY,
    SlurmOptionError,
    SlurmOptions,
    key_given,
    serve_values,
    write_script,
)
from raas.deploy.slurm import submit as do_submit

# The options' defaults are SlurmOptions' own: one place for each.
DEFAULT = SlurmOptions()
FILE = click.Path(dir_okay=False, path_type=Path)
DIR = click.Path(file_okay=False, path_type=Path)

SLURM_HELP_EPILOG = (
    "Every node needs raas installed at the same path (--python), and --workdir and "
    "--server-list on a filesystem the nodes and the trainer share. Stopping: scancel JOBID (or "
    "the time limit) makes every server drain for --drain-grace-s, persist its results and exit; "
    "srun waits for them, so nothing is left running. Other options of raas serve (not --host "
    "or --db) pass through to every node's server, e.g. "
    "`raas slurm --nodes 4 --llm-port 8001 --run-workers 64 --eval-workers 128`."
)


@click.command(
    short_help="Write (or submit) an sbatch script: a raas server per node.",
    epilog=SLURM_HELP_EPILOG,
    context_settings={"ignore_unknown_options": True, "show_default": True},
)
@click.option("--nodes", type=int, default=DEFAULT.nodes, help="Nodes; one server each.")
@click.option("--partition", help="Slurm partition (sbatch --partition).")
@click.option(
    "--time",
    help="Time limit (sbatch --time: minutes, HH:MM:SS or D-HH:MM:SS); at the limit the servers"
    " drain as on scancel.",
)
@click.option("--account", help="Account to charge (sbatch --account).")
@click.option("--job-name", default=DEFAULT.job_name, help="Slurm job name.")
@click.option("--cpus-per-task", type=int, help="CPUs for each node's server (and engine).")
@click.option("--port", type=int, default=DEFAULT.port, help="raas serve's port.")
@click.option(
    "--llm",
    multiple=True,
    help="An inference server for each node's raas serve (repeatable); {host} becomes that"
    " node's hostname, so each server uses its own node's, e.g. http://{host}:8001.",
)
@click.option(
    "--llm-port",
    "llm_ports",
    type=int,
    multiple=True,
    help="Short for --llm http://{host}:PORT (repeatable).",
)
@click.option(
    "--engine-model",
    help="Also start `raas engine --model M` on every node and use it (smollm2, tiny or a"
    " checkpoint directory); the servers' --tokenizer too, unless --tokenizer is given.",
)
@click.option("--engine-port", type=int, default=DEFAULT.engine_port, help="That engine's port.")
@setting_option(
    "drain_grace_s",
    " On scancel, too: keep it below the cluster's KillWait (scontrol show config), after"
    " which Slurm kills what still runs.",
)
@click.option(
    "--server-list",
    type=FILE,
    default=DEFAULT.server_list,
    help="Where the servers' URLs go (one http://host:port a line) once all answer; removed"
    " when the job stops. Trainers: raas.client.read_server_list(path, wait=...).",
)
@click.option(
    "--workdir",
    type=DIR,
    default=DEFAULT.workdir,
    show_default=False,  # "." would say less than this
    help="The job's working directory (sbatch --chdir).  [default: here]",
)
@click.option(
    "--log-dir",
    type=DIR,
    help="Slurm's output (raas-JOBID.out) and each node's server logs.  [default: --workdir]",
)
@click.option(
    "--db-dir",
    type=DIR,
    help="Each node's SQLite results (raas-HOST.db); a node-local disk beats NFS."
    "  [default: --workdir]",
)
@click.option(
    "--python",
    default=DEFAULT.python,
    help="The Python with raas installed, as the nodes see it.",
)
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    help="Any other sbatch option as one --name=value (repeatable), e.g."
    " --sbatch-arg=--gres=gpu:8.",
)
@click.option(
    "-o",
    "--out",
    type=FILE,
    default=Path("raas-slurm.sbatch"),
    help="Where to write the sbatch script.",
)
@click.option("--submit", is_flag=True, help="Also run sbatch on it and print the job id.")
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED, metavar="[RAAS SERVE OPTIONS]")
def slurm(out: Path, submit: bool, **options: Any) -> None:
    """Write an sbatch script that runs one raas server per node, each using its own node's
    inference servers, and lists their URLs for the trainer; --submit also submits it."""
    # Each option's name is its SlurmOptions field, so the fields are listed once, there.
    fields: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
    opts = SlurmOptions(**fields)
    try:
        write_script(opts, out)
    except SlurmOptionError as e:
        raise click.UsageError(str(e)) from e
    click.echo(f"wrote {out}", err=True)
    if not key_given(serve_values(opts.serve_args), os.environ):
        click.echo(NO_KEY, err=True)
    if submit:
        try:
            job_id = do_submit(out)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from e
        click.echo(
            f"submitted job {job_id}; servers will be listed in {opts.server_list}", err=True
        )
        click.echo(job_id)
