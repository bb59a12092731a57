"""`raas serve` as a real process: plugins via entry points, SIGTERM drain, crash recovery, CLI."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.store.sqlite import iter_finished
from raas.tasks import TaskRegistry
from raas.tasks.countdown import generate_instances

FIXTURES = Path(__file__).parents[1] / "fixtures"
DEADLINE_S = 120.0  # a safety net for a loaded machine: every wait ends on its condition


def wait_for_state(url: str, job_id: str, state: str) -> None:
    """Readiness wait for a condition in another process, bounded by a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        answer = httpx.get(f"{url}/v1/rollouts/{job_id}")  # a 404 until it is submitted
        if answer.status_code == 200 and answer.json()["state"] == state:
            return
        time.sleep(0.02)
    raise AssertionError(f"{job_id} never reached {state}")


def test_registry_loads_entry_point_plugins_and_skips_broken_ones(
    plugin_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.syspath_prepend(str(plugin_path))
    monkeypatch.syspath_prepend(str(FIXTURES))
    registry = TaskRegistry.from_entry_points()
    assert {"gated", "countdown"} <= set(registry.names())
    assert "broken" not in registry
    assert "could not load task handler 'broken'" in caplog.text


def test_sigterm_drains_jobs_in_flight_and_persists_them(start_server: Any, tmp_path: Path) -> None:
    db = tmp_path / "drain.db"
    gate = tmp_path / "gate"
    server = start_server(db, "--drain-grace-s", "60")
    body = {"instance": {"data_source": "gated", "gate": str(gate)}, "job_id": "inflight"}
    assert httpx.post(f"{server.url}/v1/rollouts", json=body).status_code == 202
    wait_for_state(server.url, "inflight", "run")

    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + DEADLINE_S
    while httpx.get(f"{server.url}/v1/status").json()["accepting"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    refused = httpx.post(f"{server.url}/v1/rollouts", json={**body, "job_id": "late"})
    assert refused.status_code == 503
    assert server.proc.poll() is None  # still draining: the job in flight goes on

    gate.touch()
    assert server.proc.wait(timeout=DEADLINE_S) == 0
    results = {r.job_id: r for r in iter_finished(db)}
    assert set(results) == {"inflight"}
    assert results["inflight"].state == "done"
    assert results["inflight"].result is not None
    assert results["inflight"].result.reward == 1.0


def test_a_killed_server_runs_its_jobs_again_after_restart(
    start_server: Any, tmp_path: Path
) -> None:
    db = tmp_path / "crash.db"
    server = start_server(db)
    finished = {"instance": generate_instances(1, seed=2)[0], "job_id": "before"}
    assert httpx.post(f"{server.url}/v1/rollouts", json=finished).status_code == 202
    got = httpx.get(f"{server.url}/v1/rollouts/before", params={"wait": 10}).json()
    assert got["state"] == "done"
    gate = tmp_path / "gate"
    gated = {"instance": {"data_source": "gated", "gate": str(gate)}, "job_id": "lost"}
    httpx.post(f"{server.url}/v1/rollouts", json=gated)
    wait_for_state(server.url, "lost", "run")
    server.proc.kill()
    server.proc.wait()

    again = start_server(db)
    wait_for_state(again.url, "lost", "run")  # queued again under its id, and running
    assert httpx.get(f"{again.url}/v1/rollouts/before").json()["result"] == got["result"]
    gate.touch()
    lost = httpx.get(f"{again.url}/v1/rollouts/lost", params={"wait": DEADLINE_S}).json()
    assert lost["state"] == "done"
    assert lost["result"]["attempts"] == 2
    (restart,) = lost["result"]["attempt_errors"]
    assert (restart["type"], restart["kind"], restart["stage"]) == (
        "server_restart",
        "infra",
        "run",
    )


def test_a_job_fails_once_restarts_used_its_attempts(start_server: Any, tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    gated = {"instance": {"data_source": "gated", "gate": str(tmp_path / "never")}, "job_id": "j"}
    server = start_server(db)
    httpx.post(f"{server.url}/v1/rollouts", json=gated)
    for _ in range(2):  # the job's first and second attempt die with the server
        wait_for_state(server.url, "j", "run")
        server.proc.kill()
        server.proc.wait()
        server = start_server(db)
    lost = httpx.get(f"{server.url}/v1/rollouts/j").json()
    assert lost["state"] == "failed"
    assert lost["result"]["error"]["type"] == "server_restart"
    assert lost["result"]["stage_failed"] == "run"
    assert lost["result"]["attempts"] == 2
    assert [e["type"] for e in lost["result"]["attempt_errors"]] == ["server_restart"]


def test_submit_file_then_export(start_server: Any, tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    server = start_server(db)
    tasks = tmp_path / "tasks.jsonl"
    instances = generate_instances(6, seed=4)
    lines = [json.dumps(i) for i in instances[:5]]
    lines.append(json.dumps({"instance": instances[5], "job_id": "full-request"}))
    tasks.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.jsonl"
    raas = [sys.executable, "-m", "raas"]
    run = subprocess.run(
        [
            *raas,
            "submit",
            server.url,
            str(tasks),
            "--out",
            str(out),
            "--sampling-params",
            '{"temperature": 0.0}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "6 results" in run.stdout and "done 6" in run.stdout
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["instance_id"] for r in results] == [i["instance_id"] for i in instances]
    assert all(r["reward"] == 1.0 for r in results)
    assert results[5]["job_id"] == "full-request"
    status = subprocess.run(
        [*raas, "status", server.url], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    assert "accepting" in status.stdout and "done 6" in status.stdout
    assert "gated" in status.stdout  # the plugin's task is listed
    assert "LLM backends: none (agent tasks cannot run" in status.stdout
    assert server.stop() == 0

    jsonl = tmp_path / "export.jsonl"
    exported = subprocess.run(
        [*raas, "export", "--db", str(db), "--format", "jsonl", "--out", str(jsonl)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert exported.returncode == 0, exported.stderr
    assert sorted(json.loads(x)["job_id"] for x in jsonl.read_text().splitlines()) == sorted(
        r["job_id"] for r in results
    )
    parquet = tmp_path / "export.parquet"
    subprocess.run(
        [*raas, "export", "--db", str(db), "--format", "parquet", "--out", str(parquet)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    import pyarrow.parquet as pq

    table = pq.read_table(parquet)
    assert table.num_rows == 6
    assert set(table.column("state").to_pylist()) == {"done"}
    assert table.column("reward").to_pylist() == [1.0] * 6


def test_the_key_stays_out_of_the_log_and_the_command_line(
    start_server: Any, tmp_path: Path
) -> None:
    """Read from a file (or RAAS_API_KEY), the key is in no process's command line; sent as
    ``?key=`` (where the dashboard takes it, or anywhere by mistake), it is in no log line."""
    key = "key-" + secrets.token_hex(12)
    key_file = tmp_path / "raas.key"
    key_file.write_text(key + "\n")
    server = start_server(tmp_path / "keyed.db", "--api-key-file", str(key_file))
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    queries = [f"/ui?key={key}", f"/v1/status?key={key}", f"/v1/rollouts?limit=1&api_key={key}"]
    for path in [*queries, "/ui?key=another-servers-key", f"/v1/rollouts/{key}"]:
        httpx.get(server.url + path)
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{server.url}/v1/status", headers=auth).status_code == 200
    assert server.stop() == 0
    log = server.log_path.read_text()
    assert key.encode() not in cmdline
    assert key not in log and "another-servers-key" not in log, log
    assert log.count("key=(redacted)") == 4 and "GET /v1/rollouts/(redacted)" in log, log
    assert f"the dashboard: {server.url}/ui" in log, log  # where a person finds the page


def test_submit_reports_a_bad_line(tmp_path: Path) -> None:
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text('{"data_source": "countdown"}\n{"instance": {"numbers": [1]}}\n')
    run = subprocess.run(
        [sys.executable, "-m", "raas", "submit", "http://127.0.0.1:9", str(tasks)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "bad.jsonl:2: instance" in run.stderr and "data_source" in run.stderr


def test_raas_jobs_lists_what_is_in_flight(start_server: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from raas.cli import main

    server = start_server(tmp_path / "jobs.db")
    gate = tmp_path / "gate"
    body = {"instance": {"data_source": "gated", "gate": str(gate)}, "job_id": "slow-one"}
    assert httpx.post(f"{server.url}/v1/rollouts", json=body).status_code == 202
    wait_for_state(server.url, "slow-one", "run")
    listed = CliRunner().invoke(main, ["jobs", server.url])
    gate.touch()
    httpx.get(f"{server.url}/v1/rollouts/slow-one", params={"wait": DEADLINE_S})
    empty = CliRunner().invoke(main, ["jobs", server.url])
    assert listed.exit_code == 0, listed.output
    assert "1 jobs in flight" in listed.output and "slow-one" in listed.output
    assert "gated" in listed.output and "run" in listed.output
    assert "no jobs in flight" in empty.output


def test_an_interrupted_run_cancels_its_jobs_on_the_server(
    start_server: Any, tmp_path: Path
) -> None:
    from raas.client import RolloutClient
    from raas.client.task_files import run_requests
    from raas.wire import RolloutRequest

    server = start_server(tmp_path / "interrupt.db")
    gated = [
        RolloutRequest(instance={"data_source": "gated", "gate": str(tmp_path / "never")}, job_id=j)
        for j in ("i0", "i1")
    ]
    told: list[int] = []

    async def scenario() -> None:
        async with RolloutClient(server.url) as client:
            run = asyncio.create_task(run_requests(client, gated, on_interrupt=told.append))
            await asyncio.to_thread(wait_for_state, server.url, "i1", "run")
            run.cancel()  # what Ctrl-C does to `raas run` / `raas submit`
            with pytest.raises(asyncio.CancelledError):
                await run

    asyncio.run(scenario())
    assert told == [2]
    states = [httpx.get(f"{server.url}/v1/rollouts/{j}").json()["state"] for j in ("i0", "i1")]
    assert states == ["cancelled", "cancelled"]


def test_submit_fails_when_nothing_could_run_the_jobs(start_server: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from raas.cli import main

    server = start_server(tmp_path / "nollm.db", "--max-attempts", "1")  # no LLM backend
    tasks = tmp_path / "math.jsonl"
    tasks.write_text(json.dumps({"data_source": "math", "problem": "1+1?", "answer": "2"}) + "\n")
    result = CliRunner().invoke(main, ["submit", server.url, str(tasks)])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert "1 of 1 rollouts could not run (errors of kind infra):" in last
    assert "NoBackendAvailable: no LLM backend is registered" in last  # the cause, said last


def test_the_result_table_fits_80_columns_without_losing_the_why() -> None:
    from rich.console import Console

    from raas.run import result_table
    from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory

    failed = RolloutResult(
        job_id="j",
        state="failed",
        stage_failed="run",
        instance_id="HumanEval/163",
        error=ErrorInfo(
            type="NoBackendAvailable",
            message="no LLM backend is registered",
            kind="infra",
            stage="run",
        ),
        trajectory=Trajectory(),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=1),
        data_source="code",
    )
    console = Console(width=80, record=True)
    console.print(result_table([failed], "1 rollout"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "HumanEval/163" in text and "NoBackendAvailable" in text  # whole, on one line
    assert "…" not in text
