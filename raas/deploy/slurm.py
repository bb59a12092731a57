"""raas on Slurm: an sbatch script that runs one ``raas serve`` per node.

The script runs ``python -m raas.deploy.node`` once per node under ``srun`` (see that module):
each node's server gets that node's inference servers (``--llm`` URLs with ``{host}``, or a
``raas engine`` it starts), and once every node answers, node 0 writes the servers' URLs to the
server list the trainer reads (``raas.client.read_server_list``).

srun is the batch step's main process (``exec``): on scancel or at the time limit Slurm sends
SIGTERM to every process of the job, the servers drain, and srun waits for them up to KillWait
before Slurm kills what is left. ``--kill-on-bad-exit`` ends the whole job when one node fails,
so no half-started deployment lingers.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from raas.launch import ENGINE_PORT
from raas.paths import ENV_PREFIX
from raas.settings import (
    ServeSettings,
    SettingsError,
    defaults,
    flag,
    parse_flags,
    setting_of,
    to_flags,
)

# Set per node by the deployment: a pass-through copy would clash with them.
OWN_SERVE_OPTIONS = {
    "host": "the servers bind every interface",
    "port": "use raas slurm --port",
    "db": "use raas slurm --db-dir (one database per node)",
    "llm": "use raas slurm --llm (with {host} for the node's name) or --llm-port",
}
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_RE = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+)$")
# What a partition, account or job name may hold: anything else could break the #SBATCH line.
NAME_RE = re.compile(r"^[A-Za-z0-9_.,+@=-]+$")


class SlurmOptionError(ValueError):
    """A bad option; ``option`` is its name on the command line."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


@dataclass
class SlurmOptions:
    nodes: int = 1
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    job_name: str = "raas"
    cpus_per_task: int | None = None
    port: int = field(default_factory=lambda: defaults().server.port)
    llm: list[str] = field(default_factory=list)
    llm_ports: list[int] = field(default_factory=list)
    engine_model: str | None = None
    engine_port: int = ENGINE_PORT
    # raas serve's --drain-grace-s, passed on with its other options; None: the servers' own
    # (their default, or RAAS_DRAIN_GRACE_S, or their --config file's).
    drain_grace_s: float | None = None
    server_list: Path = Path("raas-servers.txt")
    workdir: Path = Path(".")
    log_dir: Path | None = None
    db_dir: Path | None = None
    python: str = sys.executable
    sbatch_args: list[str] = field(default_factory=list)
    serve_args: list[str] = field(default_factory=list)


def serve_values(args: Sequence[str]) -> dict[str, Any]:
    """The pass-through ``raas serve`` flags by settings field, checked: an option the
    deployment sets per node, or a bad value, is a SlurmOptionError naming the flag."""
    try:
        values = parse_flags(args, extra=("config",))
    except SettingsError as e:
        option, _, message = str(e).partition(": ")
        raise SlurmOptionError(option, message) from e
    for key in values:
        if key in OWN_SERVE_OPTIONS:
            why = OWN_SERVE_OPTIONS[key]
            raise SlurmOptionError(flag(key), f"set by raas slurm for each node: {why}")
    if "api_key" in values:  # raas serve refuses it: ps shows a command line to every user
        raise SlurmOptionError(
            "--api-key",
            f"not on the servers' command lines: export {ENV_PREFIX}API_KEY before submitting"
            " (sbatch passes it on) or give --api-key-file FILE",
        )
    try:
        ServeSettings.model_validate({k: v for k, v in values.items() if k != "config"})
    except ValidationError as e:
        # Name the flag as typed, not the settings field.
        err = e.errors()[0]
        option = flag(setting_of(err["loc"])) if err["loc"] else "server options"
        raise SlurmOptionError(option, f"{err['msg']} (got {err.get('input')!r})") from e
    return values


