"""`raas bench docs` runs exactly the benchmark runs docs/benchmarks.md quotes, in its order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from raas.bench import docs

ROOT = Path(__file__).resolve().parents[2]


def quoted_runs() -> list[str]:
    """Each ``raas bench ...`` command the page quotes (inline code, possibly wrapped over two
    lines), first quotes only, in the page's order; `raas bench docs` itself left out."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    runs: list[str] = []
    for quoted in re.findall(r"`(raas bench [^`]+)`", text):
        run = " ".join(quoted.split())
        if run not in runs and not run.startswith("raas bench docs"):
            runs.append(run)
    return runs


def test_the_runs_are_the_ones_the_page_quotes_in_its_order() -> None:
    assert [docs.command(name, args) for name, args in docs.RUNS] == quoted_runs()


def test_list_prints_the_runs_and_only_narrows_them() -> None:
    def listed(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "raas", "bench", "docs", "--", "--list", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    every = listed()
    assert every.returncode == 0 and every.stdout.splitlines() == quoted_runs()
    scale = listed("--only", "scale")
    assert scale.stdout.splitlines() == [
        "raas bench scale",
        "raas bench scale -- --servers 1",
        "raas bench scale -- --servers 1 --repeats 1",
        "raas bench scale -- --servers 1 --repeats 3",
    ]
    wrong = listed("--only", "nosuch")
    assert wrong.returncode == 2 and "--only nosuch: the docs quote no such run" in wrong.stderr


def test_each_output_is_headed_by_its_command_and_load_and_a_failure_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run that fails at once (no such benchmark): the plumbing, without an hour of benchmark.
    monkeypatch.setattr(docs, "RUNS", (("nosuch", ("--x", "1")), ("nosuch", ())))
    assert docs.main(["--out", str(tmp_path)]) == 1
    first = (tmp_path / "nosuch.txt").read_text().splitlines()
    assert first[0] == "$ raas bench nosuch -- --x 1"
    assert re.fullmatch(r"# commit \S+, load average \d+\.\d\d at the start", first[1])
    assert "no benchmark 'nosuch'" in "\n".join(first[2:])
    assert (tmp_path / "nosuch-2.txt").read_text().startswith("$ raas bench nosuch\n")
    summary = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"raas bench nosuch -- --x 1 +\d+\.\d\d +\d+ +2", summary[-3])
    assert summary[-1] == f"outputs in {tmp_path}/"


def test_a_benchmark_that_hangs_silently_is_stopped_at_its_deadline_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A "python" that starts a server of its own and then waits, printing nothing.
    pids = tmp_path / "pids"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! > {pids}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(docs.sys, "executable", str(fake))
    monkeypatch.setattr(docs, "RUN_TIMEOUT_S", 3.0)  # a shell's start, many times over
    outcome = docs.run_one("silent", (), tmp_path / "silent.txt")
    assert outcome.code == 124
    for pid in map(int, pids.read_text().split()):  # the benchmark and its server both gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # A zombie of a killed child waits for its reaper: dead all the same.
        assert Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z", pid
