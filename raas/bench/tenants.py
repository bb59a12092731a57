"""`raas bench tenants`: two tenants share one `raas serve`; does a flood of one starve the other?

End to end over HTTP. Each phase starts a real `raas serve` (a child process, its default
workers: 8 a stage) with a tenants file of its own (a key a tenant, named by its SHA-256
digest) and the admin's key. The jobs are the shipped ``math`` task: a sandbox set up in INIT,
raas's agent loop in RUN, math-verify in EVAL, against a fake model speaking vLLM's protocol in
a process of its own (``raas bench scale``'s): ``--turns`` calls a job (``think``, then
``finish`` with the answer), each answered after ``--llm-latency-ms``, as a GPU server's batch
would be. A job holds a RUN slot for about turns x latency: the slots are what the tenants
share.

Tenant A floods ``--flood`` jobs at once (``POST /v1/rollouts:batch`` with its key); then
tenant B submits a steady ``--rate`` jobs a second for ``--seconds`` with its key, long-polling
each for its result. Phases, each on a fresh server warmed by one job of the admin's:

1. B alone: B's latency (submit to result) with nothing else to do, the floor.
2. one key: A's flood and B's stream both under A's key, one tenant (first come, first served).
3. two tenants: A and B each with a key of its own, weight 1 each.
4. weights 2:1: A (weight 2) and B (weight 1) each flood ``--flood`` jobs; once each has
   finished a job, the jobs each finishes in ``--seconds``, read from the server's per-tenant
   counters (``raas_tenant_jobs_finished_total`` on /metrics, the admin's), and their split.

A job of B's not finished ``--wait-s`` after B's last submission counts as the time it had
waited: a percentile that such a job reaches is a lower bound, printed with ">". Prints B's p50
and p95, the p50's ratio to the floor and A's jobs done meanwhile; where B's finished jobs spent
their time (p50s of: waiting in stage queues, which is what fair share decides; each stage's
work, slowed by A's jobs sharing the cores; the rest: HTTP and the result's record); then the
split, and the machine's load average before and after. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from raas.bench.forked import ForkedServer
from raas.bench.scale import serve_thinking_llm
from raas.launch import ServerProcess
from raas.settings import defaults
from raas.tenants import TenantEntry, TenantsFile, key_digest
from raas.wire import FINAL_STATES, STAGE_NAMES

WIDTH = 80
INSTANCE = {"data_source": "math", "question": "What is 6 * 7?", "answer": "42"}
BATCH = 500  # jobs a request of a flood
PROGRESS_S = 5.0
PARTS = ("queued", *STAGE_NAMES, "other")  # where a finished job's time went


@dataclass(frozen=True)
class Phase:
    name: str
    weights: dict[str, float]  # the tenants file's tenants, and their weights
    flooders: tuple[str, ...]  # the tenants that flood
    stream_key: str | None  # whose key B's steady stream uses (None: no stream)


EVEN = {"a": 1.0, "b": 1.0}
LATENCY_PHASES = (
    Phase("B alone (floor)", EVEN, (), "b"),
    Phase("A+B, one key", EVEN, ("a",), "a"),
    Phase("A+B, two tenants 1:1", EVEN, ("a",), "b"),
)
SPLIT = Phase("weights 2:1", {"a": 2.0, "b": 1.0}, ("a", "b"), None)


@dataclass
class Stream:
    """B's jobs of one phase: each finished one's latency and its parts, and how long each
    unfinished one had waited when it was given up."""

    sent: int = 0
    latency: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PARTS})
    waiting: list[float] = field(default_factory=list)
    failed: int = 0  # finished in another state than done
    others_done: int = 0  # the flooders' jobs done meanwhile

    def finished(self, latency: float, timing: dict[str, float]) -> None:
        queued = timing["queue_s"]
        stages = [timing[f"{stage}_s"] for stage in STAGE_NAMES]
        self.latency.append(latency)
        for part, seconds in zip(
            PARTS, [queued, *stages, latency - queued - sum(stages)], strict=True
        ):
            self.parts[part].append(seconds)

    def percentile(self, q: float) -> tuple[float, bool] | None:
        """The ``q``-th percentile (nearest rank) of every job's latency, and whether it is a
        lower bound (an unfinished job's wait at or below its rank); None with no jobs."""
        every = sorted([(x, False) for x in self.latency] + [(x, True) for x in self.waiting])
        if not every:
            return None
        rank = _rank(q, len(every))
        return every[rank - 1][0], any(cut for _, cut in every[:rank])


def _rank(q: float, n: int) -> int:
    """The nearest rank (1-based) of the ``q``-th percentile of ``n`` values."""
    return max(1, math.ceil(q / 100 * n))


@dataclass(frozen=True)
class Split:
    seconds: float  # the window's length
    done: dict[str, int]  # jobs each tenant finished in it
    left: dict[str, int]  # each tenant's jobs still in flight at its end


class TenantServer:
    """`raas serve` with a tenants file of ``phase``'s tenants (a key each) and the admin's key
    (the per-tenant counters are the admin's only); a tied child, so that a Ctrl-C reaches only
    the bench, which stops it."""

    def __init__(
        self, tmp: Path, index: int, phase: Phase, llm_url: str, args: argparse.Namespace
    ) -> None:
        self.keys = {tenant: secrets.token_urlsafe(24) for tenant in phase.weights}
        self.admin = secrets.token_urlsafe(24)
        tenants = {
            tenant: TenantEntry(key_sha256=[key_digest(self.keys[tenant].encode())], weight=weight)
            for tenant, weight in phase.weights.items()
        }
        tenants_file = tmp / f"tenants-{index}.json"
        tenants_file.write_text(TenantsFile(tenants=tenants).model_dump_json(exclude_none=True))
        env = dict(os.environ)
        env.pop("RAAS_API_KEY_FILE", None)  # a key meant for another server
        env["RAAS_API_KEY"] = self.admin
        queue = len(phase.weights) * args.flood + math.ceil(args.rate * args.seconds) + 100
        flags = ["--tenants-file", str(tenants_file), "--llm", llm_url, "--sandbox", args.sandbox]
        flags += ["--init-queue", str(queue), "--drain-grace-s", "0", "--log-level", "warning"]
        self.process = ServerProcess(
            tmp / f"serve-{index}.db", tmp / f"serve-{index}.log", flags, env, tied=True
        )
        self.url = self.process.url

    def auth(self, tenant: str | None) -> dict[str, str]:
        """The header of ``tenant``'s key (None: the admin's)."""
        key = self.admin if tenant is None else self.keys[tenant]
        return {"Authorization": f"Bearer {key}"}


@contextmanager
def serving(
    tmp: Path, index: int, phase: Phase, llm_url: str, args: argparse.Namespace
) -> Iterator[TenantServer]:
    """A server up and warm (the tokenizer, math-verify and the backend's connections loaded by
    one job of the admin's, which no phase counts); stopped however the block ends."""
    server = TenantServer(tmp, index, phase, llm_url, args)
    try:
        server.process.wait_ready()
        asyncio.run(warm(server))
        yield server
    finally:
        server.process.stop()


# -- load --------------------------------------------------------------------------------------


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=None))


