"""The command line: help, usage errors, the serve options generated from the settings."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.cli import main
from raas.helpers.ports import free_port
from raas.settings import FIELDS
from raas.store.sqlite import connect
from raas.wire import RolloutRequest
from tests.api.test_dashboard import SEARCHED, store_results


def test_serve_help_shows_each_default_once_from_the_model() -> None:
    text = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    for name, info in FIELDS.items():
        option = "--" + name.replace("_", "-")
        assert len(re.findall(rf"(?:^| ){option} (?:[A-Z]+|\[)", text)) == 1, option
        default = info.get_default(call_default_factory=True)
        # A default that depends on the machine ($HOME) is said in words by its description.
        said = "[default: " in (info.description or "")
        if default not in (None, []):
            assert said or f"[default: {default}]" in text, name


def test_help_explains_the_commands() -> None:
    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0
    for command in ("serve", "status", "submit", "export", "bench", "demo"):
        assert command in top.output
    serve = runner.invoke(main, ["serve", "--help"])
    assert "--run-workers" in serve.output and "RAAS_" in serve.output


def test_every_command_is_said_whole_in_80_columns() -> None:
    from raas.cli.bench import known

    listing = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    commands = listing.split("Commands:\n", 1)[1].splitlines()
    assert len(commands) == len(main.commands)
    assert all(len(line) <= 80 and not line.endswith("...") for line in commands), listing
    bench_help = CliRunner().invoke(main, ["bench", "--help"]).output
    assert ", ".join(known()[:-1]) + " or " + known()[-1] in " ".join(bench_help.split())


def test_serve_refuses_bad_settings_with_a_usage_error() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "raas", "serve", "--run-workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "run_workers" in run.stderr


def test_bench_names_what_exists() -> None:
    result = CliRunner().invoke(main, ["bench", "nope"])
    assert result.exit_code == 2 and "pipeline" in result.output


def test_export_writes_the_format_its_file_names(tmp_path: Path) -> None:
    runner = CliRunner()
    csv = runner.invoke(main, ["datasets", "export", "math", "--out", str(tmp_path / "m.csv")])
    assert csv.exit_code == 2 and "write a .jsonl or a .parquet file (not .csv)" in csv.output
    assert not (tmp_path / "m.csv").exists()
    parquet = tmp_path / "m.parquet"
    assert runner.invoke(main, ["datasets", "export", "math", "--out", str(parquet)]).exit_code == 0
    assert parquet.read_bytes()[:4] == b"PAR1"
    db = tmp_path / "raas.db"
    connect(db).close()
    clash = runner.invoke(
        main, ["export", "--db", str(db), "--format", "jsonl", "--out", str(tmp_path / "r.parquet")]
    )
    assert clash.exit_code == 2 and "is a .parquet file but --format is jsonl" in clash.output
    by_suffix = runner.invoke(main, ["export", "--db", str(db), "--out", str(tmp_path / "r.jsonl")])
    assert by_suffix.exit_code == 0 and "wrote 0 results" in by_suffix.output
    # A key typed with --db would pick nothing (the file is read whole): said, not ignored; a
    # key in RAAS_API_KEY, as a shell keeps it for --server, is not typed.
    out = ["--out", str(tmp_path / "k.jsonl")]
    typed = runner.invoke(main, ["export", "--db", str(db), "--api-key", "k", *out])
    assert typed.exit_code == 2 and "--api-key is for --server" in typed.output
    kept = runner.invoke(main, ["export", "--db", str(db), *out], env={"RAAS_API_KEY": "k"})
    assert kept.exit_code == 0


def test_export_takes_the_dashboards_filters(tmp_path: Path) -> None:
    db = tmp_path / "raas.db"
    asyncio.run(store_results(db, SEARCHED))
    runner = CliRunner()

    def exported(*args: str) -> list[str]:
        out = tmp_path / "r.jsonl"
        cli = runner.invoke(main, ["export", "--db", str(db), "--out", str(out), *args])
        assert cli.exit_code == 0, cli.output
        return [json.loads(line)["job_id"] for line in out.read_text().splitlines()]

    assert exported() == [r.job_id for r in SEARCHED]  # the control: every result
    assert exported("--search", "PROBE") == ["run-9", "run-10", "run-11"]
    assert exported("--search", "my_set") == ["run-9"]  # `_` is itself
    assert exported("--data-source", "myXset") == ["run-10", "run-11"]
    assert exported("--error-type", "SandboxDied") == ["run-8"]
    assert exported("--min-reward", "0.25", "--max-reward", "0.75") == ["run-10"]
    assert exported("--state", "done", "--max-reward", "0", "--search", "got 12") == ["run-9"]
    text = " ".join(runner.invoke(main, ["export", "--help"]).output.split())
    for option in ("--data-source", "--error-type", "--min-reward", "--max-reward", "--search"):
        assert f"{option} " in text, option
    out = ["--out", str(tmp_path / "bad.jsonl")]
    for args, said in (
        (["--search", "x" * 201], "Invalid value for '--search': 201 characters: at most 200"),
        (["--min-reward", "nan"], "Invalid value for '--min-reward': nan is not a finite number"),
    ):
        refused = runner.invoke(main, ["export", "--db", str(db), *out, *args])
        assert refused.exit_code == 2 and said in refused.output, refused.output
    assert not (tmp_path / "bad.jsonl").exists()


def test_replay_alone_says_why_it_needs_the_tasks(tmp_path: Path) -> None:
    stored = tmp_path / "results.jsonl"
    stored.write_text("")
    result = CliRunner().invoke(main, ["run", "--replay", str(stored)])
    assert result.exit_code == 2
    assert "re-scores stored results against the tasks they came from" in result.output


def test_a_wrong_server_address_is_one_line_that_says_what_to_do() -> None:
    port = free_port()  # nothing listens there
    down = CliRunner().invoke(main, ["status", f"http://127.0.0.1:{port}"])
    assert down.exit_code == 1
    assert down.output.startswith(f"Error: no raas server is answering at http://127.0.0.1:{port}/")
    assert "raas serve --port PORT" in down.output and len(down.output.splitlines()) == 1
    bare = CliRunner().invoke(main, ["status", f"127.0.0.1:{port}"])
    assert bare.exit_code == 1 and "give it as http://HOST:PORT" in bare.output


def test_submit_to_no_server_says_so_without_a_progress_line_after(tmp_path: Path) -> None:
    """The job count, then the error; no "0/1 finished" between them, as if it had run."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"data_source": "math", "problem": "1+1?", "answer": "2"}) + "\n")
    url = f"http://127.0.0.1:{free_port()}"
    out = str(tmp_path / "results.jsonl")
    result = CliRunner().invoke(main, ["submit", url, str(tasks), "--out", out])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0] == "tasks.jsonl: 1 job", result.output
    assert lines[-1].startswith(f"Error: no raas server is answering: {url}"), result.output
    assert not any("finished" in line for line in lines), result.output


