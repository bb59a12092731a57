"""Copy-on-write forks of a sealed sandbox (issue 48; raas.sandbox.cow): a sealed sandbox's
workspace and /tmp are the lower layers of its forks' overlays, each fork's writes in its own
capped tmpfs, nothing copied.

Each attack stands beside a control that must keep working: (1) nothing the sealed sandbox's
processes did (a writer left running, an fd opened for writing) changes a fork's files; (2) a
fork's writes and deletes never reach the sealed sandbox or a sibling; (3) a fork cannot fill
memory past its caps, a copy-up included; (4) a fork reaches nothing of the held mounts but
through its overlays (not the mounts themselves, not /tmp where only the workspace was meant);
(5) closing the sealed sandbox leaves its forks working, and once the last closes nothing of
raas's is left (its fds, the holder, processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from raas.sandbox import BwrapConfig, SandboxError, SandboxLimits, create_sandbox, procs, zygote
from raas.sandbox import bwrap as bwrap_module
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.fork import ForkCarry
from tests.support.unprivileged import unprivileged_user

MiB = 1024 * 1024
FS = "stat -f -c %T"  # the type of the file system a path is on
FILL = "for i in 1 2 3 4; do head -c {mib}M /dev/zero > {dir}/more$i || break; done"
# Matches the set-up's text, never itself: in a .raas- file, only the sealed server's script.
OWN = "'chmod [6]00'"
GROWN = (
    "until [ -s log ]; do :; done; a=$(stat -c %s log);"
    " while [ $(stat -c %s log) = $a ]; do :; done; echo ok"
)
LIMITS = SandboxLimits(action_timeout_s=60, disk_bytes=64 * MiB, tmp_bytes=32 * MiB)
SETUP = (
    "mkdir -p /workspace/repo/sub /tmp/cache && echo v1 > /workspace/repo/f"
    " && echo c > /tmp/cache/x && echo secret > /tmp/only-tmp && chmod 750 /workspace/repo"
    " && chmod 600 /workspace/repo/f && ln -s f /workspace/repo/l && echo s > /workspace/repo/sub/s"
    " && head -c 20M /dev/urandom > /workspace/big && cd /workspace/repo && export TASK='a b'"
)
# Left running when the sandbox is sealed: a writer in the background, reparented to the
# namespace's init (setsid), and the shell's fd 7 open for appending.
WRITERS = (
    "setsid sh -c 'while :; do echo w >> /workspace/log; done' >/dev/null 2>&1 < /dev/null &"
    " exec 7>>/workspace/held; echo h >&7"
)


def our_processes() -> set[int]:
    """This test's live processes but the zygotes' (a fork's init the zygote has yet to reap
    is a zombie, which holds nothing)."""
    return {p for p in procs.descendants(os.getpid()) - zygote.own_pids() if procs.alive(p)}


def our_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@contextlib.asynccontextmanager
async def started(sandbox: BwrapSandbox) -> AsyncIterator[BwrapSandbox]:
    try:
        if not sandbox.client and not sandbox.closed:
            await sandbox.start()
        yield sandbox
    finally:
        await sandbox.close()


def bwrap(limits: SandboxLimits = LIMITS) -> BwrapSandbox:
    sandbox = create_sandbox(BwrapConfig(limits=limits))
    assert isinstance(sandbox, BwrapSandbox)
    return sandbox


@pytest.fixture
async def sealed() -> AsyncIterator[BwrapSandbox]:
    async with started(bwrap()) as sandbox:
        setup = await sandbox.bash(SETUP)
        assert setup.exit_code == 0, setup.output
        assert await sandbox.seal()
        yield sandbox


async def out(sandbox: BwrapSandbox, command: str) -> str:
    """``command``'s output, run in /workspace (a subshell: the shell stays where it is)."""
    result = await sandbox.bash(f"(cd /workspace && {{ {command}\n}})")
    assert result.exit_code == 0, result.output
    return result.output.strip()


async def test_a_fork_of_a_sealed_sandbox_sees_its_files_and_shell_through_overlays(
    sealed: BwrapSandbox,
) -> None:
    async with started(await sealed.fork()) as child:
        seen = await out(
            child,
            'cd /workspace/repo; pwd; echo "$TASK"; cat f /tmp/cache/x; readlink l;'
            " stat -c '%a %U' . f; ls -A1 /tmp | grep -v '^.raas-';"
            f" cat /tmp/.raas-* | grep -c {OWN} || true",
        )
        assert seen.splitlines() == [
            "/workspace/repo",
            "a b",
            "v1",
            "c",
            "f",
            "750 sandbox",
            "600 sandbox",
            "cache",
            "only-tmp",
            "0",
        ]  # fmt: skip  (no .raas- file of the sealed sandbox's server in /tmp)
        assert await out(child, f"{FS} /workspace /tmp") == "overlayfs\noverlayfs"  # no copy
        # Flat: the 20 MiB the sealed sandbox holds are not in the fork's own tmpfs.
        used = int(await out(child, "df -B1 --output=used /workspace | tail -1"))
        assert used < MiB


