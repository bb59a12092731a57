"""The fault tier (make test-faults): `raas serve` as a real process with real sandboxes and a
model that acts (a vLLM-protocol server answering with real tool calls), broken on purpose.

Each test breaks one thing while jobs are in flight: the server (SIGKILL, then a restart on the
same database), an inference backend, a sandbox's action server, a judge that hangs, a trainer
that hangs up, the disk that holds the database (a small tmpfs, filled: mounting it needs root).
Every job ends as a result with the right kind of error (or none), no job is lost or reported
twice, and no process or directory of the server is left behind.
"""

from __future__ import annotations

import errno
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import runtime_key
from raas.launch import ServerProcess
from raas.sandbox.procs import descendants, start_time
from raas.sandbox.runtime import runtime_dir_of
from raas.tasks.datasets import humaneval, humaneval_problems
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call

pytestmark = pytest.mark.faults

DEADLINE_S = 120.0  # a safety net for a broken run, never an assertion on speed
PROBLEMS = humaneval()[:8]
SOLUTIONS = {p["task_id"]: p["canonical_solution"] for p in humaneval_problems()[:8]}
STEP = "[[step]]"  # in every answer: how many the prompt holds is the turn number
HANG = "def hang(*args, **kwargs):\n    while True:\n        pass\n"


def agent(hang: frozenset[str] = frozenset(), kill_once: frozenset[str] = frozenset()) -> Any:
    """The script of a model that solves HumanEval problems with the editor, then finishes.

    Problems named in ``hang`` get a solution that never returns (their EVAL hangs); in
    ``kill_once``, the first attempt kills its own action server (``kill -9 $PPID`` from bash).
    """
    killed: set[str] = set()

    def script(prompt: str) -> str:
        problem = next(p for p in PROBLEMS if p["prompt"].strip()[:300] in prompt)
        name = problem["entry_point"]
        if prompt.count(STEP):
            return f"{STEP} {call('finish', message='done')}"
        if name in kill_once and name not in killed:
            killed.add(name)
            return f"{STEP} {call('bash', command='kill -9 $PPID')}"
        # The task starts the file with the prompt: the body goes after it.
        code = SOLUTIONS[problem["instance_id"]]
        if name in hang:
            code += f"\n\n{HANG}\n{name} = hang\n"
        lines = len(problem["prompt"].splitlines())
        write = call(
            "editor",
            command="insert",
            path="/workspace/solution.py",
            insert_line=lines,
            new_str=code,
        )
        return f"{STEP} {write}"

    return script


@pytest.fixture
def backend() -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def start(script: Callable[[str], str], latency_s: float = 0.2) -> ServerThread:
        server = ServerThread(AgentBackend(script, latency_s).app).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


class Service:
    """`raas serve` on one database, restartable on the same port; records what it starts."""

    def __init__(self, tmp_path: Path, llm: list[str], *args: str, db: Path | None = None) -> None:
        self.db = db or tmp_path / "faults.db"
        self.tmp_path = tmp_path
        urls = [arg for url in llm for arg in ("--llm", url)]
        self.args = [*urls, "--tokenizer", "tiny", "--run-workers", "4", *args]
        self.port: int | None = None
        self.seen: set[tuple[int, int | None]] = set()  # (pid, start time) of its processes
        self.server = self.start()

    def start(self) -> ServerProcess:
        log = self.tmp_path / f"serve-{time.monotonic_ns()}.log"
        server = ServerProcess(self.db, log, self.args, port=self.port)
        server.wait_ready()
        self.port, self.url = server.port, server.url
        self.server = server
        return server

    def note_processes(self) -> None:
        for pid in descendants(self.server.proc.pid) | {self.server.proc.pid}:
            self.seen.add((pid, start_time(pid)))

    def kill(self) -> None:
        self.note_processes()
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()

    def stop(self) -> None:
        self.note_processes()
        assert self.server.stop() == 0

    @property
    def runtime_dir(self) -> Path:
        return runtime_dir_of(runtime_key(self.db))

    def assert_nothing_left(self) -> None:
        left = {pid for pid, started in self.seen if start_time(pid) == started is not None}
        assert not left, f"processes of the server still alive: {sorted(left)}"
        assert not self.runtime_dir.exists(), sorted(self.runtime_dir.rglob("*"))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(llm: list[str], *args: str, db: Path | None = None) -> Service:
        svc = Service(tmp_path, llm, *args, db=db)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        if svc.server.proc.poll() is None:
            svc.server.proc.kill()
            svc.server.proc.wait()


