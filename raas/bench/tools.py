"""`raas bench tools`: how fast an agent's tools answer, against the tmux design, same run.

- `echo hi` round trip through the full path (host client -> Unix socket -> action server ->
  pty bash -> back) in a bubblewrap sandbox; baseline: a tmux shell driven by send-keys and
  polled with capture-pane, the design ProRL replaced. p50/p95 and the ratio.
- sandbox start, forked from its template's zygote (the default) and started cold, against
  their floors in the same run: bare bwrap (``/bin/true`` in the same namespaces) and bwrap
  running ``python3 -I -S -c "import asyncio"`` (the interpreter and the event loop's import,
  which a cold start pays and a fork does not); acquire from a warm pool, IPython `1+1`.
- host processes left over after starting and closing many sandboxes (must be 0).
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from raas.sandbox import BwrapConfig, SandboxPool, create_sandbox, procs, zygote
from raas.sandbox.base import SERVER_PYTHON_FLAGS
from raas.sandbox.bwrap import rootfs_args


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def ms(values: list[float]) -> str:
    return f"p50 {1000 * statistics.median(values):7.2f} ms, p95 {1000 * pct(values, 95):7.2f} ms"


async def timed(n: int, fn: Callable[[], Awaitable[object]]) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - start)
    return out


class TmuxShell:
    """A bash in tmux, driven the old way: send-keys, then poll capture-pane for a marker."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="raas-tmux-"))
        self.base = ["tmux", "-S", str(self.dir / "sock")]
        session = ["new-session", "-d", "-s", "b", "-x", "200", "-y", "50"]
        subprocess.run([*self.base, *session, "bash --norc --noprofile"], check=True)

    def run(self, command: str) -> str:
        marker = f"__DONE_{uuid.uuid4().hex[:8]}__"
        subprocess.run(
            [*self.base, "send-keys", "-t", "b", f"{command}; echo {marker}", "Enter"], check=True
        )
        while True:
            screen = subprocess.run(
                [*self.base, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True
            ).stdout
            # The marker appears twice once done: in the echoed command line and as output.
            if screen.count(marker) >= 2:
                subprocess.run([*self.base, "send-keys", "-t", "b", "clear", "Enter"], check=True)
                return screen

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], check=False, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


async def bare_bwrap(config: BwrapConfig, command: list[str]) -> None:
    """bwrap in a sandbox's namespaces and root filesystem, running ``command``: a floor."""
    argv = ["bwrap", "--die-with-parent", "--unshare-all", "--new-session"]
    argv += [*rootfs_args(config.image), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    process = await asyncio.create_subprocess_exec(
        *argv, "--", *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL
    )
    if await asyncio.wait_for(process.wait(), 30) != 0:
        raise RuntimeError(f"bare bwrap {command} exited with {process.returncode}")


def host_processes() -> set[int]:
    """Every user process (not the kernel's threads, children of kthreadd, PID 2) but the
    zygotes, which outlive the sandboxes they fork."""
    pids = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
    return {p for p in pids if p != 2 and procs.parent_of(p) != 2} - zygote.own_pids()


async def churn(config: BwrapConfig, n: int, concurrency: int) -> list[str]:
    """Start and close ``n`` sandboxes; returns the new host processes left alive."""
    before = host_processes()
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            sb = create_sandbox(config)
            await sb.start()
            await sb.bash("sleep 1000 &")
            await sb.close()

    await asyncio.gather(*(one() for _ in range(n)))
    left = sorted(p for p in host_processes() - before if procs.alive(p))
    return [f"{p} {procs.command_line(p)}" for p in left]


async def starts(config: BwrapConfig, n: int) -> list[float]:
    """``n`` sandboxes started one after another (after one not timed), each closed."""
    times = []
    for i in range(n + 1):
        sandbox = create_sandbox(config)
        start = time.perf_counter()
        await sandbox.start()
        if i:
            times.append(time.perf_counter() - start)
        await sandbox.close()
    return times


async def bench(args: argparse.Namespace) -> None:
    config = BwrapConfig()
    async with create_sandbox(config) as sb:
        for _ in range(20):
            await sb.bash("echo hi")
        ours = await timed(args.calls, lambda: sb.bash("echo hi"))
        await sb.ipython("1+1")  # start the kernel
        ipy = await timed(args.ipython, lambda: sb.ipython("1+1"))
    tmux = TmuxShell()
    try:
        for _ in range(5):
            tmux.run("echo hi")
        base = await timed(args.calls, lambda: asyncio.to_thread(tmux.run, "echo hi"))
    finally:
        tmux.close()
    print(f"echo hi round trip, {args.calls} calls each:")
    print(f"  raas (client -> unix socket -> action server -> pty bash): {ms(ours)}")
    print(f"  tmux (send-keys + capture-pane polling):                  {ms(base)}")
    print(f"  ratio tmux/raas at p50: {statistics.median(base) / statistics.median(ours):.1f}x")

    forked = await starts(config, args.starts)  # the first start (its zygote's) is left out
    cold = await starts(BwrapConfig(zygote=False), args.starts)
    true = await timed(args.starts, lambda: bare_bwrap(config, ["/bin/true"]))
    python = [config.python, *SERVER_PYTHON_FLAGS, "-c", "import asyncio"]
    interpreter = await timed(args.starts, lambda: bare_bwrap(config, python))
    pool = SandboxPool(config, size=4)
    pool.fill()
    warm = []
    for _ in range(args.starts):
        await pool.wait_filled()
        start = time.perf_counter()
        sandbox = await pool.acquire()
        warm.append(time.perf_counter() - start)
        await sandbox.close()
    await pool.close()
    print(f"sandbox start (action server answering), {args.starts} starts each:")
    print(f"  forked from its template's zygote: {ms(forked)}")
    print(f"  started cold (bwrap + python3):    {ms(cold)}")
    for name, floor in (
        ("bare bwrap running /bin/true", true),
        ("bare bwrap running python3 -I -S, import asyncio", interpreter),
    ):
        floor_p50 = statistics.median(floor)
        print(f"  floor, {name}: {ms(floor)}")
        print(
            f"    forked {statistics.median(forked) / floor_p50:.1f}x it,"
            f" cold {statistics.median(cold) / floor_p50:.1f}x it"
        )
    print(f"acquire from a warm pool (size 4), {args.starts} acquires:        {ms(warm)}")
    print(f"IPython 1+1, {args.ipython} calls: {ms(ipy)}")
    left = await churn(config, args.churn, args.concurrency)
    print(f"host processes left after starting and closing {args.churn} sandboxes: {len(left)}")
    for line in left:
        print(f"  left: {line}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench tools", description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--ipython", type=int, default=100)
    parser.add_argument("--churn", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    asyncio.run(bench(parser.parse_args(argv)))
    return 0
