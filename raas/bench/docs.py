"""`raas bench docs`: every benchmark run whose figures docs/benchmarks.md quotes, in one go.

Each run is ``raas bench NAME -- ARGS`` exactly as the docs give it, in their order, one at a
time (each measures its own floor in the same run). Its output goes to the terminal and to
``--out``/NAME.txt (NAME-2.txt for a second run of one benchmark), headed by the command, the
commit, and the machine's load average when it started: the three things a figure in the docs
is given with. A summary table ends it. ``--only NAME`` runs those benchmarks alone; ``--list``
prints the runs. Prints; asserts nothing. Run it on a quiet machine: the docs' figures are
one-run figures, and another job's load moves them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# The runs docs/benchmarks.md quotes, in its order (tests/bench/test_docs.py checks the two
# agree): a benchmark's name and the options after its `--`.
RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pipeline", ()),
    ("pipeline", ("--jobs", "8", "--repeats", "3")),
    ("fork", ()),
    ("tools", ()),
    ("burst", ("--cold",)),
    ("burst", ()),
    ("llm", ()),
    ("dapo", ()),
    ("dapo", ("--median-ms", "500")),
    ("scale", ()),
    ("scale", ("--servers", "1")),
    ("scale", ("--servers", "1", "--repeats", "1")),
    ("scale", ("--servers", "1", "--repeats", "3")),
    ("gateway", ()),
    ("gateway", ("--concurrency", "1")),
    ("soak", ()),
    (
        "soak",
        (
            "--jobs",
            "400",
            "--turns",
            "4",
            "--llm-latency-ms",
            "500",
            "--fault-every",
            "15",
            "--compare-checkpoint-off",
        ),
    ),
    ("soak", ("--jobs", "1000", "--turns", "4", "--fault-every", "15", "--compare-checkpoint-off")),
    ("images", ()),
    ("tenants", ()),
    ("judges", ()),
    ("harbor", ()),
)
# A run that takes longer has hung: the longest here takes a few minutes.
RUN_TIMEOUT_S = 3 * 3600.0


def command(name: str, args: tuple[str, ...]) -> str:
    """The run as the docs write it: ``raas bench NAME`` or ``raas bench NAME -- ARGS``."""
    return f"raas bench {name}" + (" -- " + shlex.join(args) if args else "")


@dataclass
class Outcome:
    run: str
    load: float  # the 1-minute load average when it started
    seconds: float
    code: int  # its exit status (124: past RUN_TIMEOUT_S)
    file: Path


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() or "unknown"


def run_one(name: str, args: tuple[str, ...], out: Path) -> Outcome:
    """Run one benchmark, its output to the terminal and to ``out``."""
    load = os.getloadavg()[0]
    head = f"$ {command(name, args)}\n# commit {commit()}, load average {load:.2f} at the start\n"
    print(head, end="", flush=True)
    begin = time.monotonic()
    with out.open("w") as file:
        file.write(head)
        file.flush()
        # Its own session: the servers a benchmark starts go with it, and the pipe they hold
        # open closes, when it is killed.
        proc = subprocess.Popen(
            [sys.executable, "-m", "raas", "bench", name, "--", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        # The deadline holds for a benchmark that hangs without a line, too.
        deadline = threading.Timer(RUN_TIMEOUT_S, _kill_group, (proc,))
        deadline.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # as it comes: a long benchmark shows its progress
                sys.stdout.write(line)
                file.write(line)
            code = proc.wait(timeout=60)
        finally:
            deadline.cancel()
            if proc.poll() is None:  # Ctrl-C, or a benchmark that would not end
                _kill_group(proc)
                proc.wait()
        if time.monotonic() - begin > RUN_TIMEOUT_S:
            code = 124
    return Outcome(command(name, args), load, time.monotonic() - begin, code, out)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench docs", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("out/bench-docs"))
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="only this benchmark"
    )
    parser.add_argument("--list", action="store_true", help="print the runs, run nothing")
    options = parser.parse_args(argv)
    names = {name for name, _ in RUNS}
    unknown = sorted(set(options.only) - names)
    if unknown:
        parser.error(f"--only {unknown[0]}: the docs quote no such run (have: {sorted(names)})")
    runs = [(n, a) for n, a in RUNS if not options.only or n in options.only]
    if options.list:
        for name, args in runs:
            print(command(name, args))
        return 0
    options.out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    seen: dict[str, int] = {}
    for name, args in runs:
        seen[name] = seen.get(name, 0) + 1
        stem = name if seen[name] == 1 else f"{name}-{seen[name]}"
        outcomes.append(run_one(name, args, options.out / f"{stem}.txt"))
    print(f"\n{'run':<44} {'load':>5} {'seconds':>8} {'exit':>4}")
    for o in outcomes:
        shown = o.run if len(o.run) <= 44 else o.run[:41] + "..."
        print(f"{shown:<44} {o.load:>5.2f} {o.seconds:>8.0f} {o.code:>4}")
    print(f"outputs in {options.out}/")
    return 0 if all(o.code == 0 for o in outcomes) else 1
