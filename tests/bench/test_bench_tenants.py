"""`raas bench tenants` at tiny sizes: a real `raas serve` a phase, real sandboxes, the fake
model; it runs end to end and prints its table in 80 columns, and a Ctrl-C stops the servers it
started. Its figures are not checked: it prints, it never asserts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from raas.bench import tenants
from raas.cli import main
from tests.support.probe import WAIT_S

TINY = ["--flood", "3", "--rate", "2", "--seconds", "1", "--llm-latency-ms", "10", "--turns", "1"]


def test_it_runs_end_to_end_and_prints_its_table_in_80_columns() -> None:
    # --wait-s: a job of B's not done that long after the last submission counts as not done
    # (the table's 2/2 would fail); each waits for its job, so 5 minutes cost a passing run
    # nothing and a loaded machine never decides the verdict.
    result = CliRunner().invoke(main, ["bench", "tenants", "--", *TINY, "--wait-s", "300"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= tenants.WIDTH for line in lines), result.output
    table = lines[lines.index(tenants.HEADER) :]
    latency = table[1 : table.index(tenants.PARTS_HEADER)]
    rows = {line[:22].strip(): line[22:].split() for line in latency}
    for phase in tenants.LATENCY_PHASES:
        assert rows[phase.name][0] == "2/2", result.output  # each of B's jobs finished
    assert rows["B alone (floor)"][3] == "1.00x"
    assert rows["A+B, one key"][-1] == "3"  # A's flood finished too
    assert any("a/b" in line for line in table) and table[-1].startswith("load average after")


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_ctrl_c_stops_the_server_it_started() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "raas", "bench", "tenants", "--", *TINY, "--seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert bench.stdout is not None
        # The first progress line: the first phase's server is up and B's jobs are running.
        for line in bench.stdout:
            if "done/in flight" in line:
                break
        children = _children(bench.pid)
        serving = [p for p in children if b"serve" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert serving, children
        os.kill(bench.pid, signal.SIGINT)  # what a Ctrl-C at its terminal sends it
        bench.communicate(timeout=WAIT_S * 6)
    finally:
        bench.kill()
    assert not [p for p in children if _alive(p)]
