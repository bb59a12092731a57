"""`raas bench gateway`: what the gateway adds to an agent's model call.

An agent program calls raas's OpenAI-style API (``POST /v1/chat/completions`` with its job
token, over HTTP to a ``raas serve`` in a process of its own); raas renders the conversation with
the chat template, generates through the backend pool, parses the tool calls, records the tokens
and merges the call into the job's trajectory. The model is a fake vLLM server (its own process)
answering in ``--llm-latency-ms`` with a tool call, then a final answer on the last turn.

Compared with: the same prompts' token ids sent straight to the fake backend's /v1/completions
(what a program that renders and parses itself would pay). Each job runs ``--turns`` calls of one
growing tool conversation; ``--concurrency`` jobs at a time, each with its own session. Prints
p50/p99 per call both ways and what the gateway adds; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import Request

from raas.api.app import create_app
from raas.bench.forked import ForkedServer, serve_fake_vllm
from raas.bench.scale import load_average, tool_call
from raas.llm.chat import encode
from raas.llm.models import load_tokenizer
from raas.llm.openai_chat import render_prompt
from raas.llm.openai_types import ChatRequest
from raas.llm.types import SamplingParams
from raas.settings import load_settings
from raas.tasks import TaskRegistry
from raas.wire import Trajectory

TOKENIZER = "smollm2"
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and see its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def _serve_fake_llm(port: int, latency_s: float) -> None:
    """vLLM's /v1/completions: a bash call, or the final answer once the prompt holds 'final'."""
    tokenizer = load_tokenizer(TOKENIZER)
    eos = tokenizer.eos_token_id
    call = encode(tokenizer, tool_call("bash", command="ls -la src/")) + [eos]
    final = encode(tokenizer, "The tests pass now; the bug was an off-by-one in parse().") + [eos]
    marker = encode(tokenizer, "FINAL")

    def reply(prompt: list[int]) -> list[int]:
        last = prompt[-64:]
        return final if any(last[i : i + len(marker)] == marker for i in range(len(last))) else call

    serve_fake_vllm(port, reply, latency_s)


def _serve_raas(port: int, db: Path, llm_url: str) -> None:
    logging.getLogger("raas").setLevel(logging.WARNING)
    flat = {"db": db, "port": port, "llm": [llm_url], "llm_capacity": 4096, "tokenizer": TOKENIZER}
    settings = load_settings(None, {**flat, "log_level": "warning"})
    app = create_app(settings, TaskRegistry())

    async def open_session(request: Request) -> dict[str, str]:
        """The benchmark's stand-in for a task: a job's session, and its token."""
        job_id = request.query_params["job"]
        session = request.app.state.service.gateway.open(
            job_id, SamplingParams(max_tokens=256), Trajectory()
        )
        return {"token": session.token}

    app.add_api_route("/bench/open", open_session, methods=["POST"])
    uvicorn.run(app, port=port, log_level="warning", access_log=False)


def conversation(turn: int, turns: int) -> list[dict[str, Any]]:
    """The agent's messages before call ``turn`` (0-based) of a job."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software engineer."},
        {"role": "user", "content": "The tests in src/ fail. Find out why and fix it."},
    ]
    for k in range(turn):
        arguments = '{"command": "ls -la src/"}'
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        done = "FINAL" if k == turns - 2 else ""
        listing = f"total 12\n-rw-r--r-- parse.py\n-rw-r--r-- test_{k}.py{done}"
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": listing})
    return messages


async def via_gateway(raas_url: str, job: str, turns: int, http: httpx.AsyncClient) -> list[float]:
    token = (await http.post(f"{raas_url}/bench/open", params={"job": job})).json()["token"]
    auth = {"Authorization": f"Bearer {token}"}
    times = []
    for turn in range(turns):
        body = {"model": "m", "messages": conversation(turn, turns), "tools": [BASH]}
        start = time.perf_counter()
        r = await http.post(f"{raas_url}/v1/chat/completions", json=body, headers=auth)
        times.append(time.perf_counter() - start)
        r.raise_for_status()
    return times


async def direct(llm_url: str, turns: int, http: httpx.AsyncClient, tok: Any) -> list[float]:
    # The prompts the gateway renders for these calls, read as it reads them.
    requests = [
        ChatRequest.model_validate({"messages": conversation(t, turns), "tools": [BASH]})
        for t in range(turns)
    ]
    prompts = [render_prompt(tok, r.conversation(), r.shown_tools()) for r in requests]
    times = []
    for prompt in prompts:
        body = {
            "model": "fake",
            "prompt": prompt,
            "max_tokens": 256,
            "logprobs": 0,
            "return_token_ids": True,
        }
        start = time.perf_counter()
        r = await http.post(f"{llm_url}/v1/completions", json=body)
        times.append(time.perf_counter() - start)
        r.raise_for_status()
    return times


async def measure(args: argparse.Namespace, raas_url: str, llm_url: str, concurrency: int) -> None:
    tok = load_tokenizer(TOKENIZER)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await via_gateway(raas_url, "warm", args.turns, http)  # warm: tokenizer, template, pool
        await direct(llm_url, args.turns, http, tok)
        gw: list[float] = []
        dr: list[float] = []
        for r in range(args.jobs // concurrency):
            runs = await asyncio.gather(
                *(
                    via_gateway(raas_url, f"j{concurrency}-{r}-{i}", args.turns, http)
                    for i in range(concurrency)
                )
            )
            gw += [t for run in runs for t in run]
            runs = await asyncio.gather(
                *(direct(llm_url, args.turns, http, tok) for _ in range(concurrency))
            )
            dr += [t for run in runs for t in run]
    p = _percentiles
    g50, g99 = p(gw)
    d50, d99 = p(dr)
    print(
        f"  {concurrency:3d} in flight, {len(gw)} calls: gateway p50 {g50:7.2f} ms p99 {g99:7.2f}"
        f" ms | direct p50 {d50:7.2f} ms p99 {d99:7.2f} ms | added p50 {g50 - d50:+.2f} ms"
        f" ({g50 / d50:.2f}x), p99 {g99 - d99:+.2f} ms ({g99 / d99:.2f}x)"
    )


def _percentiles(times: list[float]) -> tuple[float, float]:
    ms = sorted(1000 * t for t in times)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return q[49], q[98]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench gateway", description=__doc__)
    parser.add_argument("--jobs", type=int, default=32, help="jobs for each concurrency")
    parser.add_argument("--turns", type=int, default=8, help="calls a job (a growing conversation)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--llm-latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        ForkedServer(_serve_fake_llm, args.llm_latency_ms / 1000, health="/health") as llm,
        ForkedServer(_serve_raas, Path(tmp) / "gw.db", llm.url) as raas,
    ):
        print(
            f"raas bench gateway: {args.jobs} jobs of {args.turns} chat.completions calls"
            f" (tool calls, then an answer), {TOKENIZER} tokenizer, fake model answering in"
            f" {args.llm_latency_ms:g} ms; per call, HTTP round trip included; the floor is a"
            f" bare request straight to the fake model (load average {load_average()})"
        )
        for concurrency in args.concurrency:
            asyncio.run(measure(args, raas.url, llm.url, concurrency))
    return 0
