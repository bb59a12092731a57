"""SIGTERM to a test run lets the running test's ``finally`` clean up (tests/support/sigterm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raas.sandbox import procs

ROOT = Path(__file__).parent.parent

PROBE = """
import os, subprocess, time
from pathlib import Path

def test_holds_a_process_group():
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        Path(os.environ["PROBE_PID"]).write_text(str(child.pid))
        time.sleep(1000)
    finally:
        os.killpg(child.pid, 9)
        child.wait()
"""


def run_and_terminate(tmp_path: Path, plugin: bool) -> int:
    """Run the probe's test in a pytest of its own, SIGTERM it once the test holds its child,
    and return that child's PID."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    pid_file = tmp_path / f"pid-{plugin}"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    args += ["-p", "tests.support.sigterm"] if plugin else []
    env = {**os.environ, "PROBE_PID": str(pid_file), "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [*args, str(tmp_path / "test_probe.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None and time.monotonic() < deadline, "the probe did not start"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        run.wait(120)
    finally:
        run.kill()
        run.wait()
    return int(pid_file.read_text())


def test_sigterm_runs_the_tests_finally(tmp_path: Path) -> None:
    child = run_and_terminate(tmp_path, plugin=True)
    assert procs.wait_gone({child}, 30) == set()


def test_without_the_plugin_a_sigterm_leaves_the_child(tmp_path: Path) -> None:
    """The control: the leak the plugin closes."""
    child = run_and_terminate(tmp_path, plugin=False)
    try:
        assert procs.alive(child)
    finally:
        procs.kill({child})