async def run_one(
    http: httpx.AsyncClient,
    server: TenantServer,
    tenant: str | None,
    job_id: str | None,
    deadline: float,
) -> dict[str, Any] | None:
    """Submit a job under ``tenant``'s key and long-poll it: its final status, or None if it
    had not finished by ``deadline`` (``time.perf_counter()``)."""
    headers = server.auth(tenant)
    body: dict[str, Any] = {"instance": INSTANCE} | ({"job_id": job_id} if job_id else {})
    r = await http.post(f"{server.url}/v1/rollouts", json=body, headers=headers)
    r.raise_for_status()
    url = f"{server.url}/v1/rollouts/{r.json()['job_id']}"
    while (left := deadline - time.perf_counter()) > 0:
        wait = min(left, 300.0)
        r = await http.get(url, params={"wait": f"{wait:.3f}"}, headers=headers, timeout=wait + 30)
        r.raise_for_status()
        status: dict[str, Any] = r.json()
        if status["state"] in FINAL_STATES:
            return status
    return None


async def warm(server: TenantServer) -> None:
    async with _client() as http:
        if await run_one(http, server, None, None, time.perf_counter() + 120) is None:
            raise RuntimeError(f"the warm-up job took over 120 s: see {server.process.log_path}")


async def flood(http: httpx.AsyncClient, server: TenantServer, tenant: str, n: int) -> None:
    """Submit ``n`` of ``tenant``'s jobs at once, in a few batches."""
    for start in range(0, n, BATCH):
        jobs = [{"instance": INSTANCE} for _ in range(min(BATCH, n - start))]
        r = await http.post(
            f"{server.url}/v1/rollouts:batch", json={"jobs": jobs}, headers=server.auth(tenant)
        )
        r.raise_for_status()