async def test_a_sealed_sandbox_runs_nothing_and_a_live_one_cannot_be_sealed_twice_apart(
    sealed: BwrapSandbox,
) -> None:
    assert sealed.host_pids() == set()
    with pytest.raises(SandboxError, match="not running"):
        await sealed.bash("true")
    assert await sealed.seal()  # again: still sealed, nothing more done


async def test_writes_and_deletes_in_a_fork_reach_neither_the_sealed_sandbox_nor_a_sibling(
    sealed: BwrapSandbox,
) -> None:
    async with started(await sealed.fork()) as a, started(await sealed.fork()) as b:
        # Attack: a overwrites, appends, deletes (whiteouts), replaces a directory (opaque).
        await out(
            a,
            "echo v2 > repo/f && echo more >> repo/sub/s && rm repo/l /tmp/cache/x big"
            " && rm -rf repo/sub && mkdir repo/sub && echo new > repo/sub/n",
        )
        assert (await out(a, "ls repo repo/sub; ls /tmp/cache | wc -l")).split() == [
            "repo:", "f", "sub", "repo/sub:", "n", "0",
        ]  # fmt: skip
        # Control: b, and a fork made after a's writes, see the sealed sandbox's files.
        async with started(await sealed.fork()) as c:
            for sibling in (b, c):
                seen = await out(
                    sibling, "cat repo/f repo/sub/s /tmp/cache/x; ls repo; stat -c %s big"
                )
                assert seen.split() == ["v1", "s", "c", "f", "l", "sub", str(20 * MiB)]


async def test_nothing_the_sealed_sandboxs_processes_did_changes_a_forks_files() -> None:
    async with started(bwrap()) as parent:
        await out(parent, SETUP)
        assert (await parent.bash(WRITERS)).exit_code == 0
        writer = await out(parent, "pgrep -f 'echo w' | head -1")
        assert writer
        # Control: while the sandbox is live, the writer does write.
        assert await out(parent, GROWN) == "ok"
        pids = parent.host_pids()
        assert await parent.seal()
        # Attack: the writer and the shell's fd 7 were the sealed sandbox's: none of its
        # processes is left, so no fd of it is open for writing, and nothing can write the
        # held files again.
        assert not {p for p in pids if procs.alive(p)}
        async with started(await parent.fork()) as a:
            first = await out(a, "stat -c %s log held; cat held")
            await out(a, "head -c 30M /dev/zero > filler && rm filler")  # time passes in a
            async with started(await parent.fork()) as b:
                assert await out(b, "stat -c %s log held; cat held") == first
                assert await out(a, "stat -c %s log held; cat held") == first
                assert first.split()[-1] == "h"


async def test_a_forks_writes_count_against_its_own_caps_a_copy_up_included(
    sealed: BwrapSandbox,
) -> None:
    small = LIMITS.model_copy(update={"disk_bytes": 32 * MiB, "tmp_bytes": 4 * MiB})
    async with started(await sealed.fork(small)) as child:
        # Attack: past its disk_bytes, past its tmp_bytes, and a copy-up of the sealed
        # sandbox's 20 MiB file once the fork's own 20 MiB are in its 32 MiB upper.
        full = await child.bash(f"{FILL.format(dir='/workspace', mib=10)}; echo $?")
        assert "No space left on device" in full.output
        await out(child, "rm -f /workspace/more*")
        tmp = await child.bash(f"{FILL.format(dir='/tmp', mib=3)}; echo $?")
        assert "No space left on device" in tmp.output
        await out(child, "head -c 10M /dev/zero > a && head -c 10M /dev/zero > b")
        copy_up = await child.bash("chmod 640 /workspace/big")  # copies the whole file up
        assert "No space left on device" in copy_up.output
        size = await out(child, "df -B1 --output=size /workspace | tail -1")
        assert int(size) <= small.disk_bytes
    # Control: a fork with room copies it up, into its own upper, which its cap counts.
    async with started(await sealed.fork()) as roomy:
        await out(roomy, "chmod 640 /workspace/big")
        used = await out(roomy, "df -B1 --output=used /workspace | tail -1")
        assert int(used) >= 20 * MiB


async def test_a_fork_reaches_nothing_of_the_held_mounts_but_its_overlays(
    sealed: BwrapSandbox,
) -> None:
    async with started(await sealed.fork()) as child:
        # Attack: the lower mounts are not attached anywhere in the fork, no fd of its
        # processes (its init's included) holds them, and the workspace leads to no /tmp.
        mountinfo = await out(child, "cat /proc/self/mountinfo")
        assert " /workspace " in mountinfo
        assert "lower" not in mountinfo.replace("lowerdir=lower", "")
        # A held lower's fd would read as "/" (the root of a detached mount).
        links = await out(child, "for f in /proc/[0-9]*/fd/*; do readlink $f; done; true")
        assert "/" not in links.splitlines()
        hidden = await child.bash("ls /workspace/upper /workspace/lower /workspace/work")
        assert hidden.exit_code != 0
    # Attack: a fork that carries no scratch sees none of the held files.
    async with started(await sealed.fork(carry=ForkCarry(scratch=False))) as bare:
        assert await out(bare, "ls -A /workspace; ls /tmp") == ""


