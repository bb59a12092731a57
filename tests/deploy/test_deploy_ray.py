"""What raas.deploy.ray does without a Ray cluster (and without Ray installed)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raas.cli.serve import serve
from raas.deploy.ray import (
    RAY_MISSING,
    DeploymentError,
    RayDeployment,
    RayNotInstalled,
    guarded,
    serve_args,
)

NO_RAY = "import sys; sys.modules['ray'] = None\n"  # makes `import ray` raise ImportError


def test_raas_imports_without_ray_and_says_how_to_get_it() -> None:
    code = NO_RAY + (
        "import raas, raas.cli, raas.deploy, raas.deploy.ray as r\n"
        "try:\n"
        "    r.RayDeployment({'run_workers': 2}).start()\n"
        "except r.RayNotInstalled as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == RAY_MISSING
    assert "pip install 'raas[ray]'" in RAY_MISSING


def test_every_entry_point_names_the_missing_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    dep = RayDeployment()
    for call in (dep.start, dep.check):
        with pytest.raises(RayNotInstalled, match=r"pip install 'raas\[ray\]'"):
            call()
    dep.stop()  # nothing started: nothing to do, no Ray needed


def test_options_become_flags_that_raas_serve_accepts() -> None:
    args = serve_args(
        {"llm": ["http://a:1", "http://b:2"], "run_workers": 4, "sandbox": "local", "api_key": None}
    )
    assert args == [
        "--llm",
        "http://a:1",
        "--llm",
        "http://b:2",
        "--run-workers",
        "4",
        "--sandbox",
        "local",
    ]
    params = serve.make_context("serve", [*args]).params
    assert params["llm"] == ("http://a:1", "http://b:2")
    assert params["run_workers"] == 4 and params["sandbox"] == "local"


def test_the_key_reaches_the_servers_environment_not_their_command_lines() -> None:
    dep = RayDeployment({"api_key": "ray-key", "run_workers": 2}, env={"X": "1"})
    assert dep.args == ["--run-workers", "2"]
    assert dep.env == {"X": "1", "RAAS_API_KEY": "ray-key"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_wokers": 4}, "--run-wokers: not an option of raas serve"),
        ({"port": 8000}, "sets \\['port'\\] itself"),
        ({"db": "x.db"}, "sets \\['db'\\] itself"),
        ({"run_workers": 0}, "run_workers"),
        ({"sandbox": "docker"}, "sandbox"),
    ],
)
def test_bad_options_fail_on_the_driver(options: dict[str, object], message: str) -> None:
    with pytest.raises(DeploymentError, match=message):
        RayDeployment(options)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_guarded_child_dies_with_its_parent(tmp_path: Path) -> None:
    """The server must not outlive its actor, even one killed with SIGKILL."""
    pidfile = tmp_path / "child.pid"
    sleep = shutil.which("sleep") or "/bin/sleep"
    parent_code = (  # guarded() names its caller as the parent: call it in the parent
        "import subprocess, sys, time\n"
        "from raas.deploy.ray import guarded\n"
        f"p = subprocess.Popen(guarded([{sleep!r}, '60']))\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = int(pidfile.read_text())
        while not Path(f"/proc/{child}/cmdline").read_bytes().startswith(sleep.encode()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        while not _gone(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.02)
    finally:
        parent.kill()
        parent.wait()


def test_a_guarded_child_of_a_parent_already_gone_does_not_start() -> None:
    argv = guarded(["/bin/echo", "started"])
    argv[3] = "1"  # as if its parent had died before the guard ran (it was reparented to pid 1)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert out.returncode == 3 and out.stdout == ""
    ok = subprocess.run(guarded(["/bin/echo", "started"]), capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout == "started\n"
