"""A load generator for `raas bench pipeline` that is not the bottleneck (shared by benchmarks).

The job cycle is two requests on one keep-alive connection: POST /v1/rollouts, then a long-poll
GET /v1/rollouts/{job_id}?wait=... for its result. wrk (Debian's ``wrk``, a compiled generator
driven by a Lua script) runs that cycle on one connection per thread, so the script's state is
the connection's. Where wrk is missing, several Python processes run the same cycle on
``http.client``: a fallback that shares the cores with the server and says so.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

NOOP_JOB = json.dumps({"instance": {"data_source": "noop"}})
WAIT_S = 10  # the long-poll's wait; a no-op job ends well within it

# One connection per wrk thread (-t = -c), so a thread's globals are its connection's state.
_CYCLE_LUA = """
local body = %(body)s
local job = nil
jobs, failed = 0, 0
request = function()
  if job == nil then
    return wrk.format("POST", "/v1/rollouts", {["Content-Type"] = "application/json"}, body)
  end
  return wrk.format("GET", "/v1/rollouts/" .. job .. "?wait=%(wait)d")
end
response = function(status, headers, answer)
  if job == nil then
    job = answer:match('"job_id"%%s*:%%s*"([^"]+)"')
    if job == nil then failed = failed + 1 end
  else
    if answer:find('"state"%%s*:%%s*"done"') then jobs = jobs + 1 else failed = failed + 1 end
    job = nil
  end
end
"""
_BARE_LUA = """
jobs, failed = 0, 0
request = function() return wrk.format("GET", "/healthz") end
response = function(status, headers, answer)
  if status ~= 200 then failed = failed + 1 end
end
"""
_DONE_LUA = """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function done(summary, latency, requests)
  local jobs, failed = 0, 0
  for _, t in ipairs(threads) do jobs = jobs + t:get("jobs"); failed = failed + t:get("failed") end
  io.write(string.format("RAAS requests=%d jobs=%d failed=%d errors=%d duration_us=%d"
    .. " p50_us=%d p99_us=%d\\n", summary.requests, jobs, failed,
    summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.status + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class LoadRun:
    """What one run of a load generator did: requests, finished job cycles, their time."""

    requests: int
    jobs: int
    failed: int  # answers that were not what the cycle expects, and transport errors
    seconds: float
    p50_s: float  # per request (a job cycle is two)
    p99_s: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


def wrk_path() -> str | None:
    return shutil.which("wrk")


def run_wrk(url: str, connections: int, seconds: float, cycle: bool) -> LoadRun:
    """wrk for ``seconds`` on ``connections`` connections: job cycles, or GET /healthz."""
    script = _CYCLE_LUA % {"body": json.dumps(NOOP_JOB), "wait": WAIT_S} if cycle else _BARE_LUA
    with tempfile.TemporaryDirectory() as tmp:
        lua = Path(tmp) / "raas.lua"
        lua.write_text(script + _DONE_LUA)
        wrk = wrk_path() or "wrk"
        command = [wrk, "-t", str(connections), "-c", str(connections), "-d", f"{seconds:g}s"]
        command += ["--timeout", f"{WAIT_S + 20}s", "-s", str(lua), url + "/"]
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + WAIT_S + 60, check=True
        ).stdout
    found = re.search(r"^RAAS (.*)$", out, re.M)
    if found is None:
        raise RuntimeError(f"wrk printed no summary: {out[-500:]}")
    n = {k: int(v) for k, v in (kv.split("=") for kv in found.group(1).split())}
    return LoadRun(
        n["requests"],
        n["jobs"],
        n["failed"] + n["errors"],
        n["duration_us"] / 1e6,
        n["p50_us"] / 1e6,
        n["p99_us"] / 1e6,
    )


def _client_process(url: str, seconds: float, cycle: bool, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """One keep-alive connection running job cycles (or GET /healthz) until the time is up."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    latencies: list[float] = []
    jobs = failed = 0

    def call(method: str, path: str, body: str | None = None) -> tuple[int, bytes]:
        start = time.perf_counter()
        headers = {"Content-Type": "application/json"} if body else {}
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
        latencies.append(time.perf_counter() - start)
        return answer.status, data

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if not cycle:
            status, _ = call("GET", "/healthz")
            failed += status != 200
            continue
        _, data = call("POST", "/v1/rollouts", NOOP_JOB)
        job_id = json.loads(data).get("job_id")
        if job_id is None:
            failed += 1
            continue
        _, data = call("GET", f"/v1/rollouts/{job_id}?wait={WAIT_S}")
        if json.loads(data).get("state") == "done":
            jobs += 1
        else:
            failed += 1
    out.put((latencies, jobs, failed))


def run_processes(url: str, processes: int, seconds: float, cycle: bool) -> LoadRun:
    """The fallback: ``processes`` Python clients, one connection each."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_client_process, args=(url, seconds, cycle, out))
        for _ in range(processes)
    ]
    start = time.perf_counter()
    for p in procs:
        p.start()
    answers = [out.get(timeout=seconds + WAIT_S + 60) for _ in procs]
    wall = time.perf_counter() - start
    for p in procs:
        p.join(10)
    latencies = [x for a in answers for x in a[0]]
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return LoadRun(
        len(latencies),
        sum(a[1] for a in answers),
        sum(a[2] for a in answers),
        wall,
        statistics.median(latencies),
        quantiles[98],
    )


def run_load(url: str, connections: int, seconds: float, cycle: bool) -> LoadRun:
    if wrk_path() is not None:
        return run_wrk(url, connections, seconds, cycle)
    return run_processes(url, connections, seconds, cycle)


def generator_name(connections: int) -> str:
    if wrk_path() is not None:
        return f"wrk, {connections} connections"
    return f"{connections} Python client processes (no wrk on PATH)"


MISSING_WRK = (
    "wrk is not installed (apt-get install wrk, or scripts/install-system-deps.sh): the load comes"
    " from Python client processes on the same cores, so the job rate below says as much about"
    " them as about the server"
)