async def test_closing_the_sealed_sandbox_leaves_its_forks_and_the_last_frees_all() -> None:
    async with started(bwrap()):  # the template's zygote (and its fds) lives on: started now
        pass
    before_fds, before_processes = our_fds(), our_processes()
    parent = bwrap()
    async with started(parent):
        await out(parent, SETUP)
        assert await parent.seal()
        sealed = parent._sealed
        assert sealed is not None
        holder = sealed.held.process
        children = list(await asyncio.gather(*(parent.fork() for _ in range(3))))  # at once
    # Attack: the sealed sandbox is closed while its forks live; control: they go on.
    assert holder.poll() is not None  # its holder is gone; the forks' overlays hold the files
    for child in children:
        assert await out(child, "cat repo/f; echo w > repo/g; cat repo/g") == "v1\nw"
    for child in children:
        await child.close()
    assert our_processes() <= before_processes
    assert our_fds() <= before_fds, [
        os.readlink(f"/proc/self/fd/{f}") for f in our_fds() - before_fds
    ]  # no fd of a lower, of the holder's socket, of a pipe


async def test_forks_of_sealed_forks_stack_as_deep_as_the_kernel_allows_then_copy(
    sealed: BwrapSandbox,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        parent, kinds = sealed, []
        for generation in range(3):
            child = await stack.enter_async_context(started(await parent.fork()))
            await out(child, f"echo {generation} > g{generation} && rm -f repo/f")
            kinds.append(await out(child, f"{FS} .; ls repo g*"))
            if generation < 2:
                assert await child.seal() == (generation == 0)
            parent = child
        # Control: each generation sees all the earlier ones' writes and deletes; the second
        # was not sealed (a third overlay would be too deep): the third is its copy.
        assert [k.split()[0] for k in kinds] == ["overlayfs", "overlayfs", "tmpfs"]
        assert set(kinds[-1].split()[1:]) == {"g0", "g1", "g2", "repo:", "l", "sub"}


async def test_a_sandbox_not_from_a_zygote_is_not_sealed_and_its_forks_copy() -> None:
    # A sandbox not forked from a zygote (here: one with a network) cannot be sealed: it stays
    # live, and its forks copy as before.
    config = BwrapConfig(limits=LIMITS, network=True)
    async with started(BwrapSandbox(config)) as live:
        await out(live, "echo v > /workspace/f")
        assert not await live.seal()
        async with started(await live.fork()) as child:
            assert await out(child, f"cat f; {FS} .") == "v\ntmpfs"


async def test_where_forks_cannot_mount_overlays_nothing_is_sealed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An older kernel, found by the first seal's trial fork: the sandbox stays live, forks copy.
    monkeypatch.setattr(bwrap_module, "_overlays_work", False)
    async with started(bwrap()) as live:
        await out(live, "echo v > f")
        assert not await live.seal()
        assert await out(live, "cat f") == "v"
        async with started(await live.fork()) as child:
            assert await out(child, f"cat f; {FS} .") == "v\ntmpfs"


# Run as the unprivileged user: seal a sandbox, fork it twice, write and delete in one.
ROOTLESS = """
import asyncio, json
from raas.sandbox import BwrapConfig, SandboxLimits, create_sandbox

async def main():
    parent = create_sandbox(BwrapConfig(limits=SandboxLimits(disk_bytes=16 << 20)))
    await parent.start()
    report = {}
    try:
        await parent.bash("echo v1 > /workspace/f && echo t > /tmp/t && mkdir /workspace/d")
        report["sealed"] = await parent.seal()
        a, b = await parent.fork(), await parent.fork()
        try:
            report["a"] = (await a.bash(
                "rm /workspace/f; echo n > /workspace/d/n; stat -f -c %T /workspace;"
                " ls /workspace; head -c 20M /dev/zero > /workspace/z; echo $?")).output
            report["b"] = (await b.bash("cat /workspace/f /tmp/t; ls /workspace/d")).output
        finally:
            await a.close()
            await b.close()
    finally:
        await parent.close()
    print(json.dumps(report))

asyncio.run(main())
"""


def test_an_unprivileged_raas_seals_and_forks_copy_on_write() -> None:
    with unprivileged_user() as user:
        run = user.python_run("-c", ROOTLESS, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["sealed"] is True
    assert report["a"].split()[:2] == ["overlayfs", "d"]
    assert "No space left on device" in report["a"]
    assert report["b"].split() == ["v1", "t"]


def test_the_holder_is_a_program_of_its_own() -> None:
    # It joins another namespace (setns): never in raas's process, whose threads forbid it.
    from raas.sandbox import cow

    assert cow.HOLDER.is_file() and Path(cow.HOLDER).read_text().startswith('"""')
