"""`raas bench burst`: a thousand sandboxes started and closed as fast as the machine allows.

- ``--sandboxes`` sandboxes (1,000) started, each closed once it answers a command, at most
  ``--concurrency`` at a time: the rate, and the start's p50/p95; forked from their template's
  zygote (the default) and, with ``--cold``, started cold as well;
- the floor, measured in the same run: as many bare bwraps running ``/bin/true`` in the same
  namespaces, at the same concurrency;
- the memory each holds: ``--hold`` sandboxes kept open at once, the proportional set size
  (PSS: shared pages split among their sharers) of all their processes, per sandbox.
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from raas.bench.tools import bare_bwrap, ms
from raas.sandbox import BwrapConfig, Sandbox, create_sandbox


def pss_bytes(pid: int) -> int:
    """The proportional set size of ``pid`` (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


async def burst(config: BwrapConfig, n: int, concurrency: int) -> tuple[float, list[float]]:
    """Start and close ``n`` sandboxes; the wall time and each start's time."""
    gate = asyncio.Semaphore(concurrency)
    starts: list[float] = []
    done = 0

    async def one() -> None:
        nonlocal done
        async with gate:
            sandbox = create_sandbox(config)
            begin = time.perf_counter()
            try:
                await sandbox.start()
                starts.append(time.perf_counter() - begin)
                await sandbox.bash("true")
            finally:
                await sandbox.close()
            done += 1
            if done % 100 == 0:
                print(f"  {done}/{n} started and closed", flush=True)

    begin = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - begin, starts


async def floor(config: BwrapConfig, n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await bare_bwrap(config, ["/bin/true"])

    begin = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - begin


async def held_memory(config: BwrapConfig, hold: int) -> float:
    """Bytes of PSS per sandbox, with ``hold`` of them open (each with its shell started)."""
    sandboxes: list[Sandbox] = []
    try:
        for _ in range(hold):
            sandbox = create_sandbox(config)
            sandboxes.append(sandbox)
            await sandbox.start()
            await sandbox.bash("true")
        total = sum(pss_bytes(p) for s in sandboxes for p in s.host_pids())
        return total / hold
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def bench(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} at the start; {os.cpu_count()} cores")
    zygote = BwrapConfig()
    await held_memory(zygote, 1)  # the zygote started: the burst measures its forks
    kinds = [("forked from a zygote", zygote)]
    if args.cold:
        kinds.append(("started cold", BwrapConfig(zygote=False)))
    base = await floor(zygote, args.sandboxes, args.concurrency)
    n, c = args.sandboxes, args.concurrency
    print(
        f"floor: {n} bare bwraps running /bin/true, {c} at a time: {base:.2f} s, {n / base:.0f}/s"
    )
    for name, config in kinds:
        wall, starts = await burst(config, n, c)
        print(f"{n} sandboxes {name}, {c} at a time: {wall:.2f} s, {n / wall:.0f}/s,")
        print(f"  {wall / base:.1f}x the floor; each start {ms(starts)}")
        pss = await held_memory(config, args.hold)
        print(f"  memory, {args.hold} held at once: {pss / 2**20:.1f} MiB PSS a sandbox")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench burst", description=__doc__)
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--hold", type=int, default=50)
    parser.add_argument("--cold", action="store_true", help="also start them cold")
    asyncio.run(bench(parser.parse_args(argv)))
    return 0