async def stream(
    http: httpx.AsyncClient,
    server: TenantServer,
    tenant: str,
    args: argparse.Namespace,
    out: Stream,
) -> None:
    """``args.rate`` jobs a second for ``args.seconds`` under ``tenant``'s key, each waited for
    until ``args.wait_s`` after the last submission."""
    n = max(1, round(args.rate * args.seconds))
    begin = time.perf_counter()
    deadline = begin + (n - 1) / args.rate + args.wait_s

    async def one(i: int) -> None:
        start = time.perf_counter()
        status = await run_one(http, server, tenant, f"b-{i}", deadline)
        if status is None:
            out.waiting.append(time.perf_counter() - start)
            return
        out.finished(time.perf_counter() - start, status["result"]["timing"])
        out.failed += status["state"] != "done"

    jobs = []
    for i in range(n):
        await asyncio.sleep(max(0.0, begin + i / args.rate - time.perf_counter()))
        jobs.append(asyncio.create_task(one(i)))
        out.sent += 1
    await asyncio.gather(*jobs)


async def counted(
    http: httpx.AsyncClient, server: TenantServer
) -> tuple[Counter[str], Counter[str]]:
    """Each tenant's jobs done and in flight, from the server's per-tenant counters."""
    r = await http.get(f"{server.url}/metrics", headers=server.auth(None))
    r.raise_for_status()
    done: Counter[str] = Counter()
    in_flight: Counter[str] = Counter()
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            tenant = sample.labels.get("tenant")
            if tenant not in server.keys:  # the admin's warm-up job, or a server-wide series
                continue
            if sample.name == "raas_tenant_jobs_in_flight":
                in_flight[tenant] += int(sample.value)
            elif sample.name == "raas_tenant_jobs_finished_total":
                done[tenant] += int(sample.value) if sample.labels["state"] == "done" else 0
    return done, in_flight


async def progress(
    http: httpx.AsyncClient, server: TenantServer, what: Stream | None, start: float
) -> None:
    """A line every PROGRESS_S: B's jobs sent and finished, each tenant's done and in flight."""
    while True:
        await asyncio.sleep(PROGRESS_S)
        done, in_flight = await counted(http, server)
        line = f"    {time.perf_counter() - start:4.0f} s:"
        if what is not None:
            line += f" B sent {what.sent}, finished {len(what.latency)};"
        tenants = ", ".join(f"{t} {done[t]}/{in_flight[t]}" for t in sorted(server.keys))
        print(f"{line} done/in flight {tenants}", flush=True)


@contextmanager
def reporting(http: httpx.AsyncClient, server: TenantServer, what: Stream | None) -> Iterator[None]:
    task = asyncio.get_running_loop().create_task(progress(http, server, what, time.perf_counter()))
    try:
        yield
    finally:
        task.cancel()


async def latency_phase(server: TenantServer, phase: Phase, args: argparse.Namespace) -> Stream:
    """A's flood first (when the phase has one), then B's stream while it lasts."""
    assert phase.stream_key is not None
    out = Stream()
    async with _client() as http:
        for tenant in phase.flooders:
            await flood(http, server, tenant, args.flood)
        with reporting(http, server, out):
            await stream(http, server, phase.stream_key, args, out)
        done, _ = await counted(http, server)
    out.others_done = sum(done.values()) - (len(out.latency) - out.failed)
    return out


async def split_phase(server: TenantServer, args: argparse.Namespace) -> Split:
    """Both tenants flood; once each has finished a job (the pipeline is full), the jobs each
    finishes in ``args.seconds``."""
    async with _client() as http:
        for tenant in SPLIT.flooders:
            await flood(http, server, tenant, args.flood)
        with reporting(http, server, None):
            give_up = time.perf_counter() + args.wait_s + 60
            done, _ = await counted(http, server)
            while not all(done[t] for t in SPLIT.flooders) and time.perf_counter() < give_up:
                await asyncio.sleep(0.2)
                done, _ = await counted(http, server)
            start = time.perf_counter()
            await asyncio.sleep(args.seconds)
            end, in_flight = await counted(http, server)
            seconds = time.perf_counter() - start
    tenants = SPLIT.flooders
    return Split(
        seconds, {t: end[t] - done[t] for t in tenants}, {t: in_flight[t] for t in tenants}
    )


# -- the report --------------------------------------------------------------------------------

HEADER = (
    f"{'phase':<22}{'B finished':>11}{'p50 ms':>10}{'p95 ms':>10}{'p50/floor':>11}{'A done':>9}"
)
PARTS_HEADER = f"{'B p50 ms (finished)':<22}" + "".join(f"{part:>9}" for part in PARTS)


