"""`raas bench scale`: what one raas server process costs per agent turn, and how servers add up.

The agent loop is raas's own (chat rendering, token bookkeeping, tool-call parsing, the tools'
dispatch, the pipeline, SQLite), on the real SmolLM2 tokenizer; only the model and the tools are
fast fakes: an inference server speaking vLLM's protocol that answers in ``--llm-latency-ms``
with a scripted tool call (``think`` for ``--turns`` - 1 turns, then ``finish``), and ``think``,
a tool that runs no sandbox. So the workload is I/O-bound: the server waits on HTTP and spends
CPU only on its own work.

Part 1: the server's CPU seconds (its own process, from /proc) divided by the agent turns and
the jobs it served, i.e. how many concurrent rollouts one core of a node can drive. Its floor,
same run: the CPU of the one request a turn makes to the model, alone (raas's LLM client in
this process, as many in flight, the same prompt length).
Part 2: throughput (jobs/s) with 1, 2 and 4 server processes behind one RolloutClient, each
server kept full (its RUN workers all busy), and the efficiency against linear (k servers: k
times one). Every process, the client's and the fake model's included, shares this machine's
cores, so the efficiency says as much about the machine as about raas. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from raas.bench.forked import ForkedServer, serve_fake_vllm, serve_raas
from raas.client import RolloutClient
from raas.llm.chat import encode
from raas.llm.clients import VLLMClient
from raas.llm.models import load_tokenizer
from raas.llm.types import SamplingParams
from raas.settings import ServeSettings
from raas.tasks import RewardInfo
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.services import TaskServices
from raas.wire import RolloutRequest, Trajectory


class ThinkTask(AgentTask):
    """Think some turns, then finish with the answer; nothing runs in a sandbox."""

    name = "think"
    tools = ("think", "finish")
    needs_sandbox = False
    default_max_turns = 64

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "Think step by step with the think tool, then finish."},
            {"role": "user", "content": f"What is {instance['question']}?"},
        ]

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        return {"answer": ctx.answer}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        return RewardInfo(1.0 if artifact["answer"] == instance["answer"] else 0.0)


def _as_bytes(ids: list[int]) -> bytes:
    return b"".join(t.to_bytes(4, "little") for t in ids)


def tool_call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ThinkingModel:
    """The scripted model: ``think`` until turns - 1 turns are taken, then ``finish``.

    raas sends back the exact token ids of the conversation, so the assistant headers in the
    prompt count the turns taken (the last one opens the turn being asked for). Each thought
    differs: raas stops an agent that repeats the same call.
    """

    def __init__(self, turns: int) -> None:
        self.tokenizer = load_tokenizer("smollm2")
        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.header = _as_bytes(encode(self.tokenizer, "<|im_start|>assistant"))
        self.replies = [
            encode(self.tokenizer, tool_call("think", thought=f"step {k}")) + [eos]
            for k in range(turns - 1)
        ]
        self.replies.append(encode(self.tokenizer, tool_call("finish", answer="42")) + [eos])

    def turn(self, prompt: list[int]) -> int:
        """The turn ``prompt`` asks for (0: the first)."""
        return _as_bytes(prompt).count(self.header) - 1

    def reply(self, prompt: list[int]) -> list[int]:
        return self.replies[min(self.turn(prompt), len(self.replies) - 1)]


def serve_thinking_llm(port: int, turns: int, latency_s: float) -> None:
    """vLLM's /v1/completions answering as ``ThinkingModel(turns)``, after ``latency_s``."""
    serve_fake_vllm(port, ThinkingModel(turns).reply, latency_s)


def think_settings(db: Path, llm: list[str], workers: int, **more: Any) -> ServeSettings:
    """A server of ``ThinkTask`` jobs on the fake model: ``workers`` in every stage, queues
    never the limit."""
    fields: dict[str, Any] = {"db": db, "llm": llm, "llm_capacity": 4096, "tokenizer": "smollm2"}
    for stage in ("init", "run", "eval"):
        fields |= {f"{stage}_workers": workers, f"{stage}_queue": 4096}
    return ServeSettings(**fields, **more)


def _serve_raas(port: int, db: Path, llm_url: str, workers: int) -> None:
    serve_raas(port, think_settings(db, [llm_url], workers), [ThinkTask()])


async def run_jobs(urls: list[str], jobs: int, in_flight: int, tag: str) -> tuple[float, int]:
    """Run the jobs over the servers with ``in_flight`` at a time; wall time and turns served."""
    gate = asyncio.Semaphore(in_flight)
    turns = 0
    async with RolloutClient(urls, status_every_s=0.5) as client:

        async def one(i: int) -> None:
            nonlocal turns
            async with gate:
                request = RolloutRequest(
                    instance={"data_source": "think", "question": "6 * 7", "answer": "42"},
                    job_id=f"{tag}-{i}",
                )
                job_id = await client.submit(request)
                result = await client.wait(job_id, poll_s=30)
            if result.state != "done" or result.reward != 1.0:
                why = f"{result.state}, reward {result.reward}: {result.error}"
                raise RuntimeError(f"job {job_id} ended {why}")
            turns += len(result.trajectory.turns)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(jobs)))
        return time.perf_counter() - start, turns


