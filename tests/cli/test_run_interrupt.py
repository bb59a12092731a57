"""Ctrl-C on `raas run`, `raas submit` and `raas demo`, as a terminal sends it (SIGINT to the
foreground process group of a process on a pty): one SIGINT stops the run, cancels its unfinished
jobs on the server, writes the results already finished to --out (the demo: its results file),
and leaves no child of its own."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner

from raas.helpers.sigterm import Terminated, stopped_by_sigterm
from raas.store.sqlite import iter_finished

FIXTURES = Path(__file__).parents[1] / "fixtures"
DEADLINE_S = 120.0  # the embedded engine's start is most of it
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def as_a_foreground_job() -> None:
    """What a shell does for the job it starts in the foreground: SIGINT at its default, no
    signal blocked. An ignored or blocked SIGINT survives exec: a worker of the suite that had
    one (left by a test run before, in the same process) made the run deaf to Ctrl-C, and six
    tests waited out their deadline in a fresh clone's `make test`."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


class Terminal:
    """A command on a pty, in a session of its own (a shell's foreground job), its output
    collected as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        leader, follower = pty.openpty()
        self.proc = subprocess.Popen(
            argv,
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env={**env, "COLUMNS": "120"},
            cwd=cwd,
            start_new_session=True,
            preexec_fn=as_a_foreground_job,
        )
        os.close(follower)
        self._leader = leader
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._leader, 4096)
            except OSError:  # the pty closes when the last process on it exits
                return
            if not data:
                return
            self._chunks.append(data)

    @property
    def output(self) -> str:
        """What it printed, without colours and cursor moves."""
        return ANSI.sub("", b"".join(self._chunks).decode(errors="replace"))

    @property
    def tail(self) -> str:
        return self.output[-3000:]

    def wait_for(self, pattern: str) -> re.Match[str]:
        """Until the output matches ``pattern`` (readiness, bounded by a deadline)."""
        deadline = time.monotonic() + DEADLINE_S
        while (found := re.search(pattern, self.output)) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never printed {pattern!r}:\n{self.tail}")
            time.sleep(0.05)
        return found

    def ctrl_c(self, group: bool = True) -> int:
        """SIGINT to the process group (or, as `kill -INT PID` does, to the process alone),
        once; its exit status (within the deadline)."""
        if group:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGINT)
        return self._exit_status("SIGINT")

    def stop(self, sig: int) -> int:
        """``sig`` to the process alone (`kill`, scancel), once; its exit status."""
        self.proc.send_signal(sig)
        return self._exit_status(signal.Signals(sig).name)

    def _exit_status(self, sent: str) -> int:
        try:
            code = self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"did not stop on one {sent}:\n{self.tail}") from None
        self._reader.join(DEADLINE_S)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()]


def wait_gone(pid: int) -> bool:
    """Whether process ``pid`` (not our child: its parent was the run) has ended within the
    deadline: a pidfd turns readable when it exits."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], DEADLINE_S)
        return bool(readable)
    finally:
        os.close(fd)