def _bound(value: float, lower_bound: bool, text: str) -> str:
    return (">" if lower_bound else "") + text.format(value)


def latency_row(name: str, run: Stream, floor: float | None, flooded: bool) -> str:
    p50, p95 = run.percentile(50), run.percentile(95)
    p50_ms = _bound(1000 * p50[0], p50[1], "{:.0f}") if p50 else "-"
    p95_ms = _bound(1000 * p95[0], p95[1], "{:.0f}") if p95 else "-"
    ratio = _bound(p50[0] / floor, p50[1], "{:.2f}x") if p50 and floor else "-"
    a_done = str(run.others_done) if flooded else "-"
    finished = f"{len(run.latency)}/{run.sent}"
    return f"{name:<22}{finished:>11}{p50_ms:>10}{p95_ms:>10}{ratio:>11}{a_done:>9}"


def parts_row(name: str, run: Stream) -> str:
    """The p50 of each part of B's finished jobs' latency."""
    n = len(run.latency)
    cells = [f"{1000 * sorted(run.parts[p])[_rank(50, n) - 1]:.0f}" if n else "-" for p in PARTS]
    return f"{name:<22}" + "".join(f"{cell:>9}" for cell in cells)


def split_lines(split: Split, flood_n: int) -> list[str]:
    a, b = split.done["a"], split.done["b"]
    ratio = f"{a / b:.2f}" if b else "-"
    left = ", ".join(f"{t} {n}" for t, n in split.left.items())
    return [
        f"weights a=2 b=1, each flooding {flood_n} jobs: jobs done in {split.seconds:.1f} s",
        f"  a {a:6d}  b {b:6d}  a/b {ratio} (2.00 is the fair split)",
        f"  in flight at the window's end (both must be, to count): {left}",
    ]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="raas bench tenants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--flood", type=int, default=2000, help="jobs a flooding tenant submits")
    parser.add_argument("--rate", type=float, default=2.0, help="tenant B's jobs a second")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    parser.add_argument(
        "--wait-s",
        type=float,
        default=10.0,
        help="how long B's jobs are waited for after its last submission",
    )
    parser.add_argument("--turns", type=int, default=2, help="model calls a job")
    parser.add_argument("--llm-latency-ms", type=float, default=500.0, help="each call's")
    parser.add_argument(
        "--sandbox", default="bwrap", choices=("bwrap", "local"), help="the server's --sandbox"
    )
    args = parser.parse_args(argv)
    if args.flood < 1 or args.rate <= 0 or args.seconds <= 0 or args.turns < 1:
        parser.error("--flood, --rate, --seconds and --turns must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    d = defaults().pipeline
    workers = f"{d.init_workers}/{d.run_workers}/{d.eval_workers} INIT/RUN/EVAL workers"
    intro = (
        f"raas bench tenants: raas serve ({workers}) running math jobs of {args.turns}"
        f" model calls, a fake vLLM-protocol model answering each in {args.llm_latency_ms:g} ms,"
        f" {args.sandbox} sandboxes; A floods {args.flood} jobs, B submits {args.rate:g} jobs/s"
        f" for {args.seconds:g} s a phase; the server, the model and this client share the"
        f" machine's {os.cpu_count()} cores. Load average before: {_load()}"
    )
    print(textwrap.fill(intro, WIDTH), flush=True)
    rows: list[str] = []
    parts: list[str] = []
    floor = None
    with (
        tempfile.TemporaryDirectory(prefix="raas-bench-tenants-") as tmp,
        ForkedServer(
            serve_thinking_llm, args.turns, args.llm_latency_ms / 1000, health="/health"
        ) as llm,
    ):
        for index, phase in enumerate(LATENCY_PHASES):
            print(f"  {phase.name}: starting raas serve", flush=True)
            with serving(Path(tmp), index, phase, llm.url, args) as server:
                run = asyncio.run(latency_phase(server, phase, args))
            p50 = run.percentile(50)
            if index == 0 and p50 is not None and not p50[1]:
                floor = p50[0]
            rows.append(latency_row(phase.name, run, floor, bool(phase.flooders)))
            parts.append(parts_row(phase.name, run))
            print("  " + rows[-1], flush=True)
        print(f"  {SPLIT.name}: starting raas serve", flush=True)
        with serving(Path(tmp), len(LATENCY_PHASES), SPLIT, llm.url, args) as server:
            split = asyncio.run(split_phase(server, args))
    print()
    for line in [HEADER, *rows, PARTS_HEADER, *parts, *split_lines(split, args.flood)]:
        print(line)
    print(f"load average after: {_load()}")
    return 0