def submit(url: str, problems: list[dict[str, Any]]) -> list[str]:
    jobs = [{"instance": p, "job_id": f"he-{i}"} for i, p in enumerate(problems)]
    r = httpx.post(f"{url}/v1/rollouts:batch", json={"jobs": jobs})
    assert r.status_code == 202, r.text
    return [j["job_id"] for j in jobs]


def result(url: str, job_id: str) -> dict[str, Any]:
    got = httpx.get(f"{url}/v1/rollouts/{job_id}", params={"wait": 60}, timeout=70).json()
    assert got["result"] is not None, f"{job_id} did not finish: {got}"
    return got["result"]  # type: ignore[no-any-return]


def listed(url: str) -> list[str]:
    """Every finished job id, paging through the finish order."""
    ids: list[str] = []
    since = 0
    while True:
        page = httpx.get(f"{url}/v1/rollouts", params={"since": since, "limit": 3}).json()
        if not page["results"]:
            return ids
        ids += [r["job_id"] for r in page["results"]]
        since = page["next_since"]


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def states(url: str, ids: list[str]) -> list[str]:
    return [httpx.get(f"{url}/v1/rollouts/{j}").json()["state"] for j in ids]


def test_sigkill_mid_batch_then_restart_loses_and_repeats_nothing(
    backend: Any, service: Any
) -> None:
    llm = backend(agent(), latency_s=1.0)  # so that the batch takes a few seconds
    svc = service([llm.url])
    ids = submit(svc.url, PROBLEMS)
    wait_until(lambda: 0 < states(svc.url, ids).count("done") < len(ids) - 1, "some jobs done")
    svc.note_processes()  # its sandboxes, while they run
    svc.kill()
    done_before = {j for j, s in zip(ids, states_from_db(svc), strict=True) if s == "done"}

    svc.start()  # same database, same port
    results = {j: result(svc.url, j) for j in ids}
    assert {r["state"] for r in results.values()} == {"done"}
    assert {r["reward"] for r in results.values()} == {1.0}
    for job_id, r in results.items():
        if job_id in done_before:
            assert r["attempts"] == 1
        else:  # in flight at the kill: run again under its id
            assert r["attempts"] == 2
            assert r["attempt_errors"][0]["type"] == "server_restart"
    assert sorted(listed(svc.url)) == sorted(ids)  # each once
    svc.stop()
    svc.assert_nothing_left()


def states_from_db(svc: Service) -> list[str]:
    """The jobs' states as the killed server left them in its database."""
    import sqlite3

    with sqlite3.connect(svc.db) as conn:
        rows = dict(conn.execute("SELECT job_id, state FROM jobs WHERE seq IS NOT NULL"))
    return [rows.get(f"he-{i}", "unfinished") for i in range(len(PROBLEMS))]


def test_a_backend_killed_mid_rollout_moves_its_jobs_to_the_other(
    backend: Any, service: Any
) -> None:
    script = agent()
    first, second = backend(script), backend(script)
    svc = service([first.url, second.url])
    ids = submit(svc.url, PROBLEMS)
    wait_until(lambda: "run" in states(svc.url, ids), "a job in RUN")
    first.stop()  # its address now refuses connections
    results = [result(svc.url, j) for j in ids]
    for r in results:  # done on the other backend, or failed as infra after its attempts
        assert r["state"] == "done" or r["error"]["kind"] == "infra", r["error"]
    assert sum(r["state"] == "done" for r in results) >= len(ids) - 1
    svc.stop()
    svc.assert_nothing_left()


def test_an_action_server_killed_mid_turn_runs_the_job_again(backend: Any, service: Any) -> None:
    victim = PROBLEMS[0]["entry_point"]
    llm = backend(agent(kill_once=frozenset({victim})))
    svc = service([llm.url])
    (job_id,) = submit(svc.url, PROBLEMS[:1])
    r = result(svc.url, job_id)
    assert (r["state"], r["reward"], r["attempts"]) == ("done", 1.0, 2)
    (first,) = r["attempt_errors"]
    assert (first["kind"], first["stage"]) == ("infra", "run"), first
    svc.stop()
    svc.assert_nothing_left()