@pytest.fixture
def gated_env(tmp_path: Path) -> dict[str, str]:
    """An environment where the gated task is installed (alone: the shared plugin fixture's
    broken entry point would print its traceback in the run's own service)."""
    dist = tmp_path / "site" / "raas_gated-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: raas-gated\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[raas.tasks]\ngated = gated_task:GatedTask\n")
    path = [str(dist.parent), str(FIXTURES), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def gated_tasks(tmp_path: Path) -> Path:
    """Two jobs: `quick` finishes at once, `stuck` runs until cancelled."""
    (tmp_path / "open").touch()
    rows = [
        {"data_source": "gated", "instance_id": "quick", "gate": str(tmp_path / "open")},
        {"data_source": "gated", "instance_id": "stuck", "gate": str(tmp_path / "never")},
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tasks


def stored(out: Path) -> dict[str, str]:
    """The results in ``out``: instance id to state."""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {r["instance_id"]: r["state"] for r in rows}


def said_nothing_wrong(output: str) -> None:
    for bad in ("Traceback", "never awaited", "Aborted!"):
        assert bad not in output, output[-3000:]


def test_sigterm_in_the_loop_cancels_the_run_alone_so_its_cleanup_runs() -> None:
    """kill or scancel: the run's task is cancelled, and the awaits of its cleanup (cancelling
    its jobs on the server, in tasks of their own) still run; then Terminated, and the handler
    from before is back (the example's, for the time outside the loop)."""
    cleaned: list[str] = []

    async def run() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(60)
        finally:
            cleaned.append(await asyncio.create_task(asyncio.sleep(0, "jobs cancelled")))

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("the loop's handler takes SIGTERM while it runs")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(Terminated):
            asyncio.run(stopped_by_sigterm(run()))
        assert cleaned == ["jobs cancelled"]
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(
    ("command", "sig"),
    [("run", signal.SIGINT), ("submit", signal.SIGINT), ("run", signal.SIGTERM)],
    ids=["run", "submit", "run-sigterm"],
)
def test_ctrl_c_against_a_server_cancels_the_unfinished_and_keeps_the_finished(
    command: str, sig: int, start_server: Any, server_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM (kill, scancel, timeout) as Ctrl-C: it killed the run, which wrote nothing."""
    server = start_server(tmp_path / "interrupt.db")
    tasks, out = gated_tasks(tmp_path), tmp_path / "results.jsonl"
    argv = {
        "run": ["run", str(tasks), "--url", server.url],
        "submit": ["submit", server.url, str(tasks)],
    }[command]
    term = Terminal([sys.executable, "-m", "raas", *argv, "--out", str(out)], server_env)
    try:
        term.wait_for(r"\b50%")  # the progress bar: `quick`'s result is in
        code = term.ctrl_c() if sig == signal.SIGINT else term.stop(sig)
    finally:
        term.kill()
    assert code == 128 + sig, term.tail
    assert "stopping: cancelling this run's 1 unfinished job on the server" in term.output
    how = "interrupted" if sig == signal.SIGINT else "stopped by SIGTERM"
    said = f"{how}: the 1 result that had finished is in {out}"
    assert said in " ".join(term.output.split()), term.tail
    said_nothing_wrong(term.output)
    assert stored(out) == {"quick": "done"}
    (result,) = httpx.get(f"{server.url}/v1/rollouts", params={"state": "cancelled"}).json()[
        "results"
    ]
    assert result["instance_id"] == "stuck"  # the cancel reached the server before the exit


def test_ctrl_c_on_a_run_on_the_embedded_engine_stops_the_engine_too(
    gated_env: dict[str, str], tmp_path: Path
) -> None:
    tasks, out = gated_tasks(tmp_path), tmp_path / "run" / "results.jsonl"
    argv = ["run", str(tasks), "--model", "tiny", "--out", str(out)]
    term = Terminal([sys.executable, "-m", "raas", *argv], gated_env)
    try:
        term.wait_for(r"raas serving on http://")
        (engine,) = term.children()  # the in-process service runs no process of its own
        term.wait_for(r"\b50%")
        code = term.ctrl_c()
    finally:
        term.kill()
    assert wait_gone(engine), f"the engine ({engine}) outlived the run:\n{term.tail}"
    assert code == 130, term.tail
    said_nothing_wrong(term.output)
    assert stored(out) == {"quick": "done"}
    states = {r.instance_id: r.state for r in iter_finished(out.parent / "run.db")}
    assert states == {"quick": "done", "stuck": "cancelled"}


@pytest.mark.parametrize("group", [True, False], ids=["ctrl-c", "kill-int"])
def test_an_interrupt_while_the_embedded_engine_starts_stops_it(
    group: bool, gated_env: dict[str, str], tmp_path: Path
) -> None:
    """The engine still loading its model: the run stops at once and takes it along, whether
    the engine got the SIGINT too (a terminal's Ctrl-C) or not (`kill -INT` of the run)."""
    tasks, out = gated_tasks(tmp_path), tmp_path / "run" / "results.jsonl"
    argv = ["run", str(tasks), "--model", "tiny", "--out", str(out)]
    term = Terminal([sys.executable, "-m", "raas", *argv], gated_env)
    try:
        term.wait_for(r"starting the embedded engine")
        deadline = time.monotonic() + DEADLINE_S
        while not (children := term.children()):
            assert time.monotonic() < deadline, term.tail
            time.sleep(0.01)
        (engine,) = children
        code = term.ctrl_c(group)
    finally:
        term.kill()
    assert wait_gone(engine), f"the engine ({engine}) outlived the run:\n{term.tail}"
    assert code == 130, term.tail
    said_nothing_wrong(term.output)
    assert "serving on" not in term.output


def test_ctrl_c_on_the_demo_stops_its_engine_and_keeps_what_finished(tmp_path: Path) -> None:
    """`raas demo` as `raas run`: one line, exit 130, its engine stopped, its unfinished jobs
    cancelled and what finished in its results file (it printed `Aborted!` and kept nothing)."""
    term = Terminal(
        [sys.executable, "-m", "raas", "demo", "--model", "tiny"], dict(os.environ), tmp_path
    )
    try:
        url = term.wait_for(r"raas serving on (http://127\.0\.0\.1:\d+)")[1]
        (engine,) = term.children()
        deadline = time.monotonic() + DEADLINE_S
        # Ctrl-C once its jobs are on the server (the tiny model takes minutes over them).
        while httpx.get(f"{url}/v1/status").json()["in_flight"] < 8:
            assert time.monotonic() < deadline, term.tail
            time.sleep(0.05)
        code = term.ctrl_c()
    finally:
        term.kill()
    assert wait_gone(engine), f"the engine ({engine}) outlived the demo:\n{term.tail}"
    assert code == 130, term.tail
    said_nothing_wrong(term.output)
    assert "cancelled by request" not in term.output  # the service's log: no line a job
    said = re.search(
        r"interrupted: (?:the (\d+) results? that had finished (?:is|are) in (\S+)"
        r"|no result had finished \((\S+) holds none\))",
        term.output,
    )
    assert said is not None, term.tail
    out = tmp_path / (said[2] or said[3])
    kept = stored(out) if out.read_text() else {}
    assert len(kept) == int(said[1] or 0)
    states = {r.instance_id: r.state for r in iter_finished(out.parent / "run.db")}
    assert len(states) == 8 and {states[i] for i in kept} <= {"done", "failed", "timeout"}
    assert all(state == "cancelled" for i, state in states.items() if i not in kept)


def test_ctrl_c_before_a_command_has_work_exits_130_not_aborted() -> None:
    """Ctrl-C while a command is still starting (an engine loading, say): a shell's 130 and
    one word, not click's ``Aborted!`` and 1 (the control: a plain click group)."""
    from raas.cli import Commands

    def starting() -> None:
        raise KeyboardInterrupt

    for cls, code, said in ((Commands, 130, "interrupted"), (click.Group, 1, "Aborted!")):
        group = cls(commands={"start": click.Command("start", callback=starting)})
        result = CliRunner().invoke(group, ["start"])
        assert (result.exit_code, result.output.strip()) == (code, said), cls
