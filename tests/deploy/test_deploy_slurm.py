"""The Slurm deployment without Slurm: the sbatch script, its options, the node process and
the server list. The real cluster run is tests/deploy/test_slurm_cluster.py (make test-slurm)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from raas.cli import main
from raas.client import ServerListError, read_server_list
from raas.deploy.slurm import SlurmOptionError, SlurmOptions, node_command, render_sbatch
from raas.helpers.ports import free_port

# The node servers listen on every interface, so they need a key.
KEY = "node-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def options(tmp_path: Path, **kw: object) -> SlurmOptions:
    base: dict[str, object] = {"workdir": tmp_path, "server_list": tmp_path / "servers.txt"}
    return SlurmOptions(**{**base, **kw})  # type: ignore[arg-type]


def test_script_has_the_options_and_one_server_per_node(tmp_path: Path) -> None:
    opts = options(
        tmp_path,
        nodes=4,
        partition="gpu",
        time="1-02:00:00",
        account="proj42",
        cpus_per_task=16,
        port=9000,
        llm=["http://{host}:8100/v1"],
        llm_ports=[8001],
        engine_model="tiny",
        engine_port=8002,
        sbatch_args=["--gres=gpu:8"],
        serve_args=["--run-workers", "64", "--eval-workers=128"],
    )
    script = render_sbatch(opts)
    for directive in (
        "--nodes=4",
        "--ntasks-per-node=1",
        "--partition=gpu",
        "--time=1-02:00:00",
        "--account=proj42",
        "--cpus-per-task=16",
        "--gres=gpu:8",
        f"--chdir={tmp_path}",
        f"--output={tmp_path}/raas-%j.out",
    ):
        assert f"#SBATCH {directive}\n" in script
    assert "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1" in script
    assert "--cpus-per-task=16" in script.split("exec srun", 1)[1]
    # The command srun runs, read back the way bash will read it.
    command = shlex.split(script.split("exec srun", 1)[1].replace("\\\n", " "))
    node = command[command.index(sys.executable) :]
    assert node[1:3] == ["-m", "raas.deploy.node"]
    pairs = dict(zip(node[3::2], node[4::2], strict=False))
    assert pairs["--port"] == "9000" and pairs["--server-list"] == str(tmp_path / "servers.txt")
    assert pairs["--engine-model"] == "tiny" and pairs["--engine-port"] == "8002"
    assert [node[i + 1] for i, a in enumerate(node) if a == "--llm"] == [
        "http://{host}:8100/v1",
        "http://{host}:8001",
    ]
    serve = node[node.index("--") + 1 :]
    assert serve == ["--run-workers", "64", "--eval-workers=128", "--tokenizer", "tiny"]
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


def test_paths_are_absolute_and_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    opts = SlurmOptions(server_list=Path("a list; rm -rf x"), db_dir=Path("dbs"))
    groups = dict((g[0], g[1:]) for g in node_command(opts)[1:-1])
    assert groups["--server-list"] == [str(tmp_path / "a list; rm -rf x")]
    assert groups["--db-dir"] == [str(tmp_path / "dbs")]
    script = render_sbatch(opts)
    assert f"#SBATCH --chdir={tmp_path}\n" in script and "--tokenizer" not in script
    assert shlex.quote(str(tmp_path / "a list; rm -rf x")) in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize(
    ("kw", "option", "says"),
    [
        ({"nodes": 0}, "--nodes", "at least 1"),
        ({"time": "2h"}, "--time", "not a Slurm time limit"),
        ({"partition": "gpu\n#SBATCH --x"}, "--partition", "characters"),
        ({"account": "a b"}, "--account", "characters"),
        ({"port": 70000}, "--port", "not a port"),
        ({"llm_ports": [8000]}, "--port", "inference server's port"),
        ({"engine_model": "tiny", "engine_port": 8000}, "--port", "inference server's port"),
        ({"engine_model": "tiny", "llm_ports": [8001]}, "--engine-port", "also an --llm-port"),
        ({"llm": ["vm:8001"]}, "--llm", "not an http(s) URL"),
        ({"llm": ["http://{node}:8001"]}, "--llm", "only {host}"),
        ({"cpus_per_task": 0}, "--cpus-per-task", "at least 1"),
        ({"drain_grace_s": -1.0}, "--drain-grace-s", "negative"),
        ({"sbatch_args": ["gres=gpu:1"]}, "--sbatch-arg", "one --name=value"),
        ({"sbatch_args": ["--constraint=a b"]}, "--sbatch-arg", "one --name=value"),
        ({"workdir": Path("/tmp/a dir")}, "--workdir", "cannot hold spaces"),
        ({"serve_args": ["--run-workers", "0"]}, "--run-workers", "greater than or equal to 1"),
        ({"serve_args": ["--sandbox=docker"]}, "--sandbox", "(got 'docker')"),
        ({"serve_args": ["--run-wokers", "3"]}, "--run-wokers", "not an option of raas serve"),
        ({"serve_args": ["--db", "x.db"]}, "--db", "--db-dir"),
        ({"serve_args": ["--host", "0"]}, "--host", "set by raas slurm"),
        ({"serve_args": ["--eval-workers"]}, "--eval-workers", "needs a value"),
        ({"serve_args": ["16"]}, "server options", "expected a --flag"),
    ],
)
def test_bad_options_name_the_option(
    tmp_path: Path, kw: dict[str, object], option: str, says: str
) -> None:
    with pytest.raises(SlurmOptionError) as e:
        render_sbatch(options(tmp_path, **kw))
    assert e.value.option == option and str(e.value).startswith(f"{option}: ")
    assert says in str(e.value)


def test_cli_writes_the_script_and_passes_serve_options(tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    run = CliRunner().invoke(
        main,
        [
            "slurm",
            "--nodes",
            "2",
            "--llm-port",
            "8001",
            "--workdir",
            str(tmp_path),
            "-o",
            str(out),
            "--run-workers",
            "32",
            "--",
            "--llm-protocol",
            "sglang",
        ],
    )
    assert run.exit_code == 0, run.output
    script = out.read_text()
    assert "#SBATCH --nodes=2" in script
    assert "-- --run-workers 32 --llm-protocol sglang" in script


def test_cli_says_when_the_servers_would_have_no_key(tmp_path: Path) -> None:
    """The servers listen on every interface, where one without a key refuses to start."""
    base = ["slurm", "--workdir", str(tmp_path), "-o", str(tmp_path / "job.sbatch")]
    no_key = {"RAAS_API_KEY": None, "RAAS_API_KEY_FILE": None}
    bare = CliRunner().invoke(main, base, env=no_key)
    assert bare.exit_code == 0 and "each needs an API key" in bare.output, bare.output
    key_file = tmp_path / "key"
    key_file.write_text("k" * 32)
    for env, args in (({"RAAS_API_KEY": KEY}, []), (no_key, ["--api-key-file", str(key_file)])):
        keyed = CliRunner().invoke(main, [*base, *args], env=env)
        assert keyed.exit_code == 0 and "API key" not in keyed.output, keyed.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nodes", "-1"], "--nodes: must be at least 1"),
        (["--time", "tomorrow"], "--time: 'tomorrow' is not a Slurm time limit"),
        (["--eval-workers", "many"], "--eval-workers: Input should be a valid integer"),
        (["--bogus", "1"], "--bogus: not an option of raas serve"),
    ],
)
def test_cli_bad_options_are_usage_errors(tmp_path: Path, args: list[str], says: str) -> None:
    out = tmp_path / "job.sbatch"
    run = CliRunner().invoke(main, ["slurm", "-o", str(out), *args])
    assert run.exit_code == 2 and says in run.output, run.output
    assert not out.exists()


def test_help_explains_every_option() -> None:
    text = CliRunner().invoke(main, ["slurm", "--help"]).output
    for option in (
        "--nodes",
        "--partition",
        "--time",
        "--account",
        "--port",
        "--llm ",
        "--llm-port",
        "--engine-model",
        "--engine-port",
        "--drain-grace-s",
        "--server-list",
        "--out",
        "--submit",
        "--python",
        "--sbatch-arg",
        "--workdir",
        "--db-dir",
        "--log-dir",
        "scancel",
    ):
        assert option in text, option


def test_read_server_list_waits_for_the_file(tmp_path: Path) -> None:
    path = tmp_path / "servers.txt"
    with pytest.raises(ServerListError, match="no server list"):
        read_server_list(path)
    timer = threading.Timer(
        0.3, path.write_text, ["# two nodes\nhttp://a:8000/\n\nhttp://b:8000\n"]
    )
    timer.start()
    t0 = time.monotonic()
    # A wait of a minute (what a loaded machine may need), ended by the file: read_server_list
    # raises if it runs out; the floor says it did wait for the file, written at 0.3 s.
    assert read_server_list(path, wait=60, poll_s=0.05) == ["http://a:8000", "http://b:8000"]
    assert time.monotonic() - t0 > 0.2
    path.write_text("http://a:8000\nb:8000\n")
    with pytest.raises(ServerListError, match="line 2"):
        read_server_list(path)
    path.unlink()
    with pytest.raises(ServerListError, match=r"after waiting 0\.2 s"):
        read_server_list(path, wait=0.2, poll_s=0.05)


def _node(tmp_path: Path, port: int, *serve_args: str, node_id: int = 0) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raas.deploy.node",
            "--port",
            str(port),
            "--server-list",
            str(tmp_path / "servers.txt"),
            "--db-dir",
            str(tmp_path / str(node_id)),
            "--log-dir",
            str(tmp_path),
            "--llm",
            "http://{host}:1",
            "--expect-nodes",
            "2",
            "--",
            "--drain-grace-s",  # raas serve's, which the node reads too
            "5",
            *serve_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "SLURM_NODEID": str(node_id), "RAAS_API_KEY": KEY},
    )


def test_nodes_list_their_servers_and_drain_on_sigterm(tmp_path: Path) -> None:
    """Two node processes on this host as nodes 0 and 1: node 0 lists both once both answer.
    Outside srun a node forwards SIGTERM itself (under srun, Slurm signals every process)."""
    ports = [free_port(), free_port()]
    procs = [_node(tmp_path, p, "--run-workers", "2", node_id=i) for i, p in enumerate(ports)]
    try:
        urls = read_server_list(tmp_path / "servers.txt", wait=60, poll_s=0.1)
        assert urls == [f"http://{socket.gethostname()}:{p}" for p in ports]
        for port in ports:
            backends = httpx.get(f"http://127.0.0.1:{port}/v1/backends", headers=AUTH).json()
            # The --llm template, with this node's name filled in.
            assert [b["url"] for b in backends] == [f"http://{socket.gethostname()}:1"]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0 and "serve exited with 0" in out, out
    assert not (tmp_path / "servers.txt").exists()
    assert not list((tmp_path / "servers.txt.d").glob("*.url"))


def test_node_that_cannot_start_fails_and_lists_nothing(tmp_path: Path) -> None:
    proc = _node(tmp_path, free_port(), "--sandbox", "nope")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "could not start: serve exited with 2" in out
    assert not (tmp_path / "servers.txt").exists()


def test_a_node_waits_for_its_server_as_long_as_the_server_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain grace has one default, raas serve's; a node reads it as its server will (flag,
    then environment, then --config file), and a flag raas slurm writes reaches both."""
    from raas.deploy.node import drain_grace_s
    from raas.settings import defaults

    monkeypatch.delenv("RAAS_DRAIN_GRACE_S", raising=False)
    assert drain_grace_s([]) == defaults().pipeline.drain_grace_s == 30.0
    config = tmp_path / "raas.toml"
    config.write_text("drain_grace_s = 7\n")
    assert drain_grace_s(["--config", str(config)]) == 7.0
    monkeypatch.setenv("RAAS_DRAIN_GRACE_S", "9")
    assert drain_grace_s(["--config", str(config)]) == 9.0
    assert drain_grace_s(["--drain-grace-s=11", "--run-workers", "0"]) == 30.0  # refused: default
    serve = node_command(options(tmp_path, drain_grace_s=12.0))[-1]
    assert serve[-2:] == ["--drain-grace-s", "12"] and drain_grace_s(serve[1:]) == 12.0
