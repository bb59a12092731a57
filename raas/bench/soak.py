"""`raas bench soak`: many jobs through one server while it and its backends are broken on a
schedule; what was lost, repeated, failed or left behind.

One raas server (its own forked process, restarted on the same database and port after each
fault) runs ``--jobs`` agent jobs, ``--in-flight`` at a time, against two fake inference
servers speaking vLLM's protocol (a scripted ``think`` tool call, then ``finish``, see
``raas bench scale``); every ``--sandbox-every``-th job also holds a real bwrap sandbox. Every
``--fault-every`` finished jobs the next fault of the rotation strikes: the server is SIGKILLed
(and restarted), one backend is SIGKILLed (and restarted a second later), the server gets
SIGTERM (it drains, and is restarted). The client submits with job ids (resubmitting after a
refused or broken connection is idempotent) and reads results by paging the finish order, as a
trainer that survives restarts would.

Printed: jobs, faults, lost (submitted, never finished), duplicated (listed twice), failed by
infra and by policy, jobs run more than once, processes and sandbox directories left after the
last stop, 5xx answers, p50/p99 latency (submission to result), and the server's RSS at the start
and the end. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from raas.api.app import runtime_key
from raas.bench.forked import ForkedServer, serve_raas
from raas.bench.scale import ThinkTask, serve_thinking_llm, think_settings
from raas.sandbox import procs
from raas.sandbox.runtime import runtime_dir_of

WARM_JOBS = 100  # RSS "at the start" is read once this many jobs have finished


class SandboxedThinkTask(ThinkTask):
    """The same job, holding a real sandbox from INIT to cleanup."""

    name = "think_sandboxed"
    needs_sandbox = True


def _serve(port: int, db: Path, llm: list[str], workers: int) -> None:
    settings = think_settings(db, llm, workers, drain_grace_s=30)
    # Errors only: the faults make warnings by the thousand.
    serve_raas(port, settings, [ThinkTask(), SandboxedThinkTask()], log_level="error")


def _rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.db = tmp / "soak.db"
        self.llms = [
            ForkedServer(
                serve_thinking_llm, args.turns, args.llm_latency_ms / 1000, health="/health"
            )
            for _ in range(2)
        ]
        for llm in self.llms:
            llm.__enter__()
        self.server = self._start_server(port=None)
        self.submitted: dict[str, float] = {}
        self.latency: list[float] = []
        self.seen: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.status: Counter[int] = Counter()
        self.processes: set[tuple[int, int | None]] = set()
        # Each server process's RSS after its first WARM_JOBS jobs (tokenizer and caches
        # loaded) and at its end, with the jobs it finished: [start MiB, end MiB, jobs].
        self.rss: list[list[float]] = []
        self._process_from = 0  # len(self.seen) when the current server process started

    def _start_server(self, port: int | None) -> ForkedServer:
        urls = [llm.url for llm in self.llms]
        server = ForkedServer(_serve, self.db, urls, self.args.workers, port=port)
        return server.__enter__()

    # -- faults --------------------------------------------------------------------------------

    async def strike(self, fault: str) -> None:
        self.faults[fault] += 1
        self.note_processes()
        if fault == "server SIGKILL":
            await asyncio.to_thread(self._restart_server, signal.SIGKILL)
        elif fault == "server SIGTERM":
            await asyncio.to_thread(self._restart_server, signal.SIGTERM)
        else:
            llm = self.llms[self.faults[fault] % 2]
            assert llm.proc.pid is not None
            os.kill(llm.proc.pid, signal.SIGKILL)
            llm.proc.join(10)
            await asyncio.sleep(1.0)
            index = self.llms.index(llm)
            self.llms[index] = await asyncio.to_thread(self._restart_llm, llm.port)

    def _restart_server(self, sig: int) -> None:
        assert self.server.proc.pid is not None
        self._end_of_process()
        os.kill(self.server.proc.pid, sig)
        self.server.proc.join(120)
        self.server = self._start_server(port=self.server.port)
        self._process_from = len(self.seen)

    def _watch_rss(self) -> None:
        jobs = len(self.seen) - self._process_from
        if jobs >= WARM_JOBS and (not self.rss or self.rss[-1][2] >= 0):
            self.rss.append([_rss_mb(self.server.proc.pid), float("nan"), -1])

    def _end_of_process(self) -> None:
        if self.rss and self.rss[-1][2] < 0:
            self.rss[-1][1:] = [_rss_mb(self.server.proc.pid), len(self.seen) - self._process_from]

    def _restart_llm(self, port: int) -> ForkedServer:
        llm = ForkedServer(
            serve_thinking_llm,
            self.args.turns,
            self.args.llm_latency_ms / 1000,
            health="/health",
            port=port,
        )
        return llm.__enter__()

    def note_processes(self) -> None:
        pid = self.server.proc.pid
        if pid is not None:
            for p in procs.descendants(pid) | {pid}:
                self.processes.add((p, procs.start_time(p)))

    # -- the trainer's side --------------------------------------------------------------------

    async def _count(self, response: httpx.Response) -> None:
        self.status[response.status_code] += 1

    async def submit(self, http: httpx.AsyncClient, ids: list[str]) -> None:
        jobs = []
        for job_id in ids:
            n = int(job_id.rsplit("-", 1)[1])
            source = "think_sandboxed" if n % self.args.sandbox_every == 0 else "think"
            instance = {"data_source": source, "question": "6 * 7", "answer": "42"}
            jobs.append({"instance": instance, "job_id": job_id})
        while True:  # the same ids again after a refusal or a broken connection: idempotent
            try:
                r = await http.post(f"{self.server.url}/v1/rollouts:batch", json={"jobs": jobs})
                if r.status_code in (200, 202):
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        now = time.perf_counter()
        for job_id in ids:
            self.submitted.setdefault(job_id, now)

    async def collect(self, http: httpx.AsyncClient, since: int) -> int:
        try:
            r = await http.get(
                f"{self.server.url}/v1/rollouts", params={"since": since, "limit": 1000}
            )
        except httpx.TransportError:
            await asyncio.sleep(0.2)
            return since
        if r.status_code != 200:
            await asyncio.sleep(0.2)
            return since
        page = r.json()
        now = time.perf_counter()
        for result in page["results"]:
            job_id = result["job_id"]
            self.seen[job_id] += 1
            if self.seen[job_id] > 1:
                continue
            self.latency.append(now - self.submitted.get(job_id, now))
            error = result.get("error") or {}
            kind = f"failed by {error.get('kind')}" if result["state"] != "done" else "done"
            self.outcomes[kind] += 1
            if result.get("attempts", 1) > 1:
                self.outcomes["ran more than once"] += 1
        if not page["results"]:
            await asyncio.sleep(0.05)
        return int(page["next_since"])

    async def run(self) -> None:
        args = self.args
        ids = iter(f"soak-{i}" for i in range(args.jobs))
        rotation = itertools.cycle(["server SIGKILL", "backend SIGKILL", "server SIGTERM"])
        next_fault = args.fault_every
        since = 0
        deadline = time.monotonic() + args.max_s
        async with httpx.AsyncClient(timeout=60, event_hooks={"response": [self._count]}) as http:
            while len(self.seen) < args.jobs and time.monotonic() < deadline:
                room = args.in_flight - (len(self.submitted) - len(self.seen))
                batch = list(itertools.islice(ids, max(room, 0)))
                if batch:
                    await self.submit(http, batch)
                since = await self.collect(http, since)
                if args.fault_every and next_fault <= len(self.seen) < args.jobs:
                    next_fault += args.fault_every
                    await self.strike(next(rotation))
                if len(self.seen) % 500 == 0:
                    self.note_processes()
                self._watch_rss()
        self._end_of_process()

    def stop(self) -> None:
        self.note_processes()
        self.server.proc.terminate()  # SIGTERM: it drains and releases its directory
        self.server.proc.join(120)
        for llm in self.llms:
            llm.__exit__()

    def report(self, wall_s: float) -> None:
        left = {pid for pid, started in self.processes if procs.start_time(pid) == started}
        left.discard(os.getpid())
        left_commands = sorted(procs.command_line(pid)[:80] for pid in left)
        runtime = runtime_dir_of(runtime_key(self.db))
        dirs = len(list(runtime.iterdir())) if runtime.exists() else 0
        lost = len(set(self.submitted) - set(self.seen))
        duplicated = sum(1 for n in self.seen.values() if n > 1)
        server_errors = sum(n for code, n in self.status.items() if code >= 500)
        lat = sorted(self.latency)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        faults = ", ".join(f"{n} {name}" for name, n in sorted(self.faults.items())) or "none"
        print(
            f"soak: {len(self.submitted)} jobs submitted, {len(self.seen)} finished in"
            f" {wall_s:.0f} s ({self.args.in_flight} in flight, 1 in"
            f" {self.args.sandbox_every} with a sandbox)"
        )
        print(f"  faults: {sum(self.faults.values())} ({faults})")
        print(
            f"  lost {lost}, duplicated {duplicated}; "
            + ", ".join(f"{kind} {n}" for kind, n in sorted(self.outcomes.items()))
        )
        print(
            f"  left after the last stop: {len(left)} processes, {dirs} sandbox directories"
            f"{'' if runtime.exists() else ' (its directory is gone)'}"
        )
        for command in left_commands:
            print(f"    {command}")
        print(f"  HTTP 5xx answers: {server_errors} of {sum(self.status.values())}")
        if lat:
            print(
                f"  latency (submit to result): p50 {statistics.median(lat):.3f} s, p99 {p99:.3f} s"
            )
        rss = ", ".join(f"{a:.0f} -> {b:.0f} ({n:.0f} jobs)" for a, b, n in self.rss)
        print(
            f"  server RSS, MiB, each process after its first {WARM_JOBS} jobs -> at its end: {rss}"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench soak", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--workers", type=int, default=32, help="workers of each stage")
    parser.add_argument("--turns", type=int, default=2, help="agent turns a job")
    parser.add_argument("--llm-latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--fault-every", type=int, default=1000, help="finished jobs between faults (0: none)"
    )
    parser.add_argument(
        "--sandbox-every", type=int, default=10, help="every Nth job holds a sandbox"
    )
    parser.add_argument("--max-s", type=float, default=3600.0, help="give up after this long")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        soak = Soak(args, Path(tmp))
        start = time.perf_counter()
        try:
            asyncio.run(soak.run())
        finally:
            soak.stop()
        soak.report(time.perf_counter() - start)
    return 0