def test_a_server_that_breaks_off_its_answer_is_not_called_absent() -> None:
    import socket
    import threading

    def answer_half(listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        threading.Thread(target=answer_half, args=(listener,), daemon=True).start()
        port = listener.getsockname()[1]
        result = CliRunner().invoke(main, ["status", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1
    assert result.output.startswith(
        f"Error: the server at http://127.0.0.1:{port}/ closed the connection mid-answer"
    )


@pytest.mark.parametrize(
    "command", [["serve", "--db", "{tmp}/busy.db"], ["engine", "--model", "oracle"]]
)
def test_a_busy_port_is_one_line_before_anything_starts(
    command: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        args = [a.format(tmp=tmp_path) for a in command] + ["--port", str(port)]
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert (
        result.output
        == f"Error: 127.0.0.1:{port} is in use (pass --port N, or stop what holds it)\n"
    )
    assert "ready" not in caplog.text and not (tmp_path / "busy.db").exists()


def test_a_database_from_a_newer_raas_is_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raas.api.server import DrainingServer
    from raas.store.schema import VERSION

    def started(self: DrainingServer) -> None:
        raise AssertionError("the server started on a database it cannot read")

    monkeypatch.setattr(DrainingServer, "run", started)
    db = tmp_path / "newer.db"
    connect(db).close()
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    said = (
        f"Error: {db} was written by a newer raas (store version {VERSION + 1}; this raas reads"
        f" up to {VERSION}): upgrade raas to open it\n"
    )
    serve = ["serve", "--db", str(db), "--port", str(free_port())]
    export = ["export", "--db", str(db), "--out", str(tmp_path / "r.jsonl")]
    for args in (serve, export):
        result = CliRunner().invoke(main, args)
        assert (result.exit_code, result.output) == (1, said), args


def test_a_server_without_a_key_binds_loopback_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raas.api.server import DrainingServer

    served: list[str] = []
    monkeypatch.setattr(DrainingServer, "run", lambda self: served.append(self.config.host))
    for name in ("RAAS_API_KEY", "RAAS_API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    db = tmp_path / "open.db"
    serve = ["serve", "--db", str(db), "--port", str(free_port())]
    for host in ("0.0.0.0", "::"):
        result = CliRunner().invoke(main, [*serve, "--host", host])
        assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
        assert f"--host {host} without an API key" in result.output
        assert "RAAS_API_KEY or --api-key-file" in result.output
    assert served == [] and not db.exists()
    assert CliRunner().invoke(main, [*serve, "--host", "localhost"]).exit_code == 0
    monkeypatch.setenv("RAAS_API_KEY", "a-key-of-this-server")
    assert CliRunner().invoke(main, [*serve, "--host", "0.0.0.0"]).exit_code == 0
    assert served == ["localhost", "0.0.0.0"]


def test_a_key_given_as_a_flag_is_said_to_be_visible_to_everyone() -> None:
    warning = "--api-key on the command line is visible to every user of this machine"
    serve = CliRunner().invoke(main, ["serve", "--api-key", "k3y", "--run-workers", "0"])
    assert serve.exit_code == 2 and warning in serve.output and "--api-key-file" in serve.output
    jobs = CliRunner().invoke(main, ["jobs", "http://127.0.0.1:9", "--api-key", "k3y"])
    assert warning in jobs.output and "RAAS_API_KEY" in jobs.output
    quiet = CliRunner().invoke(main, ["jobs", "http://127.0.0.1:9"], env={"RAAS_API_KEY": "k3y"})
    assert quiet.exit_code == 1 and warning not in quiet.output


# A job's text that a terminal would act on: an escape sequence that retitles the window, a
# bell, and rich markup.
EVIL = "\x1b]0;pwned\x07[red]x[/red]"
SHOWN = "\\x1b]0;pwned\\x07[red]x[/red]"


def test_job_data_is_printed_as_text_not_as_terminal_codes_or_markup(tmp_path: Path) -> None:
    from fastapi import FastAPI

    from raas.api.app import create_app
    from raas.settings import validate
    from tests.support.llm_servers import ServerThread

    tasks = tmp_path / "t.jsonl"
    instance = {"data_source": "countdown", "numbers": [2, 5, 10], "target": 20}
    tasks.write_text(json.dumps({**instance, "instance_id": EVIL}) + "\n")
    running = {"job_id": "j-1", "data_source": EVIL, "state": "run", "stage": "run"}
    running |= {"turns": 1, "response_tokens": 2, "elapsed_s": 3.0, "attempts": 1}
    listing = FastAPI()  # a server whose running job says so
    listing.add_api_route("/v1/rollouts:running", lambda: {"jobs": [running]}, methods=["GET"])
    servers = [ServerThread(create_app(validate({"db": tmp_path / "r.db"}))), ServerThread(listing)]
    raas, fake = (s.start() for s in servers)
    wide = {"COLUMNS": "200"}
    try:
        ran = CliRunner().invoke(
            main,
            ["run", str(tasks), "--url", raas.url, "--out", str(tmp_path / "r.jsonl")],
            env=wide,
        )
        listed = CliRunner().invoke(main, ["jobs", fake.url], env=wide)
    finally:
        for server in servers:
            server.stop()
    for result in (ran, listed):
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\x07" not in result.output
        assert SHOWN in result.output, result.output


def test_jobs_lists_a_job_a_line_in_80_columns() -> None:
    from fastapi import FastAPI

    from tests.support.llm_servers import ServerThread

    swe = {"job_id": "9f1c2b7e4d3a4c5b8e6f7a1b2c3d4e5f", "instance_id": "django__django-11099"}
    swe |= {"data_source": "princeton-nlp/SWE-bench_Verified", "task": "swe", "state": "run"}
    swe |= {"stage": "run", "turns": 3, "prompt_tokens": 1834, "response_tokens": 2210}
    swe |= {"elapsed_s": 123.4, "attempts": 1}
    queued = {"job_id": "0a1b2c3d4e5f60718293a4b5c6d7e8f9", "data_source": "openai/gsm8k"}
    queued |= {"task": "math", "state": "queued", "stage": "init", "turns": 0}
    queued |= {"response_tokens": 0, "elapsed_s": 2.0, "attempts": 2}
    listing = FastAPI()
    listing.add_api_route("/v1/rollouts:running", lambda: {"jobs": [swe, queued]}, methods=["GET"])
    server = ServerThread(listing).start()
    try:
        narrow, wide = (
            CliRunner().invoke(main, ["jobs", server.url], env={"COLUMNS": str(width)})
            for width in (80, 200)
        )
    finally:
        server.stop()
    for listed in (narrow, wide):
        assert listed.exit_code == 0, listed.output
    lines = narrow.output.splitlines()
    assert max(map(len, lines)) <= 80, narrow.output
    # One line a job, the numbers whole; the ids cut with an ellipsis, never folded.
    (django,) = (line for line in lines if line.startswith("django__"))
    assert re.search(r"\brun\s+3\s+2210\s+1834\s+123 s\s+1\s", django), django
    (gsm8k,) = (line for line in lines if line.startswith("- "))
    assert re.search(r"\bqueued\s+0\s+0\s+0\s+2 s\s+2\s", gsm8k), gsm8k
    assert "…" in django and len(lines) == 5  # title, head, rule, two jobs
    # Wide enough, nothing is cut: the instance, the dataset and its task, the job id.
    (row,) = (line for line in wide.output.splitlines() if line.startswith("django__"))
    assert "django__django-11099  princeton-nlp/SWE-bench_Verified (swe)  run" in row
    assert row.endswith(swe["job_id"]) and "…" not in wide.output


def test_serve_refuses_a_tokenizer_it_cannot_load(tmp_path: Path) -> None:
    from raas.llm.models import tokenizer_missing

    assert tokenizer_missing("smollm2") is None
    assert "holds no tokenizer.json" in str(tokenizer_missing(str(tmp_path)))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tokenizer_missing(str(tmp_path)) is None
    result = CliRunner().invoke(main, ["serve", "--tokenizer", "Org/NotCached-1B"])
    assert result.exit_code == 2
    assert "--tokenizer Org/NotCached-1B: neither a directory nor a hub id" in result.output


def test_serve_warns_of_a_sandbox_program_that_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from raas.cli.serve import check_sandbox

    monkeypatch.setenv("PATH", str(tmp_path))  # neither apptainer, singularity nor bwrap
    for provider, said in (
        ("apptainer", "apptainer (or singularity) is not on PATH"),
        ("bwrap", "bubblewrap is not installed"),
    ):
        check_sandbox(provider)
        err = capsys.readouterr().err
        assert err.startswith(f"warning: --sandbox {provider}: {said}"), err
        assert "Every job that needs a sandbox will fail." in err
    check_sandbox("local")  # needs no program
    assert capsys.readouterr().err == ""
    for name in ("apptainer", "bwrap"):  # the control: installed, nothing is said
        program = tmp_path / name
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
        check_sandbox(name)
        assert capsys.readouterr().err == ""


def test_progress_without_a_terminal_is_lines_even_when_nothing_finishes() -> None:
    import asyncio
    import io

    from rich.console import Console

    from raas.cli.progress import Counting
    from raas.wire import RolloutResult, Timing, Trajectory

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=100)
    failed = RolloutResult(
        job_id="j",
        state="failed",
        trajectory=Trajectory(),
        data_source="x",
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
    )

    async def run() -> None:
        with Counting(console, 2, "tasks.jsonl", every_s=0.01) as progress:
            for _ in range(1000):  # the ticker speaks while no job has finished
                if "0/2 finished" in out.getvalue():
                    break
                await asyncio.sleep(0.01)
            progress.advance(failed)
            progress.advance(None)

    asyncio.run(run())
    lines = out.getvalue().splitlines()
    assert lines[0] == "tasks.jsonl: 2 jobs"
    assert any(line.startswith("tasks.jsonl: 0/2 finished (0 not done)") for line in lines)
    assert lines[-1].startswith("tasks.jsonl: 2/2 finished (1 not done)")


def test_raas_runs_progress_counts_finished_and_running_and_the_mean_reward() -> None:
    import io

    from rich.console import Console

    from raas.run import RunProgress
    from raas.wire import RolloutResult, Timing, Trajectory

    def result(state: str, reward: float | None) -> RolloutResult:
        timing = Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0)
        traj = Trajectory()
        return RolloutResult(
            job_id="j", state=state, reward=reward, trajectory=traj, data_source="x", timing=timing
        )

    results = [result("done", 1.0), result("done", 0.0), result("failed", None)]
    log = io.StringIO()  # off a terminal: a line each time (every_s=0)
    with RunProgress(Console(file=log, force_terminal=False, width=120), 4, "rollouts", 0) as p:
        for r in results:
            p.advance(r)
    lines = [line.rsplit(", ", 1)[0] for line in log.getvalue().splitlines()]
    assert lines == [
        "rollouts: 4 jobs",
        "rollouts: 1/4 finished, 3 running (0 tokens so far), mean reward 1.000 (1 passed)",
        "rollouts: 2/4 finished, 2 running (0 tokens so far), mean reward 0.500 (1 passed)",
        "rollouts: 3/4 finished, 1 running (0 tokens so far), mean reward 0.500 (1 passed)"
        ", 1 not done",
        "rollouts: 3/4 finished, 1 running (0 tokens so far), mean reward 0.500 (1 passed)"
        ", 1 not done",  # at exit
    ], log.getvalue()

    screen = io.StringIO()  # on a terminal: the bar says the same
    terminal = Console(file=screen, force_terminal=True, width=120)
    with RunProgress(terminal, 4, "rollouts") as p:
        for r in results[:2]:
            p.advance(r)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert (
        "rollouts: 2/4 finished, 2 running (0 tokens so far), mean reward 0.500 (1 passed)" in shown
    ), shown
    assert "50%" in shown and "0:00:0" in shown  # the share and the time elapsed, no ETA


async def test_raas_runs_progress_shows_the_tokens_its_running_jobs_generate() -> None:
    import io

    from rich.console import Console

    from raas.run import RunProgress
    from raas.wire import RunningJob

    def job(job_id: str, tokens: int) -> RunningJob:
        return RunningJob(
            job_id=job_id,
            data_source="x",
            state="run",
            turns=0,
            response_tokens=tokens,
            elapsed_s=1.0,
        )

    listed = [[job("a", 3), job("other-run", 50)], [job("a", 7), job("b", 2)]]
    calls = 0
    second = asyncio.Event()

    async def running() -> list[RunningJob]:
        nonlocal calls
        calls += 1
        if calls >= 2:
            second.set()  # the watch counts this listing before it next yields
        return listed[min(calls, 2) - 1]

    progress = RunProgress(Console(file=io.StringIO(), force_terminal=False), 2, "rollouts")
    assert "2 running (0 tokens so far)," in progress.line()
    watch = asyncio.create_task(progress.watch(running, {"a", "b"}, every_s=0))
    await asyncio.wait_for(second.wait(), 30)
    watch.cancel()
    # Another run's jobs on the same server are not counted; a stalled turn would stand still.
    assert progress.generating == 9
    assert "2 running (9 tokens so far), mean reward -" in progress.line()


def test_raas_run_on_the_cpu_engine_sizes_sampling_for_it_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --url or --llm raas run starts the CPU engine: jobs get 256 tokens a turn and 4
    turns under the user's own params, and it says so; with a server given, the tasks' own."""
    import raas.run

    sent: list[RolloutRequest] = []

    async def capture(requests: list[RolloutRequest], *args: object) -> tuple[list[object], float]:
        sent.extend(requests)
        return [], 0.0

    monkeypatch.setattr(raas.run, "run_tasks", capture)
    out = str(tmp_path / "r.jsonl")
    base = ["run", "--bundled", "math", "--limit", "1", "--out", out]
    cpu = CliRunner().invoke(main, [*base, "--sampling-params", '{"max_turns": 2}'])
    assert cpu.exit_code == 0, cpu.output
    assert "256 tokens a turn, 2 turns" in " ".join(cpu.output.split())
    assert sent.pop().sampling_params == {"max_tokens": 256, "max_turns": 2}
    remote = CliRunner().invoke(main, [*base, "--url", "http://127.0.0.1:9"])
    assert remote.exit_code == 0, remote.output
    assert "tokens a turn" not in remote.output
    assert sent.pop().sampling_params == {}
    bad = CliRunner().invoke(main, [*base, "--sampling-params", "[1]"])
    assert bad.exit_code == 2 and "--sampling-params: give a JSON object" in bad.output


def test_raas_run_cpu_sampling_gives_each_task_only_the_keys_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every bundled set, and a file mixing math and countdown, passes its tasks' validation
    with raas run's CPU defaults (countdown takes no max_tokens: it was refused for a key the
    user never gave); a key the user gives a task that does not take it is still refused, by
    name and before the engine starts (the control)."""
    import raas.run
    from raas.tasks import TaskRegistry
    from raas.tasks.datasets import BUNDLED
    from raas.tasks.protocol import TaskJob, validate_request

    sent: list[RolloutRequest] = []

    async def capture(requests: list[RolloutRequest], *args: object) -> tuple[list[object], float]:
        sent.extend(requests)
        return [], 0.0

    monkeypatch.setattr(raas.run, "run_tasks", capture)
    monkeypatch.setattr(raas.run.EngineProcess, "__init__", None)  # nothing may start one
    out = ["--out", str(tmp_path / "r.jsonl")]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        '{"data_source": "math", "prompt": "1 + 1?", "answer": "2"}\n'
        '{"data_source": "countdown", "numbers": [2, 5, 10], "target": 20}\n'
    )
    registry = TaskRegistry.from_entry_points()
    runs = [["--bundled", name, "--limit", "2"] for name in sorted(BUNDLED)] + [[str(mixed)]]
    assert ["--bundled", "countdown", "--limit", "2"] in runs
    for args in runs:
        result = CliRunner().invoke(main, ["run", *args, *out])
        assert result.exit_code == 0 and "unknown key" not in result.output, (args, result.output)
        assert sent, args
        for request in sent:
            source = request.instance["data_source"]
            validate_request(
                registry.get(source), TaskJob("", request.instance, request.sampling_params)
            )
            assert request.sampling_params["max_turns"] == 4  # the CPU default, to every task
            assert ("max_tokens" in request.sampling_params) == (source != "countdown")
        sent.clear()
    bad = CliRunner().invoke(
        main, ["run", str(mixed), *out, "--sampling-params", '{"max_tokens": 9}']
    )
    assert bad.exit_code == 2 and not sent, bad.output
    said = " ".join(bad.output.split())
    assert "mixed.jsonl:2: sampling_params.max_tokens: unknown key (countdown takes" in said, said


def test_submit_and_run_say_what_a_server_answered_not_that_none_is_running(
    tmp_path: Path,
) -> None:
    """A key the server refuses (401) or a URL with a path (404) is the server's answer and
    what to do, and --api-key / RAAS_API_KEY reaches `raas run --url` too."""
    from raas.api.app import create_app
    from raas.settings import validate
    from tests.support.llm_servers import ServerThread

    keyed = create_app(validate({"db": tmp_path / "keyed.db", "api_key": "sesame"}))
    server = ServerThread(keyed).start()
    bare = ServerThread(create_app(validate({"db": tmp_path / "bare.db"}))).start()
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"data_source": "countdown", "numbers": [2, 5, 10], "target": 20}\n')
    out = ["--out", str(tmp_path / "r.jsonl")]
    try:
        for argv, wants in [
            (["submit", server.url, str(tasks), *out], ["401", "--api-key KEY"]),
            (["run", str(tasks), "--url", server.url, *out], ["401", "--api-key KEY"]),
            (["submit", bare.url + "/v1/rollouts", str(tasks), *out], ["404", "base URL"]),
            (["submit", bare.url.removeprefix("http://"), str(tasks), *out], ["http://"]),
        ]:
            result = CliRunner().invoke(main, argv)
            last = result.output.strip().splitlines()[-1]
            assert result.exit_code == 1 and "Traceback" not in result.output, result.output
            assert all(w in last for w in wants) and "is answering" not in last, last
        ok = CliRunner().invoke(
            main, ["run", str(tasks), "--url", server.url, *out], env={"RAAS_API_KEY": "sesame"}
        )
        assert ok.exit_code == 0 and "done 1" in ok.output, ok.output
    finally:
        server.stop()
        bare.stop()


def test_raas_run_refuses_a_model_it_cannot_start_in_one_line() -> None:
    result = CliRunner().invoke(main, ["run", "--bundled", "math", "--model", "orcle"])
    assert result.exit_code == 2, result.output
    assert "'orcle' is not a model: smollm2, tiny, oracle" in " ".join(result.output.split())
    demo = CliRunner().invoke(main, ["demo", "--model", "orcle"])  # before a run dir is made
    assert demo.exit_code == 2 and "'orcle' is not a model" in demo.output, demo.output
    bad = CliRunner().invoke(main, ["run", "--bundled", "math", "--sampling-params", "t=1"])
    assert bad.exit_code == 2 and "--sampling-params" in bad.output and "JSON" in bad.output


def test_an_engine_that_cannot_load_its_model_is_one_line_naming_its_error(
    tmp_path: Path,
) -> None:
    """A model directory transformers cannot read: the engine's last word and its log, not the
    traceback above it."""
    model = tmp_path / "mine"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = str(tmp_path / "run" / "results.jsonl")
    result = CliRunner().invoke(
        main, ["run", "--bundled", "math", "--limit", "1", "--model", str(model), "--out", out]
    )
    assert result.exit_code != 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(said) == 1 and "Traceback" not in result.output, result.output
    assert re.search(r"raas engine exited with 1: ValueError: Unrecognized model", said[0])
    assert re.search(r"\(its log: .*engine\.log\)$", said[0]), said[0]


def test_a_verl_code_row_runs_alike_through_run_submit_and_the_api(tmp_path: Path) -> None:
    """A verl-format contest row (chat prompt, tests in reward_model.ground_truth), as JSONL
    and as Parquet: `raas run` and `raas submit` send it as POST /v1/rollouts takes it, so all
    of them run it (here to the same end: no model is registered) and none answers a 422."""
    import httpx
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raas.api.app import create_app
    from raas.settings import validate
    from tests.support.llm_servers import ServerThread

    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    row = {
        "data_source": "codecontests",
        "prompt": [{"role": "user", "content": "Print the sum of two integers."}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
        "extra_info": {"index": 7, "split": "train"},
    }
    jsonl, parquet = tmp_path / "code.jsonl", tmp_path / "code.parquet"
    jsonl.write_text(json.dumps(row) + "\n")
    pq.write_table(pa.Table.from_pylist([row]), parquet)
    app = create_app(validate({"db": tmp_path / "r.db", "max_attempts": 1}))  # no LLM
    server = ServerThread(app).start()
    try:
        posted = httpx.post(f"{server.url}/v1/rollouts", json={"instance": row})
        assert posted.status_code == 202, posted.text
        for n, argv in enumerate(
            [
                ["run", str(jsonl), "--url", server.url],
                ["run", str(parquet), "--url", server.url],
                ["submit", server.url, str(jsonl)],
                ["submit", server.url, str(parquet)],
            ]
        ):
            out = tmp_path / f"r{n}.jsonl"
            result = CliRunner().invoke(main, [*argv, "--out", str(out)])
            last = result.output.strip().splitlines()[-1]
            assert "NoBackendAvailable" in last and "Traceback" not in result.output, argv
            (stored,) = [json.loads(line) for line in out.read_text().splitlines()]
            assert stored["instance_id"] == "codecontests-7" and stored["task"] == "code", argv
    finally:
        server.stop()


def test_replay_scores_each_result_against_its_own_task_without_instance_ids(
    tmp_path: Path,
) -> None:
    from raas.wire import RolloutResult, Timing, Trajectory

    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"data_source": "math", "problem": "1 + 1?", "answer": "2"},
        {"data_source": "math", "problem": "2 + 3?", "answer": "5"},
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stored = tmp_path / "results.jsonl"
    results = [
        RolloutResult(
            job_id=f"j{i}",
            state="done",
            reward=0.0,
            data_source="math",
            metrics={"artifact": {"answer": row["answer"]}},  # each right for its own task
            trajectory=Trajectory(),
            timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
        )
        for i, row in enumerate(rows)
    ]
    stored.write_text("".join(r.model_dump_json() + "\n" for r in results))
    replay = CliRunner().invoke(main, ["run", str(tasks), "--replay", str(stored)])
    assert replay.exit_code == 0, replay.output
    lines = [line for line in replay.output.splitlines() if "re-scored" in line]
    assert lines == ["j0: stored reward 0.0, re-scored 1.0", "j1: stored reward 0.0, re-scored 1.0"]
    stored.write_text(results[1].model_dump_json() + "\n")  # one of two: no place to go by
    alone = CliRunner().invoke(main, ["run", str(tasks), "--replay", str(stored)])
    assert "skipping j1: no task at its place" in " ".join(alone.output.split())
    # A line that is not a result: one line naming the file and line, no traceback.
    stored.write_text(results[0].model_dump_json() + "\n" + '{"job_id": 3}\n')
    bad = CliRunner().invoke(main, ["run", str(tasks), "--replay", str(stored)])
    assert bad.exit_code == 1 and "Traceback" not in bad.output, bad.output
    assert f"{stored}:2: " in " ".join(bad.output.split()), bad.output


def test_errors_name_what_was_meant_where_it_was_and_stay_short(tmp_path: Path) -> None:
    """An inference server given as --url is said to be one (not "without a path": there is
    none); a refused task is named by its line (from 1), not its place in the batch (from 0);
    a data_source that differs by its ORG/ is guessed, on one short line."""
    from raas.api.app import create_app
    from raas.settings import validate
    from tests.support.llm_servers import FakeBackend, ServerThread

    tasks = tmp_path / "t.jsonl"
    good = {"data_source": "math", "problem": "1 + 1?", "answer": "2"}
    tasks.write_text(
        json.dumps(good) + "\n\n" + json.dumps({**good, "data_source": "gsm8k"}) + "\n"
    )
    out = ["--out", str(tmp_path / "r.jsonl")]
    engine = ServerThread(FakeBackend("vllm").app).start()
    raas = ServerThread(create_app(validate({"db": tmp_path / "r.db"}))).start()
    try:
        wrong = CliRunner().invoke(main, ["run", str(tasks), "--url", engine.url, *out])
        refused = CliRunner().invoke(main, ["submit", raas.url, str(tasks), *out])
    finally:
        engine.stop()
        raas.stop()
    assert wrong.exit_code == 1 and "without a path" not in wrong.output, wrong.output
    assert f"{engine.url} is not a raas server" in wrong.output
    line = refused.output.strip().splitlines()[-1]
    # The last line, the error: short beyond the file's own path (the machine's temp dir).
    assert refused.exit_code == 1 and len(line.replace(str(tasks), "t.jsonl")) < 260, line
    assert f"{tasks}:3: instance.data_source: no task handler for data_source 'gsm8k'" in line
    assert "did you mean 'openai/gsm8k'?" in line and "jobs.1" not in line


def test_each_run_writes_its_results_in_a_directory_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import raas.run
    from raas.helpers.files import new_run_dir

    async def nothing(*args: object) -> tuple[list[object], float]:
        return [], 0.0

    monkeypatch.setattr(raas.run, "run_tasks", nothing)
    monkeypatch.chdir(tmp_path)
    base = ["run", "--bundled", "math", "--limit", "1", "--url", "http://127.0.0.1:9"]
    said = [CliRunner().invoke(main, base).output for _ in range(2)]
    outs = [re.search(r"results in (\S+)", " ".join(s.split())) for s in said]
    first, second = (Path(m.group(1)) for m in outs if m is not None)
    assert first != second and first.parent.parent == second.parent.parent == Path("out/run")
    assert first.exists() and second.exists() and first.name == "results.jsonl"
    made = new_run_dir(tmp_path / "demo", "/models/My Model")
    assert made.parent == tmp_path / "demo" and made.name.endswith("-My_Model")
