"""`raas bench soak`: many jobs through one server while it and its backends are broken on a
schedule; what was lost, repeated, failed or left behind, and what the durable turn boundaries
(``--checkpoint``) saved and cost.

One raas server (its own forked process, restarted on the same database and port after each
fault) runs ``--jobs`` agent jobs, ``--in-flight`` at a time, against two fake inference
servers speaking vLLM's protocol (a scripted ``think`` tool call, then ``finish``, see
``raas bench scale``; each answer after ``--llm-latency-ms`` times a uniform draw from 0.5 to
1.5, so that jobs submitted together drift apart); every ``--sandbox-every``-th job also holds
a real bwrap sandbox. Every ``--fault-every`` finished jobs (counted from the last fault) the
next fault of the rotation strikes: the server is SIGKILLed (and restarted), one backend is
SIGKILLed (and restarted a second later), the server gets SIGTERM (it drains, and is
restarted). A SIGKILL strikes at a random moment within the median time from submission to
result of the last 50 jobs after it is due, not right after results came in (which would find
the jobs started together at the same point of their turns, mostly the first). The client
submits with job ids (resubmitting after a refused or broken connection is idempotent) and
reads results by paging the finish order, as a trainer that survives restarts would.

Printed: jobs, faults, lost (submitted, never finished), duplicated (listed twice), failed by
infra and by policy, jobs run more than once, processes and sandbox directories left after the
last stop, 5xx answers, p50/p99 latency (submission to result), and the server's RSS at the start
and the end.

Then, counted at the fake models (each job's question names it, and the model logs each request
with the job and the turn it asks for): for the jobs in flight at each server SIGKILL (as
/v1/rollouts:running listed them just before it), the turns generated again (requests for the
job minus the turns its result kept; total, per job median and max), how many resumed at a
durable turn (the result's resume.resumed_at_turn) or ran from the start, and why not
(resume.refused). The checkpoints' cost per turn, from each result's metrics.checkpoints: the
time the agent loop waited for them (loop_s / the run's turns), their background writing time
per turn, and the archive bytes per checkpoint (sandboxed jobs); and the loop's own time
between two turns (the model's reply sent to the job's next request, gaps that span a fault
left out), p50 and p99. With ``--compare-checkpoint-off`` the same soak runs again under
``--checkpoint off`` (same jobs, same fault schedule), and the figures are set against it.
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import re
import signal
import statistics
import tempfile
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from raas.api.app import runtime_key
from raas.bench.forked import ForkedServer, serve_fake_vllm, serve_raas
from raas.bench.scale import ThinkingModel, ThinkTask, think_settings
from raas.sandbox import procs
from raas.sandbox.runtime import runtime_dir_of
from raas.settings import checkpoint_turns

WARM_JOBS = 100  # RSS "at the start" is read once this many jobs have finished
# Each answer of the fake models comes after --llm-latency-ms times a uniform draw from 1 - this
# to 1 + this: jobs submitted together drift apart, so a kill finds them at every point of a turn.
JITTER = 0.5
KILL = "server SIGKILL"
WIDTH = 80  # every line printed fits
JOB_TAG = re.compile(r"\[job ([\w.-]+)\]")  # how a job's question names it to the model
TASKS = ("think", "think_sandboxed")


class SandboxedThinkTask(ThinkTask):
    """The same job, holding a real sandbox from INIT to cleanup."""

    name = "think_sandboxed"
    needs_sandbox = True


def _serve(port: int, db: Path, llm: list[str], workers: int, checkpoint: str) -> None:
    settings = think_settings(db, llm, workers, drain_grace_s=30, checkpoint=checkpoint)
    # Errors only: the faults make warnings by the thousand.
    serve_raas(port, settings, [ThinkTask(), SandboxedThinkTask()], log_level="error")


def serve_counting_llm(port: int, turns: int, latency_s: float, log_dir: Path) -> None:
    """``raas bench scale``'s scripted model that also logs each request: a line ``q JOB TURN
    T`` as it comes and ``a JOB TURN T`` as its answer goes (JOB: what the prompt's ``[job
    ...]`` names, TURN: the turn it asks for, T: time.monotonic()), written unbuffered to a file
    of this process's own in ``log_dir``, so a SIGKILL loses none."""
    model = ThinkingModel(turns)
    fd = os.open(
        log_dir / f"llm-{port}-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )

    def note(kind: str, prompt: list[int]) -> None:
        found = JOB_TAG.search(model.tokenizer.decode(prompt))
        job = found.group(1) if found else "-"
        os.write(fd, f"{kind} {job} {model.turn(prompt)} {time.monotonic():.6f}\n".encode())

    def reply(prompt: list[int]) -> list[int]:
        note("q", prompt)
        return model.reply(prompt)

    serve_fake_vllm(port, reply, latency_s, answered=partial(note, "a"), jitter=JITTER)


def _rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- what is measured ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One line of a fake model's log: a request asked (``q``) or answered (``a``)."""

    kind: str
    job: str
    turn: int
    at: float


def read_requests(log_dir: Path) -> list[Request]:
    """Every request the fake models logged, in time order (a line cut by a SIGKILL skipped)."""
    found = []
    for path in sorted(log_dir.glob("llm-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] in ("q", "a"):
                try:
                    found.append(Request(parts[0], parts[1], int(parts[2]), float(parts[3])))
                except ValueError:
                    continue
    return sorted(found, key=lambda r: r.at)


@dataclass(frozen=True)
class Final:
    """What the bench keeps of a job's result."""

    task: str
    state: str
    turns: int
    attempts: int
    resumed_at: int | None
    refused: str | None
    checkpoints: dict[str, Any] | None

    @classmethod
    def of(cls, result: dict[str, Any]) -> Final:
        resume = result.get("resume") or {}
        return cls(
            str(result.get("data_source", "")),
            str(result["state"]),
            len((result.get("trajectory") or {}).get("turns") or []),
            int(result.get("attempts", 1)),
            resume.get("resumed_at_turn"),
            resume.get("refused"),
            (result.get("metrics") or {}).get("checkpoints"),
        )


@dataclass
class Kill:
    """A server SIGKILL: when, the jobs in flight just before it (job -> state, turns), and when
    its successor was started: a request the models log before that is the killed server's (one
    it sent as it died may be logged a little after the kill)."""

    at: float
    running: dict[str, tuple[str, int]] | None  # None: the listing failed
    successor_at: float = float("inf")

    def asked_by_it(self, request: Request) -> bool:
        """Whether ``request`` came from the killed server."""
        return request.at < self.successor_at


def kill_outcome(final: Final | None, state: str, asked: Sequence[int]) -> tuple[str, str | None]:
    """How a job in flight at a server SIGKILL (in ``state`` as listed just before it, having
    asked the models for ``asked`` turns before it) went on, by its result: ``resumed``, ``from
    the start`` (and why), ``before`` (its result was written before the kill took effect) or
    ``not finished``."""
    if final is None:
        return "not finished", None
    if final.resumed_at is not None:
        return "resumed", None
    if final.refused is not None:
        return "from the start", final.refused
    if final.attempts == 1:
        return "before", None
    if not asked:
        return "from the start", f"had not asked the model before the kill ({state})"
    if max(asked) == 0:
        return "from the start", "killed in its first turn: no turn boundary yet"
    return "from the start", "no checkpoint at the restart, past its first turn"


def kill_asked(kill: Kill, asks: Sequence[Request]) -> list[int]:
    """The turns a job's requests ``asks`` asked the models for from the server ``kill``
    killed."""
    return [r.turn for r in asks if kill.asked_by_it(r)]


def run_estimate_s(args: argparse.Namespace) -> float:
    """About a job's RUN: its turns at the model, and as long again for the loop's own work."""
    return 2 * int(args.turns) * float(args.llm_latency_ms) / 1000


def generated_again(requests: Sequence[Request], finals: dict[str, Final]) -> dict[str, int]:
    """Each finished job's extra requests: those the models got for it minus the turns its
    result kept (the turns generated again, whatever the cause)."""
    asked = Counter(r.job for r in requests if r.kind == "q")
    return {job: asked[job] - final.turns for job, final in finals.items()}


def turn_gaps(
    requests: Sequence[Request], faults: Sequence[tuple[float, float]]
) -> dict[str, list[float]]:
    """The loop's own time between two turns, by job: from the answer to turn k going out to the
    first request for turn k + 1 after it; gaps that overlap a fault's window left out."""
    answered: dict[tuple[str, int], float] = {}  # (job, turn) -> its latest answer
    taken: set[tuple[str, float]] = set()
    gaps: dict[str, list[float]] = defaultdict(list)
    for r in requests:  # in time order
        if r.kind == "a":
            answered[r.job, r.turn] = r.at
            continue
        before = answered.get((r.job, r.turn - 1))
        if before is None or (r.job, before) in taken:
            continue
        taken.add((r.job, before))
        if not any(start <= r.at and before <= end for start, end in faults):
            gaps[r.job].append(r.at - before)
    return gaps


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0.5, 0.99) of ``values`` by rank; NaN of none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _three(x: float) -> str:
    """``x`` in at most 3 significant figures' room: 1.23, 12.3, 123."""
    return f"{x:.2f}" if x < 9.995 else f"{x:.1f}" if x < 99.95 else f"{x:.0f}"


def duration(s: float) -> str:
    """``s`` seconds in at most 7 characters (``-``: none)."""
    if s != s:  # NaN
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 0.9995:
        return f"{_three(s * 1e3)} ms"
    return f"{_three(s)} s"


def size(n: float) -> str:
    """``n`` bytes in at most 7 characters (``-``: none)."""
    if n != n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 999.5 or unit == "GiB":
            return f"{n:.1f} {unit}" if n < 9.95 and unit != "B" else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b == b and a == a and b > 0 else "-"


def fit(line: str) -> str:
    """``line`` cut to the width (a refusal's reason can be long)."""
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


# -- the soak ------------------------------------------------------------------------------------


@dataclass
class Leg:
    """One soak's figures, kept for the comparison between legs."""

    checkpoint: str
    again: dict[str, int] = field(default_factory=dict)  # in flight at a SIGKILL: job -> again
    gaps: dict[str, list[float]] = field(default_factory=dict)  # by task


class Soak:
    """One soak under one ``--checkpoint`` mode: ``start``, ``run``, ``stop``, ``report``."""

    def __init__(self, args: argparse.Namespace, tmp: Path, checkpoint: str) -> None:
        self.args = args
        self.checkpoint = checkpoint
        self.db = tmp / "soak.db"
        self.log_dir = tmp / "llm"
        self.log_dir.mkdir()
        self.llms: list[ForkedServer] = []
        self.server: ForkedServer | None = None
        self.submitted: dict[str, float] = {}
        self.latency: list[float] = []
        self.seen: Counter[str] = Counter()
        self.finals: dict[str, Final] = {}
        self.outcomes: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.windows: list[tuple[float, float]] = []  # each fault, from its strike to its end
        self.kills: list[Kill] = []
        self.status: Counter[int] = Counter()
        self.processes: set[tuple[int, int | None]] = set()
        # Each server process's RSS after its first WARM_JOBS jobs (tokenizer and caches
        # loaded) and at its end, with the jobs it finished: [start MiB, end MiB, jobs].
        self.rss: list[list[float]] = []
        self._process_from = 0  # len(self.seen) when the current server process started

    def start(self) -> None:
        """The two fake models, then the server."""
        for _ in range(2):
            llm = self._llm(port=None)
            self.llms.append(llm)  # stopped by stop() even if it never answers
            llm.__enter__()
        self.server = self._start_server(port=None)

    @property
    def up(self) -> ForkedServer:
        """The server (started)."""
        assert self.server is not None, "start() first"
        return self.server

    def _llm(self, port: int | None) -> ForkedServer:
        latency_s = self.args.llm_latency_ms / 1000
        return ForkedServer(
            serve_counting_llm,
            self.args.turns,
            latency_s,
            self.log_dir,
            health="/health",
            port=port,
        )

    def _start_server(self, port: int | None) -> ForkedServer:
        urls = [llm.url for llm in self.llms]
        server = ForkedServer(_serve, self.db, urls, self.args.workers, self.checkpoint, port=port)
        return server.__enter__()

    # -- faults --------------------------------------------------------------------------------

    async def strike(self, fault: str, http: httpx.AsyncClient) -> None:
        """Strike ``fault``; a server SIGKILL right after listing the jobs in flight."""
        self.faults[fault] += 1
        self.note_processes()
        if fault in (KILL, "server SIGTERM"):
            sigkill = fault == KILL
            running = await self.running(http) if sigkill else None
            self._end_of_process()
            started = time.monotonic()
            assert self.up.proc.pid is not None
            os.kill(self.up.proc.pid, signal.SIGKILL if sigkill else signal.SIGTERM)
            if sigkill:
                self.kills.append(Kill(started, running))
            await asyncio.to_thread(self._restart_server, self.kills[-1] if sigkill else None)
            self.windows.append((started, time.monotonic()))
            return
        started = time.monotonic()
        llm = self.llms[self.faults[fault] % 2]
        assert llm.proc.pid is not None
        os.kill(llm.proc.pid, signal.SIGKILL)
        llm.proc.join(10)
        # Only the kill itself is this fault's window: the loop's time between turns runs from
        # an answer to the first ask after it, which a cut request's retry is not.
        self.windows.append((started, time.monotonic()))
        await asyncio.sleep(1.0)
        index = self.llms.index(llm)
        self.llms[index] = await asyncio.to_thread(self._restart_llm, llm.port)

    async def running(self, http: httpx.AsyncClient) -> dict[str, tuple[str, int]] | None:
        """The jobs in flight as the server lists them (None: it did not answer)."""
        try:
            r = await http.get(f"{self.up.url}/v1/rollouts:running", params={"limit": 10000})
        except httpx.TransportError:
            return None
        if r.status_code != 200:
            return None
        return {j["job_id"]: (j["state"], int(j["turns"])) for j in r.json()["jobs"]}

    def _restart_server(self, kill: Kill | None) -> None:
        """Wait for the server (signalled) to end, and start it again on its port."""
        self.up.proc.join(120)
        if kill is not None:
            kill.successor_at = time.monotonic()
        self.server = self._start_server(port=self.up.port)
        self._process_from = len(self.seen)

    def _watch_rss(self) -> None:
        jobs = len(self.seen) - self._process_from
        if jobs >= WARM_JOBS and (not self.rss or self.rss[-1][2] >= 0):
            self.rss.append([_rss_mb(self.up.proc.pid), float("nan"), -1])

    def _end_of_process(self) -> None:
        if self.rss and self.rss[-1][2] < 0:
            self.rss[-1][1:] = [_rss_mb(self.up.proc.pid), len(self.seen) - self._process_from]

    def _restart_llm(self, port: int) -> ForkedServer:
        return self._llm(port=port).__enter__()

    def note_processes(self) -> None:
        pid = self.up.proc.pid
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
            # The question names the job, so the fake model can count its requests by job.
            question = f"6 * 7 [job {job_id}]"
            instance = {"data_source": source, "question": question, "answer": "42"}
            jobs.append({"instance": instance, "job_id": job_id})
        while True:  # the same ids again after a refusal or a broken connection: idempotent
            try:
                r = await http.post(f"{self.up.url}/v1/rollouts:batch", json={"jobs": jobs})
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
            r = await http.get(f"{self.up.url}/v1/rollouts", params={"since": since, "limit": 1000})
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
            self.finals[job_id] = Final.of(result)
            self.latency.append(now - self.submitted.get(job_id, now))
            error = result.get("error") or {}
            kind = f"failed by {error.get('kind')}" if result["state"] != "done" else "done"
            self.outcomes[kind] += 1
            if result.get("attempts", 1) > 1:
                self.outcomes["ran more than once"] += 1
        if not page["results"]:
            await asyncio.sleep(0.05)
        return int(page["next_since"])

    def job_s(self) -> float:
        """The median time from submission to result of the last 50 jobs (before any: about a
        job's RUN)."""
        recent = self.latency[-50:]
        return statistics.median(recent) if recent else run_estimate_s(self.args)

    async def run(self) -> None:
        args = self.args
        ids = iter(f"soak-{i}" for i in range(args.jobs))
        rotation = itertools.cycle([KILL, "backend SIGKILL", "server SIGTERM"])
        fault = next(rotation)
        next_fault = args.fault_every
        strike_at: float | None = None
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
                    if strike_at is None:
                        # A server SIGKILL at a random moment within a job's time from
                        # submission to result: right after results came in (and the jobs
                        # submitted in their place), it would find jobs started together at the
                        # same point of their turns, mostly the first.
                        delay = random.uniform(0, self.job_s()) if fault == KILL else 0.0
                        strike_at = time.monotonic() + delay
                    if time.monotonic() >= strike_at:
                        await self.strike(fault, http)
                        fault, strike_at = next(rotation), None
                        # The next fault is counted from here, the results of the jobs a drain
                        # finished read first (one page holds them): read later, they would
                        # bring it straight on a server that has just started.
                        since = await self.collect(http, since)
                        next_fault = len(self.seen) + args.fault_every
                if len(self.seen) % 500 == 0:
                    self.note_processes()
                self._watch_rss()
        self._end_of_process()

    def stop(self) -> None:
        if self.server is not None:
            self.note_processes()
            self.server.proc.terminate()  # SIGTERM: it drains and releases its directory
            self.server.proc.join(120)
        for llm in self.llms:
            llm.__exit__()

    # -- the report ----------------------------------------------------------------------------

    def report(self, wall_s: float) -> Leg:
        there = {pid for pid, started in self.processes if procs.start_time(pid) == started}
        there.discard(os.getpid())
        left = {pid for pid in there if procs.alive(pid)}
        exited = len(there - left)  # zombies: ended, their parent has not reaped them yet
        left_commands = sorted(procs.command_line(pid)[:76] for pid in left)
        runtime = runtime_dir_of(runtime_key(self.db))
        dirs = len(list(runtime.iterdir())) if runtime.exists() else 0
        lost = len(set(self.submitted) - set(self.seen))
        duplicated = sum(1 for n in self.seen.values() if n > 1)
        server_errors = sum(n for code, n in self.status.items() if code >= 500)
        lat = self.latency
        faults = ", ".join(f"{n} {name}" for name, n in sorted(self.faults.items())) or "none"
        print(
            f"soak, --checkpoint {self.checkpoint}: {len(self.submitted)} jobs submitted,"
            f" {len(self.seen)} finished in {wall_s:.0f} s"
        )
        print(
            f"  {self.args.in_flight} in flight, {self.args.turns} turns a job, 1 in"
            f" {self.args.sandbox_every} with a sandbox, LLM latency"
            f" {self.args.llm_latency_ms:g} ms"
        )
        print(f"  faults: {sum(self.faults.values())} ({faults})")
        print(
            f"  lost {lost}, duplicated {duplicated}; "
            + ", ".join(f"{kind} {n}" for kind, n in sorted(self.outcomes.items()))
        )
        print(
            f"  left after the last stop: {len(left)} processes, "
            + (f"{dirs} sandbox directories" if runtime.exists() else "no sandbox directory")
            + ("" if runtime.exists() else " (theirs is gone)")
        )
        if exited:
            print(f"    and {exited} that had exited, not yet reaped by their parent (zombies)")
        for command in left_commands:
            print(f"    {command}")
        print(f"  HTTP 5xx answers: {server_errors} of {sum(self.status.values())}")
        if lat:
            print(
                f"  latency (submit to result): p50 {statistics.median(lat):.3f} s,"
                f" p99 {pct(lat, 0.99):.3f} s"
            )
        rss = ", ".join(f"{a:.0f} -> {b:.0f} ({n:.0f} jobs)" for a, b, n in self.rss)
        print(f"  server RSS, MiB, each process after its first {WARM_JOBS} jobs -> at its end:")
        for line in textwrap.wrap(rss or "(none ran that many)", WIDTH - 4):
            print(f"    {line}")
        requests = read_requests(self.log_dir)
        leg = Leg(self.checkpoint)
        self.report_kills(requests, generated_again(requests, self.finals), leg)
        self.report_cost()
        self.report_gaps(requests, leg)
        return leg

    def report_kills(self, requests: Sequence[Request], extra: dict[str, int], leg: Leg) -> None:
        """The jobs in flight at each server SIGKILL: the turns generated again, resumed or
        not and why. ``extra``: each job's requests beyond the turns its result kept."""
        listed = [kill for kill in self.kills if kill.running is not None]
        print(
            f"  jobs in flight at a server SIGKILL ({len(self.kills)} kills"
            + (
                f", {len(self.kills) - len(listed)} not listed"
                if len(listed) < len(self.kills)
                else ""
            )
            + "): turns generated again"
        )
        if not listed:
            return
        # A job in flight at two kills is one job here, at the first.
        at_kill: dict[str, tuple[Kill, str]] = {}
        for kill in listed:
            assert kill.running is not None
            for job, (state, _) in kill.running.items():
                at_kill.setdefault(job, (kill, state))
        asks: dict[str, list[Request]] = defaultdict(list)
        for r in requests:
            if r.kind == "q":
                asks[r.job].append(r)
        print(
            f"  {'task':<16}{'listed':>6}{'before':>7}{'asked':>6}{'again':>6}{'median':>7}"
            f"{'max':>4}{'extra':>6}{'resumed':>8}{'restarted':>10}"
        )
        rows: dict[str, list[str]] = {task: [] for task in TASKS}
        for job in at_kill:
            final = self.finals.get(job)
            rows.setdefault(final.task if final is not None else "(not finished)", []).append(job)
        reasons: Counter[str] = Counter()
        spread: Counter[int] = Counter()
        lag: Counter[int] = Counter()  # last turn asked before the kill - resumed_at_turn
        for task, jobs in rows.items():
            if not jobs:
                continue
            outcomes: Counter[str] = Counter()
            again: dict[str, int] = {}  # the jobs the kill hit: their turns generated again
            asked = []  # those of them that had asked the model before it
            for job in jobs:
                kill, state = at_kill[job]
                before = kill_asked(kill, asks[job])
                final = self.finals.get(job)
                outcome, why = kill_outcome(final, state, before)
                outcomes[outcome] += 1
                if outcome == "before":
                    continue  # not in flight when the kill took effect
                after = {r.turn for r in asks[job] if not kill.asked_by_it(r)}
                again[job] = len(set(before) & after)
                if before:
                    asked.append(job)
                if why is not None:
                    reasons[why] += 1
                if final is not None and final.resumed_at is not None and before:
                    lag[max(before) - final.resumed_at] += 1
            per_job = [again[j] for j in asked]
            spread.update(per_job)
            med = f"{statistics.median(per_job):g}" if per_job else "-"
            top = f"{max(per_job)}" if per_job else "-"
            print(
                f"  {task:<16}{len(jobs):>6}{outcomes['before']:>7}{len(asked):>6}"
                f"{sum(again.values()):>6}{med:>7}{top:>4}"
                f"{sum(extra.get(j, 0) for j in again):>6}"
                f"{outcomes['resumed']:>8}{outcomes['from the start']:>10}"
            )
            leg.again.update({j: again[j] for j in asked})
        print("    listed: by /v1/rollouts:running just before the kill; before: their results")
        print("    were written before it took effect (left out of the rest); asked: had asked")
        print("    the model for a turn before the server died; again: the turns the models")
        print("    were asked for both by the killed server and after it (median, max: per job")
        print("    asked); extra: the requests the models got beyond the turns the results kept")
        print("    (any cause: a backend's SIGKILL too); restarted: ran from the start")
        if spread:
            parts = ", ".join(f"{k} x {n}" for n, k in sorted(spread.items()))
            print(fit(f"  jobs asked, by turns generated again: {parts}"))
        if lag:
            print(
                f"  resumed jobs (that had asked): at the turn asked last before the kill {lag[0]},"
            )
            print(
                f"    at a turn before it {sum(n for k, n in lag.items() if k > 0)}"
                f" (its checkpoint not durable at the kill), after it"
                f" {sum(n for k, n in lag.items() if k < 0)}"
            )
        for why, n in reasons.most_common():
            print(fit(f"  from the start, {n}: {why}"))
        # The worst ones, as the models saw them.
        worst = sorted((j for j in leg.again if leg.again[j] > 1), key=lambda j: -leg.again[j])
        for job in worst[:3]:
            kill, state = at_kill[job]
            prior = ",".join(str(r.turn) for r in asks[job] if kill.asked_by_it(r))
            later = ",".join(str(r.turn) for r in asks[job] if not kill.asked_by_it(r))
            final = self.finals[job]
            print(
                fit(
                    f"    e.g. {job} ({state}): asked {prior} | kill | {later};"
                    f" resumed at {final.resumed_at}, kept {final.turns}"
                )
            )
        others = {j: n for j, n in extra.items() if j not in at_kill and n > 0}
        print(
            f"  extra requests of the jobs not in flight at a server SIGKILL:"
            f" {sum(others.values())} ({len(others)} jobs)"
        )

    def report_cost(self) -> None:
        """The checkpoints' cost per turn, from each result's metrics.checkpoints."""
        if checkpoint_turns(self.checkpoint) == 0:
            return
        print("  checkpoint cost per turn (each job's last run), over jobs:")
        print(f"  {'':<16}{'':>5}{'':>6}{'loop wait/turn':>16}{'write/turn':>16}{'bytes/ckpt':>16}")
        print(f"  {'task':<16}{'jobs':>5}{'ckpts':>6}" + f"{'p50':>8}{'p99':>8}" * 3)
        stopped: Counter[str] = Counter()
        for task in TASKS:
            loop, write, per_ckpt = [], [], []
            written = 0
            for final in self.finals.values():
                c = final.checkpoints
                if final.task != task or c is None:
                    continue
                turns = final.turns - (final.resumed_at or 0)
                if turns <= 0:
                    continue
                loop.append(float(c["loop_s"]) / turns)
                write.append(float(c["write_s"]) / turns)
                written += int(c["written"])
                if c["written"]:
                    per_ckpt.append(int(c["bytes"]) / int(c["written"]))
                if c.get("stopped"):
                    stopped[str(c["stopped"])] += 1
            if not loop:
                continue
            cells = [
                unit(pct(values, q))
                for values, unit in ((loop, duration), (write, duration), (per_ckpt, size))
                for q in (0.5, 0.99)
            ]
            print(f"  {task:<16}{len(loop):>5}{written:>6}" + "".join(f"{c:>8}" for c in cells))
        print("    loop wait: metrics.checkpoints.loop_s / the turns of the job's last run")
        print("    (after resumed_at_turn); write: write_s (in the background) / those turns;")
        print("    bytes: the workspace archive's, per checkpoint written (none: no sandbox)")
        for why, n in stopped.most_common():
            print(fit(f"  stopped, {n} jobs: {why}"))

    def report_gaps(self, requests: Sequence[Request], leg: Leg) -> None:
        gaps = turn_gaps(requests, self.windows)
        for task in TASKS:
            leg.gaps[task] = [
                g
                for job, found in gaps.items()
                if job in self.finals and self.finals[job].task == task
                for g in found
            ]
        print("  the loop's own time between turns (a model answer out -> the job's next ask):")
        for task in TASKS:
            values = leg.gaps[task]
            print(
                f"  {task:<16}{len(values):>6} gaps, p50 {duration(pct(values, 0.5)):>7},"
                f" p99 {duration(pct(values, 0.99)):>7}"
            )


def compare(legs: Sequence[Leg]) -> None:
    """The first leg against the last (``--checkpoint off``): turns generated again, and the
    loop's time between turns."""
    first, off = legs[0], legs[-1]
    print(
        f"--checkpoint {first.checkpoint} against --checkpoint off (same jobs, same fault"
        " schedule):"
    )
    print("  jobs in flight at a server SIGKILL that had asked the model:")
    print(f"  {'':<26}{'jobs':>6}{'turns again':>13}{'per job median':>16}{'max':>6}")
    for leg in (first, off):
        counts = list(leg.again.values())
        med = f"{statistics.median(counts):g}" if counts else "-"
        top = f"{max(counts)}" if counts else "-"
        name = f"--checkpoint {leg.checkpoint}"
        print(f"    {name:<24}{len(counts):>6}{sum(counts):>13}{med:>16}{top:>6}")
    title = "the loop's own time between turns"
    print(f"  {title:<34}{'gaps':>6}{'p50':>9}{'p99':>9}{'p50/off':>10}{'p99/off':>10}")
    for task in TASKS:
        a, b = first.gaps.get(task, []), off.gaps.get(task, [])
        print(f"    {task}")
        for mode, values in ((first.checkpoint, a), ("off", b)):
            name = f"--checkpoint {mode}"
            line = (
                f"      {name:<30}{len(values):>6}{duration(pct(values, 0.5)):>9}"
                f"{duration(pct(values, 0.99)):>9}"
            )
            if values is a:
                line += (
                    f"{ratio(pct(a, 0.5), pct(b, 0.5)):>10}{ratio(pct(a, 0.99), pct(b, 0.99)):>10}"
                )
            print(line)


def _checkpoint_mode(value: str) -> str:
    try:
        checkpoint_turns(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value.strip().lower()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raas bench soak",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in all")
    parser.add_argument(
        "--in-flight", type=int, default=64, help="jobs submitted and not finished at a time"
    )
    parser.add_argument("--workers", type=int, default=32, help="workers of each stage")
    parser.add_argument(
        "--turns", type=int, default=2, help="agent turns a job (turns - 1 think, then finish)"
    )
    parser.add_argument(
        "--llm-latency-ms",
        type=float,
        default=20.0,
        help="the fake models' mean time to answer (each answer: 0.5 to 1.5 times it)",
    )
    parser.add_argument(
        "--fault-every",
        type=int,
        default=1000,
        help="finished jobs between two faults, counted from the last (0: none)",
    )
    parser.add_argument(
        "--sandbox-every", type=int, default=10, help="every Nth job holds a sandbox"
    )
    parser.add_argument(
        "--max-s", type=float, default=3600.0, help="give up after this long (seconds, a leg)"
    )
    parser.add_argument(
        "--checkpoint",
        type=_checkpoint_mode,
        default="turn",
        help="the server's --checkpoint setting: turn, every-N or off",
    )
    parser.add_argument(
        "--compare-checkpoint-off",
        action="store_true",
        help="then run the same soak (jobs, fault schedule) under --checkpoint off, and set"
        " the turns generated again and the loop's time between turns against it",
    )
    return parser


def soak(args: argparse.Namespace, tmp: Path, checkpoint: str) -> Leg:
    run = Soak(args, tmp, checkpoint)
    try:
        run.start()
        start = time.perf_counter()
        asyncio.run(run.run())
    finally:
        run.stop()
    return run.report(time.perf_counter() - start)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    modes = [args.checkpoint]
    if args.compare_checkpoint_off and args.checkpoint != "off":
        modes.append("off")
    legs = []
    with tempfile.TemporaryDirectory(prefix="raas-soak-") as tmp:
        for i, mode in enumerate(modes):
            leg_dir = Path(tmp) / f"leg-{i}"
            leg_dir.mkdir()
            legs.append(soak(args, leg_dir, mode))
    if len(legs) > 1:
        compare(legs)
    return 0
