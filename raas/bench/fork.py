"""`raas bench fork`: forking a bubblewrap sandbox against starting one cold, same run.

- fork p50/p95 of a parent whose workspace holds a small repository (``--files`` files,
  ``--mib`` MiB in all) and of one holding ``--many`` files of the same size each: a live
  parent's fork copies them (a tar pipe into the child's tmpfs), a sealed parent's
  (``Sandbox.seal``: a group's template, a kept snapshot) is copy-on-write (overlays over its
  files, nothing copied); against a start of the same config (forked from its template's
  zygote; its close timed apart) and bare bwrap running ``/bin/true`` (the floor: its start
  and end). Each round times one of each, in turn, so that a loaded machine weighs on all
  alike; restoring the child's shell is included.
- a group of ``--group`` rollouts of one task whose set-up takes ``--setup-s`` seconds of CPU
  (a build, an install) and writes the repository, all started at once: without fork (each
  sandbox starts and sets up on its own) and with it (one sandbox set up and sealed, then
  forked ``--group`` times, as a group's template is); wall time and CPU (raas's, its reaped
  children's, and what ran in the sandboxes).
- disk (tmpfs memory) per child: what its own workspace and /tmp mounts hold after the fork.
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import time
from pathlib import Path

from raas.bench.tools import bare_bwrap, ms, timed
from raas.sandbox import BwrapConfig, Sandbox, SandboxLimits, create_sandbox

MiB = 1024 * 1024


def setup_command(files: int, mib: float, cpu_s: float) -> str:
    """The task's set-up: ``cpu_s`` seconds of CPU (a build, an install) and a repository
    written."""
    size = max(1, int(mib * MiB / max(files, 1)))
    busy = f"import time\ne = time.process_time() + {cpu_s}\nwhile time.process_time() < e: pass"
    return (
        f"python3 -c '{busy}'; mkdir -p /workspace/repo && cd /workspace/repo && "
        f"for i in $(seq {files}); do head -c {size} /dev/urandom > f$i; done; "
        "export TASK_READY=1"
    )


def cpu_s() -> float:
    """raas's CPU and that of its children it has reaped (bwrap, cp, tar)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def sandbox_cpu_s(sandbox: Sandbox) -> float:
    """The CPU of a sandbox's processes so far: each live one's own and that of the children
    it reaped (a dead set-up command counts in the shell that waited for it). Read before the
    sandbox closes: the kernel's kill of its namespace reaps them where no one counts."""
    total = 0
    for pid in sandbox.host_pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


async def started(config: BwrapConfig) -> Sandbox:
    sandbox = create_sandbox(config)
    await sandbox.start()
    return sandbox


async def parent_with(config: BwrapConfig, files: int, mib: float, seal: bool) -> Sandbox:
    """A started sandbox whose workspace holds ``files`` files (``mib`` MiB in all), sealed or
    live."""
    parent = await started(config)
    try:
        await parent.bash(setup_command(files, mib, 0), timeout_s=300)
        if seal and not await parent.seal():
            raise RuntimeError("this host cannot seal a sandbox (see the log)")
    except BaseException:
        await parent.close()
        raise
    return parent


async def own_mib(child: Sandbox) -> float:
    """What the child's own workspace and /tmp mounts hold (their upper layers, if overlays)."""
    used = await child.bash(
        "df -k --output=used /workspace /tmp | awk 'NR>1 {s+=$1} END {print s}'"
    )
    return int(used.output.strip() or 0) / 1024