def key_given(values: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    """Do the servers get an API key, from their options or the environment sbatch passes on?
    They listen on every interface, where a server without one refuses to start."""
    given = values.get("api_key") or values.get("api_key_file")
    return bool(
        given or environ.get(f"{ENV_PREFIX}API_KEY") or environ.get(f"{ENV_PREFIX}API_KEY_FILE")
    )


NO_KEY = (
    "warning: the servers listen on every interface, so each needs an API key, and none is"
    f" given: export {ENV_PREFIX}API_KEY before submitting (sbatch passes it on) or add"
    " --api-key-file FILE; without one every server refuses to start"
)


def _port(option: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise SlurmOptionError(option, f"{port} is not a port (1-65535)")


def check(opts: SlurmOptions) -> None:
    """Raise ``SlurmOptionError`` naming the first bad option."""
    if opts.nodes < 1:
        raise SlurmOptionError("--nodes", f"must be at least 1, got {opts.nodes}")
    if opts.cpus_per_task is not None and opts.cpus_per_task < 1:
        raise SlurmOptionError("--cpus-per-task", f"must be at least 1, got {opts.cpus_per_task}")
    if opts.time is not None and not (
        TIME_RE.match(opts.time) or opts.time.upper() in {"UNLIMITED", "INFINITE"}
    ):
        raise SlurmOptionError(
            "--time",
            f"{opts.time!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, "
            "D-HH:MM or D-HH:MM:SS)",
        )
    for option, value in (
        ("--partition", opts.partition),
        ("--account", opts.account),
        ("--job-name", opts.job_name),
    ):
        if value is not None and not NAME_RE.match(value):
            raise SlurmOptionError(option, f"{value!r} has characters Slurm names do not")
    _port("--port", opts.port)
    _port("--engine-port", opts.engine_port)
    for p in opts.llm_ports:
        _port("--llm-port", p)
    if opts.engine_model and opts.engine_port in opts.llm_ports:
        raise SlurmOptionError("--engine-port", f"{opts.engine_port} is also an --llm-port")
    taken = set(opts.llm_ports) | ({opts.engine_port} if opts.engine_model else set())
    if opts.port in taken:
        raise SlurmOptionError("--port", f"{opts.port} is also an inference server's port")
    for url in opts.llm:
        if not url.startswith(("http://", "https://")):
            raise SlurmOptionError("--llm", f"{url!r} is not an http(s) URL")
        try:
            url.format(host="h")
        except (KeyError, IndexError, ValueError) as e:
            raise SlurmOptionError("--llm", f"{url!r}: only {{host}} may be filled in") from e
    if opts.drain_grace_s is not None and opts.drain_grace_s < 0:
        raise SlurmOptionError("--drain-grace-s", "must not be negative")
    for arg in opts.sbatch_args:
        if not arg.startswith("--") or any(c.isspace() for c in arg):
            raise SlurmOptionError("--sbatch-arg", f"{arg!r} is not one --name=value")
    # sbatch splits #SBATCH lines at white space; the shell lines are quoted instead.
    for option, path in (("--workdir", opts.workdir), ("--log-dir", opts.log_dir)):
        if path is not None and any(c.isspace() or c in "\"'" for c in str(path.resolve())):
            raise SlurmOptionError(option, f"{str(path)!r}: #SBATCH lines cannot hold spaces")
    for option, text in (("--python", opts.python), ("--server-list", str(opts.server_list))):
        if "\n" in text:
            raise SlurmOptionError(option, "must not contain a newline")
    serve_values(opts.serve_args)


def node_command(opts: SlurmOptions) -> list[list[str]]:
    """What srun runs on every node, one group of arguments a line; paths absolute, as the
    job's working directory is not where this runs."""
    workdir = opts.workdir.resolve()
    groups = [
        [opts.python, "-m", "raas.deploy.node"],
        ["--port", str(opts.port)],
        ["--server-list", str(opts.server_list.resolve())],
        ["--db-dir", str((opts.db_dir or workdir).resolve())],
        ["--log-dir", str((opts.log_dir or workdir).resolve())],
    ]
    groups += [["--llm", url] for url in opts.llm]
    groups += [["--llm", f"http://{{host}}:{p}"] for p in opts.llm_ports]
    if opts.engine_model:
        groups += [["--engine-model", opts.engine_model], ["--engine-port", str(opts.engine_port)]]
    serve_args = list(opts.serve_args)
    if opts.drain_grace_s is not None:
        serve_args += to_flags({"drain_grace_s": f"{opts.drain_grace_s:g}"})
    if opts.engine_model and "tokenizer" not in serve_values(serve_args):
        serve_args += ["--tokenizer", opts.engine_model]
    return [*groups, ["--", *serve_args]]


def render_sbatch(opts: SlurmOptions) -> str:
    check(opts)
    q = shlex.quote
    workdir = opts.workdir.resolve()
    log_dir = (opts.log_dir or workdir).resolve()
    server_list = opts.server_list.resolve()
    directives = [
        f"--job-name={opts.job_name}",
        f"--nodes={opts.nodes}",
        "--ntasks-per-node=1",
        f"--chdir={workdir}",
        f"--output={log_dir}/raas-%j.out",
    ]
    if opts.partition:
        directives.append(f"--partition={opts.partition}")
    if opts.account:
        directives.append(f"--account={opts.account}")
    if opts.time:
        directives.append(f"--time={opts.time}")
    if opts.cpus_per_task:
        directives.append(f"--cpus-per-task={opts.cpus_per_task}")
    directives += opts.sbatch_args
    srun = ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "--label"]
    if opts.cpus_per_task:
        # srun no longer inherits --cpus-per-task from sbatch (Slurm 22.05).
        srun.append(f"--cpus-per-task={opts.cpus_per_task}")
    node = " \\\n    ".join(" ".join(q(a) for a in group) for group in node_command(opts))
    lines = [
        "#!/bin/bash",
        "# Written by `raas slurm`: one raas server per node; their URLs go to",
        f"# {server_list} once every node answers.",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        "# A list left by an earlier job would send the trainer to servers that are gone.",
        f"rm -f {q(str(server_list))} {q(str(server_list) + '.d')}/node-*.url",
        "# exec: srun is the batch step's main process, so on scancel it waits (up to KillWait)",
        "# for the servers to drain, and a node that fails ends the job (--kill-on-bad-exit).",
        f'exec {" ".join(srun)} --ntasks="$SLURM_JOB_NUM_NODES" \\',
        f"    {node}",
    ]
    return "\n".join(lines) + "\n"


def write_script(opts: SlurmOptions, out: Path) -> None:
    """Render to ``out``, creating the directories Slurm needs before the job starts (the
    working directory, and where its output goes: slurmstepd opens it before the script runs)."""
    script = render_sbatch(opts)
    workdir = opts.workdir.resolve()
    for d in (workdir, (opts.log_dir or workdir).resolve(), out.resolve().parent):
        d.mkdir(parents=True, exist_ok=True)
    out.write_text(script)


def submit(script: Path) -> str:
    """``sbatch`` the script; the job id."""
    try:
        run = subprocess.run(
            ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=120
        )
    except FileNotFoundError as e:
        raise RuntimeError("sbatch is not on PATH: is this a Slurm login node?") from e
    if run.returncode != 0:
        raise RuntimeError(f"sbatch failed ({run.returncode}): {run.stderr.strip()}")
    # --parsable prints "jobid" or "jobid;cluster".
    return run.stdout.strip().split(";")[0]