async def request_cpu(llm_url: str, prompt_tokens: int, requests: int, in_flight: int) -> float:
    """CPU seconds of this process per bare request to the model (the floor of a turn)."""
    client = VLLMClient(llm_url, model="fake")
    prompt = list(range(prompt_tokens))
    gate = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with gate:
            await client.generate(prompt, SamplingParams(max_tokens=64))

    try:
        await asyncio.gather(*(one() for _ in range(in_flight)))  # connections up
        start = time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        return (time.process_time() - start) / requests
    finally:
        await client.aclose()


def cpu_cost(args: argparse.Namespace, tmp: Path, llm_url: str) -> None:
    with ForkedServer(_serve_raas, tmp / "cpu.db", llm_url, args.workers) as server:
        asyncio.run(run_jobs([server.url], args.workers, args.workers, "warm"))
        costs = []
        for r in range(args.repeats):
            before = server.cpu_s()
            wall, turns = asyncio.run(run_jobs([server.url], args.jobs, args.workers, f"c{r}"))
            cpu = server.cpu_s() - before
            costs.append((cpu / turns, cpu / args.jobs, args.jobs / wall, cpu / wall))
    per_turn, per_job, rate, busy = (statistics.median(c[i] for c in costs) for i in range(4))
    # A turn's prompt is the job's conversation so far: about 300 tokens here.
    # Medians of as many runs of 16 rounds: a few dozen requests alone gave floors 4x apart.
    floor = statistics.median(
        asyncio.run(request_cpu(llm_url, 300, 16 * args.workers, args.workers))
        for _ in range(args.repeats)
    )
    print(
        f"part 1: one server, {args.jobs} jobs of {args.turns} turns, {args.workers} in flight,"
        f" LLM latency {args.llm_latency_ms:g} ms; medians of {args.repeats}"
        f" (load average {load_average()}: other work on the cores slows both figures)"
    )
    print(
        f"  server CPU per agent turn: {1000 * per_turn:.2f} ms; per job: {1000 * per_job:.1f} ms"
        f" ({busy:.2f} cores busy at {rate:.1f} jobs/s)"
    )
    print(
        f"  floor, one bare request to the model (raas's LLM client alone, {args.workers} in"
        f" flight): {1000 * floor:.2f} ms CPU; a turn is {per_turn / floor:.1f}x it"
    )
    print(
        f"  one core drives about {1 / per_turn:.0f} agent turns/s, i.e. about"
        f" {1 / per_turn * args.real_turn_s:.0f} concurrent rollouts whose turns take"
        f" {args.real_turn_s:g} s of model and tool time"
    )


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for a benchmark's report."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def throughput(args: argparse.Namespace, tmp: Path, llm_url: str) -> None:
    """k servers of ``workers`` each, kept full: k * workers jobs in flight, k * jobs in all."""
    print(
        f"part 2: k servers of {args.workers} RUN workers each, k x {args.workers} jobs in"
        f" flight, k x {args.jobs} jobs, spread by one RolloutClient"
    )
    rates: dict[int, float] = {}
    for k in args.servers:
        runs = []
        servers = [
            ForkedServer(_serve_raas, tmp / f"s{k}-{i}.db", llm_url, args.workers) for i in range(k)
        ]
        for server in servers:
            server.__enter__()
        try:
            urls = [s.url for s in servers]
            in_flight = k * args.workers
            asyncio.run(run_jobs(urls, in_flight, in_flight, f"w{k}"))
            for r in range(args.repeats):
                wall, _ = asyncio.run(run_jobs(urls, k * args.jobs, in_flight, f"t{k}-{r}"))
                runs.append(k * args.jobs / wall)
        finally:
            for server in servers:
                server.__exit__()
        rates[k] = statistics.median(runs)
        first = args.servers[0]
        linear = k * rates[first] / first
        print(
            f"  {k} server process{'es' if k > 1 else '  '}: {rates[k]:6.1f} jobs/s,"
            f" {rates[k] / rates[first]:.2f}x of {first},"
            f" efficiency vs linear {100 * rates[k] / linear:5.1f}%"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench scale", description=__doc__)
    parser.add_argument("--jobs", type=int, default=64, help="jobs a server, a run")
    parser.add_argument("--turns", type=int, default=4, help="agent turns a job")
    parser.add_argument(
        "--workers", type=int, default=16, help="RUN workers a server: its jobs in flight"
    )
    parser.add_argument("--llm-latency-ms", type=float, default=250.0)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--real-turn-s",
        type=float,
        default=10.0,
        help="model + tool seconds of a real agent turn, for the concurrency estimate",
    )
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ForkedServer(
            serve_thinking_llm, args.turns, args.llm_latency_ms / 1000, health="/health"
        ) as llm,
    ):
        cpu_cost(args, Path(tmp), llm.url)
        throughput(args, Path(tmp), llm.url)
    return 0
