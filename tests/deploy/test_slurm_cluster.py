"""Real Slurm jobs (make test-slurm: scripts/hpc/start-slurm.sh starts a one-node cluster).

`raas slurm --submit` starts the servers through sbatch and srun, the trainer reads their URLs
from the server list and runs rollouts through them, then scancel: the servers drain, persist
every accepted job and exit, and no process of the job is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from raas.client import RolloutClient, read_server_list
from raas.helpers.ports import free_port
from raas.tasks.datasets import bundled
from raas.wire import RolloutRequest

pytestmark = pytest.mark.slurm
HOST = socket.gethostname()
# The servers listen on every interface, so they need a key; sbatch passes the environment on.
KEY = "slurm-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def processes_with(marker: str, job_id: str) -> dict[int, str]:
    """Processes whose command line mentions ``marker`` (the job's own directory) or that
    inherited the job's SLURM_JOB_ID (the engine's command line names neither)."""
    env_marker = f"\0SLURM_JOB_ID={job_id}\0".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in cmdline or env_marker in environ:
            found[int(entry.name)] = cmdline
    return found


def job_state(job_id: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
    ).stdout
    fields = dict(item.partition("=")[::2] for item in out.split())
    return fields.get("JobState", "")


def in_queue(job_id: str) -> bool:
    """Still pending, running or completing (Slurm still waits for some of its processes)."""
    state = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()
    return state in {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING"}


class Job:
    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir = workdir
        self.marker = str(workdir)
        self.servers = workdir / "servers.txt"
        self.port = free_port()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "raas",
                "slurm",
                "--workdir",
                str(workdir),
                "--server-list",
                str(self.servers),
                "--port",
                str(self.port),
                "--job-name",
                "raas-test",
                "-o",
                str(workdir / "job.sbatch"),
                "--submit",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RAAS_API_KEY": KEY},
        )
        assert run.returncode == 0, run.stderr
        self.id = run.stdout.strip()
        assert self.id.isdigit(), run.stdout
        self.output = workdir / f"raas-{self.id}.out"

    def processes(self) -> dict[int, str]:
        return processes_with(self.marker, self.id)

    def cancel(self, timeout_s: float = 60.0) -> float:
        """scancel; seconds until no process of the job is left."""
        t0 = time.monotonic()
        subprocess.run(["scancel", self.id], check=True)
        while time.monotonic() - t0 < timeout_s and (self.processes() or in_queue(self.id)):
            time.sleep(0.1)
        return time.monotonic() - t0

    def clean_up(self) -> None:
        subprocess.run(["scancel", self.id], capture_output=True)
        for pid in self.processes():
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[type[Job]]:
    if shutil.which("sbatch") is None:
        pytest.fail("no Slurm here: run scripts/hpc/start-slurm.sh (or make test-slurm)")
    jobs: list[Job] = []

    class Tracked(Job):
        def __init__(self, *args: str) -> None:
            super().__init__(tmp_path / f"job{len(jobs)}", *args)
            jobs.append(self)

    yield Tracked
    for j in jobs:
        j.clean_up()


async def rollouts(urls: list[str], tasks: list[dict[str, object]], **kw: object) -> list[str]:
    async with RolloutClient(urls, api_key=KEY) as client:
        groups = await client.generate_groups(tasks, n=2, sampling_params=kw)
    return [f"{r.state}:{r.reward}" for g in groups for r in g.results]


async def submit_many(urls: list[str], tasks: list[dict[str, object]]) -> int:
    async with RolloutClient(urls, api_key=KEY) as client:
        ids = await client.submit_batch([RolloutRequest(instance=t) for t in tasks])
    return len(ids)


def test_job_serves_rollouts_and_leaves_nothing_behind_on_scancel(job: type[Job]) -> None:
    j = job("--drain-grace-s", "10", "--run-workers", "4")
    t0 = time.monotonic()
    urls = read_server_list(j.servers, wait=120, poll_s=0.1)
    up_s = time.monotonic() - t0
    assert urls == [f"http://{HOST}:{j.port}"]
    assert job_state(j.id) == "RUNNING"
    # The server runs under the job's srun, with this project's Python.
    procs = j.processes().values()
    assert any(c.startswith(f"{sys.executable} -m raas serve") for c in procs)
    assert any(c.startswith("srun ") for c in procs)

    assert (
        asyncio.run(rollouts(urls, bundled("countdown")[:8], temperature=0.0)) == ["done:1.0"] * 16
    )
    # Jobs still queued when scancel arrives: the drain must finish and persist them all.
    accepted = asyncio.run(submit_many(urls, bundled("countdown") * 4))
    cancelled_at = time.time()
    stop_s = j.cancel()
    print(f"servers listed after {up_s:.1f} s; no process left {stop_s:.1f} s after scancel")
    assert j.processes() == {}
    assert job_state(j.id) == "CANCELLED"
    # Well inside KillWait (30 s): the servers drained and exited; Slurm did not kill them.
    assert stop_s < 20
    log = j.output.read_text()
    assert "serve exited with 0" in log, log
    assert not j.servers.exists()
    with sqlite3.connect(j.workdir / f"raas-{HOST}.db") as db:
        total, unfinished = db.execute("SELECT count(*), sum(seq IS NULL) FROM jobs").fetchone()
        (after,) = db.execute(
            "SELECT count(*) FROM jobs WHERE finished_at > ?", (cancelled_at,)
        ).fetchone()
    print(f"{total} results, {after} of them finished while draining")
    assert total == 16 + accepted and unfinished == 0
    assert after > 0  # scancel came while jobs were queued: the drain finished them


def test_each_node_server_uses_the_engine_it_started(job: type[Job]) -> None:
    engine_port = free_port()
    j = job("--engine-model", "tiny", "--engine-port", str(engine_port))
    urls = read_server_list(j.servers, wait=300, poll_s=0.2)
    assert any(" -m raas engine --model tiny" in c for c in j.processes().values())
    # Locality: the server's backend is the engine on its own node, by the node's name.
    backends = httpx.get(urls[0] + "/v1/backends", headers=AUTH, timeout=10).json()
    assert [(b["url"], b["healthy"]) for b in backends] == [(f"http://{HOST}:{engine_port}", True)]
    task = {"data_source": "math", "problem": "What is 2 + 2?", "answer": "4"}
    states = asyncio.run(rollouts(urls, [task], max_tokens=8, max_turns=1))
    assert [s.split(":")[0] for s in states] == ["done", "done"]
    stop_s = j.cancel()
    assert j.processes() == {} and job_state(j.id) == "CANCELLED"
    assert stop_s < 20
    log = j.output.read_text()
    assert "serve exited with 0" in log and "engine exited with" in log, log