def test_an_eval_that_hangs_times_out_and_leaves_nothing(backend: Any, service: Any) -> None:
    name = PROBLEMS[1]["entry_point"]
    llm = backend(agent(hang=frozenset({name})))
    svc = service([llm.url], "--eval-timeout-s", "3")
    hangs, fine = submit(svc.url, PROBLEMS[:2])[::-1]
    svc.note_processes()
    r = result(svc.url, hangs)
    assert (r["state"], r["stage_failed"], r["error"]["kind"]) == ("timeout", "eval", "policy")
    assert r["attempts"] == 1
    assert result(svc.url, fine)["reward"] == 1.0
    svc.stop()
    svc.assert_nothing_left()


def test_a_trainer_that_hangs_up_does_not_stop_its_job(backend: Any, service: Any) -> None:
    llm = backend(agent(), latency_s=0.5)
    svc = service([llm.url])
    body = {"instance": PROBLEMS[2], "job_id": "gone"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{svc.url}/process", json=body, timeout=0.3)  # blocks until the result
    r = result(svc.url, "gone")
    assert (r["state"], r["reward"]) == ("done", 1.0)
    svc.stop()
    svc.assert_nothing_left()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 8 MiB of its own (for a database to fill), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs, which needs root: {mounted.stderr.decode()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write until the filesystem has no byte left; the file that holds what was written."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    return filler


def metric(url: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", httpx.get(f"{url}/metrics").text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


def test_a_full_disk_refuses_new_jobs_and_loses_no_acknowledged_one(
    small_disk: Path, backend: Any, service: Any
) -> None:
    llm = backend(agent(), latency_s=1.0)
    svc = service([llm.url], db=small_disk / "faults.db")
    acked = submit(svc.url, PROBLEMS[:4])
    wait_until(lambda: "run" in states(svc.url, acked), "a job in RUN")
    filler = fill(small_disk)

    # SQLite may find room in its own files for a few writes more; then it has none.
    refused = None
    for i in range(200):
        body = {"instance": PROBLEMS[4 + i % 4], "job_id": f"late-{i}"}
        r = httpx.post(f"{svc.url}/v1/rollouts", json=body)
        if r.status_code == 503:
            refused = body["job_id"]
            break
        assert r.status_code == 202, r.text
        acked.append(body["job_id"])
    assert refused is not None, "the full disk never refused a write"
    assert int(r.headers["Retry-After"]) >= 1 and "cannot record" in r.json()["detail"]
    health = httpx.get(f"{svc.url}/healthz").json()
    assert health["status"] == "degraded" and "full" in health["detail"], health

    # Jobs finish on the full disk: their results are held, and a job said done stays done.
    said_done: set[str] = set()

    def done_stays_done() -> bool:
        now = dict(zip(acked, states(svc.url, acked), strict=True))
        assert all(now[j] == "done" for j in said_done), now
        said_done.update(j for j, state in now.items() if state == "done")
        return metric(svc.url, "raas_results_held") > 0

    wait_until(done_stays_done, "a finished result held for the full disk")
    assert refused not in {j["job_id"] for j in running(svc.url)}
    assert httpx.get(f"{svc.url}/v1/rollouts/{refused}").status_code == 404

    filler.unlink()  # room again: the server goes on by itself
    results = {j: result(svc.url, j) for j in acked}
    assert {r["state"] for r in results.values()} == {"done"}
    assert {r["reward"] for r in results.values()} == {1.0}
    assert sorted(listed(svc.url)) == sorted(acked)  # each acknowledged job once
    assert httpx.get(f"{svc.url}/v1/rollouts/{refused}").status_code == 404  # never ran
    assert httpx.get(f"{svc.url}/healthz").json() == {"status": "ok"}
    assert metric(svc.url, "raas_results_held") == 0
    svc.stop()
    svc.assert_nothing_left()


def running(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/v1/rollouts:running").json()["jobs"]  # type: ignore[no-any-return]
