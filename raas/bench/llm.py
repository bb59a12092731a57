"""`raas bench llm`: the embedded engine and the backend pool, against 2 real engine processes.

- tokens/s of one engine at concurrency 1 and 8 (greedy, fixed length);
- multi-turn sessions (each turn's prompt = the previous prompt + output + an observation):
  the share of turns after the first that hit an engine's prefix cache, with the pool's sticky
  least-loaded routing versus plain round-robin, in the same run;
- the spread of sessions and requests across the two engines under sticky routing.
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from raas.launch import EngineProcess
from raas.llm.clients import VLLMClient
from raas.llm.pool import BackendPool
from raas.llm.types import Generation, SamplingParams


async def throughput(url: str, concurrency: int, tokens: int, rounds: int) -> float:
    client = VLLMClient(url)
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    try:
        await client.generate([1, 2, 3], SamplingParams(max_tokens=2))  # warm up
        start = time.perf_counter()
        total = 0
        for r in range(rounds):
            prompts = [[1, 9690, 198, 100 + r * concurrency + i] for i in range(concurrency)]
            gens = await asyncio.gather(*(client.generate(p, params) for p in prompts))
            total += sum(len(g.token_ids) for g in gens)
        return total / (time.perf_counter() - start)
    finally:
        await client.aclose()


OBSERVATION = [1, 9531, 198, 8307, 2, 198, 1, 520, 9531, 198]  # a short inserted turn


async def sessions(
    urls: list[str], n_sessions: int, turns: int, sticky: bool
) -> tuple[float, float, Counter[str], Counter[str]]:
    """Run multi-turn sessions. Returns the share of later turns that found their whole previous
    turn in the engine's prefix cache, the share of later turns' prompt tokens served from the
    cache, and sessions and requests per backend."""
    pool = BackendPool()
    for url in urls:
        pool.add(url, capacity=4)
    clients = [b.client for b in pool.backends()]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    rr = 0
    hits, later, cached_tokens, prompt_tokens = 0, 0, 0, 0
    first_backend: Counter[str] = Counter()
    requests: Counter[str] = Counter()

    async def one(s: int) -> None:
        nonlocal rr, hits, later, cached_tokens, prompt_tokens
        prompt = [1, 9690, 198, 200 + s, 300 + s, 2, 198, 1, 4093, 198, 400 + s, 2, 198]
        previous = 0
        for turn in range(turns):
            gen: Generation
            if sticky:
                gen = await pool.generate(f"s{s}", prompt, params)
            else:
                client = clients[rr % len(clients)]
                rr += 1
                gen = await client.generate(prompt, params)
            requests[gen.backend] += 1
            if turn == 0:
                first_backend[gen.backend] += 1
            else:
                later += 1
                hits += gen.cached_tokens >= previous
                cached_tokens += gen.cached_tokens
                prompt_tokens += len(prompt)
            previous = len(prompt)
            prompt = prompt + gen.token_ids + OBSERVATION
        pool.release(f"s{s}")

    await asyncio.gather(*(one(s) for s in range(n_sessions)))
    await pool.stop()
    return hits / max(later, 1), cached_tokens / max(prompt_tokens, 1), first_backend, requests


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench llm", description=__doc__)
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a path")
    parser.add_argument("--tokens", type=int, default=32)
    # Odd by default: with an even number of sessions taking turns in lock-step, round-robin
    # would send each session to the same engine every turn by accident.
    parser.add_argument("--sessions", type=int, default=9)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        engines = [
            EngineProcess(args.model, Path(tmp) / f"engine{i}.log", threads=1) for i in range(2)
        ]
        try:
            for engine in engines:
                engine.wait_ready(300)
            urls = [e.url for e in engines]
            print(f"model {args.model}, 2 engines, {args.tokens} greedy tokens per request")
            for concurrency in (1, 8):
                rate = asyncio.run(throughput(urls[0], concurrency, args.tokens, 2))
                print(f"  one engine, concurrency {concurrency}: {rate:6.1f} tokens/s")
            print(f"{args.sessions} sessions x {args.turns} turns over 2 engines:")
            for sticky in (True, False):
                share, token_share, first, reqs = asyncio.run(
                    sessions(urls, args.sessions, args.turns, sticky)
                )
                name = "sticky least-loaded" if sticky else "round-robin        "
                print(
                    f"  {name}: {100 * share:5.1f}% of later turns found the previous turn in"
                    f" the prefix cache, {100 * token_share:5.1f}% of their prompt tokens"
                    f" cached; requests per engine {sorted(reqs.values())}"
                )
                if sticky:
                    spread = sorted(first.values())
                    print(
                        f"  sessions per engine under sticky routing: {spread}"
                        f" (stdev {statistics.pstdev(spread):.2f})"
                    )
        finally:
            for engine in engines:
                engine.stop()
    return 0