async def cold_and_fork(args: argparse.Namespace, config: BwrapConfig) -> None:
    async def cold(record: bool = True) -> None:
        sandbox = create_sandbox(config)
        begun = time.perf_counter()
        await sandbox.start()
        between = time.perf_counter()
        await sandbox.close()
        if record:
            times["start (zygote)"].append(between - begun)
            times["its close"].append(time.perf_counter() - between)

    times: dict[str, list[float]] = {"floor": [], "start (zygote)": [], "its close": []}
    await cold(record=False)  # warm the page cache and the probes
    per_file = args.mib / max(args.files, 1)
    kinds = {
        f"live fork, copy ({args.files} files)": (args.files, args.mib, False),
        f"live fork, copy ({args.many} files)": (args.many, per_file * args.many, False),
        f"sealed fork, CoW ({args.files} files)": (args.files, args.mib, True),
        f"sealed fork, CoW ({args.many} files)": (args.many, per_file * args.many, True),
    }
    parents = {}
    try:
        for name, (files, mib, seal) in kinds.items():
            parents[name] = await parent_with(config, files, mib, seal)
        times.update({n: [] for n in kinds})
        disk: dict[str, float] = {}

        async def fork(name: str) -> None:
            start = time.perf_counter()
            child = await parents[name].fork()
            times[name].append(time.perf_counter() - start)
            if name not in disk:
                disk[name] = await own_mib(child)
            await child.close()

        for _ in range(args.starts):  # one of each per round: the load weighs on all alike
            times["floor"] += await timed(1, lambda: bare_bwrap(config, ["/bin/true"]))
            await cold()
            for name in kinds:
                await fork(name)
    finally:
        for parent in parents.values():
            await parent.close()
    base = statistics.median(times["floor"])
    print(f"per file {per_file * 1024:.0f} KiB; {args.starts} rounds")
    for name, values in times.items():
        own = f"; {disk[name]:6.1f} MiB of its own tmpfs" if name in disk else ""
        print(f"{name:34} {ms(values)}; {statistics.median(values) / base:5.1f}x the floor{own}")


async def group(args: argparse.Namespace, config: BwrapConfig, fork: bool) -> tuple[float, float]:
    """Wall time and CPU of one group's set-up, with or without fork."""
    command = setup_command(args.files, args.mib, args.setup_s)
    start_wall, start_cpu = time.perf_counter(), cpu_s()
    sandboxes: list[Sandbox] = []
    try:
        if fork:
            parent = await started(config)
            sandboxes.append(parent)
            await parent.bash(command, timeout_s=300)
            await parent.seal()  # as a group's template is: its members fork copy-on-write
            sandboxes += await asyncio.gather(*(parent.fork() for _ in range(args.group)))
        else:

            async def one() -> Sandbox:
                sandbox = await started(config)
                sandboxes.append(sandbox)
                await sandbox.bash(command, timeout_s=300)
                return sandbox

            await asyncio.gather(*(one() for _ in range(args.group)))
        wall = time.perf_counter() - start_wall
        inside = sum([await asyncio.to_thread(sandbox_cpu_s, sb) for sb in sandboxes])
    finally:
        for sandbox in sandboxes:
            await sandbox.close()
    return wall, cpu_s() - start_cpu + inside


async def bench(args: argparse.Namespace) -> None:
    most = args.mib * max(args.many, args.files) / max(args.files, 1)
    config = BwrapConfig(limits=SandboxLimits(disk_bytes=max(256 * MiB, int(4 * most * MiB))))
    await cold_and_fork(args, config)
    plain = await group(args, config, fork=False)
    forked = await group(args, config, fork=True)
    print(f"group of {args.group}, set-up {args.setup_s:g} s each:")
    print(f"  without fork      wall {plain[0]:6.2f} s, CPU {plain[1]:6.2f} s")
    print(f"  with fork         wall {forked[0]:6.2f} s, CPU {forked[1]:6.2f} s")
    ratios = plain[0] / forked[0], plain[1] / forked[1]
    print(f"  ratio             wall {ratios[0]:5.1f}x, CPU {ratios[1]:5.1f}x")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raas bench fork", description=__doc__)
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--mib", type=float, default=8.0)
    parser.add_argument("--many", type=int, default=2000, help="files of the flatness parent")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--setup-s", type=float, default=2.0)
    asyncio.run(bench(parser.parse_args(argv)))
    return 0
