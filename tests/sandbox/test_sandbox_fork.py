"""Sandbox.fork on bubblewrap: the child starts from the parent's files and shell, then the two
are independent; a fork's limits are its own; nothing is left after both close."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from raas.sandbox import (
    BwrapConfig,
    LocalConfig,
    Sandbox,
    SandboxError,
    SandboxLimits,
    create_sandbox,
    procs,
    zygote,
)
from raas.sandbox.fork import ShellState

MiB = 1024 * 1024
LIMITS = SandboxLimits(action_timeout_s=30, max_processes=64, disk_bytes=64 * MiB)


def our_processes() -> set[int]:
    """This test's processes (the machine may run others' sandboxes meanwhile), but the
    zygotes', which outlive their sandboxes."""
    return procs.descendants(os.getpid()) - zygote.own_pids()


@contextlib.asynccontextmanager
async def started(sandbox: Sandbox) -> AsyncIterator[Sandbox]:
    try:
        if not sandbox.client:
            await sandbox.start()
        yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture
async def parent(tmp_path: Path) -> AsyncIterator[Sandbox]:
    async with started(create_sandbox(BwrapConfig(limits=LIMITS))) as sb:
        setup = await sb.bash(
            "mkdir -p /workspace/repo /tmp/cache && echo v1 > /workspace/repo/f"
            " && echo c > /tmp/cache/x && chmod 750 /workspace/repo && ln -s f /workspace/repo/l"
            " && cd /workspace/repo && export TASK='a b' && unset LANG"
        )
        assert setup.exit_code == 0, setup.output
        yield sb


async def test_the_child_sees_the_parents_files_and_shell(parent: Sandbox) -> None:
    async with started(await parent.fork()) as child:
        assert child.id != parent.id
        seen = await child.bash(
            'pwd; echo "$TASK"; echo "${LANG-unset}"; cat f l /tmp/cache/x; stat -c %a .; id -u'
        )
        assert seen.output.split("\n")[:-1] == [
            "/workspace/repo",
            "a b",
            "unset",
            "v1",
            "v1",
            "c",
            "750",
            "1000",
        ]
        assert seen.note is None  # nothing ran besides the shell: nothing to say
        assert (await child.read_file("/workspace/repo/f")) == b"v1\n"


async def test_writes_after_the_fork_are_not_seen_across(parent: Sandbox) -> None:
    async with started(await parent.fork()) as one, started(await parent.fork()) as two:
        await parent.bash("echo parent > f; touch /tmp/p")
        await one.bash("echo one > f; rm /tmp/cache/x; touch /tmp/one")
        views = [await sb.bash("cat f; ls /tmp/cache /tmp | sort") for sb in (parent, one, two)]
        texts = [v.output.split() for v in views]
        assert texts[0][0] == "parent" and "p" in texts[0] and "one" not in texts[0]
        assert texts[1][0] == "one" and "x" not in texts[1] and "p" not in texts[1]
        assert texts[2][0] == "v1" and "x" in texts[2] and {"p", "one"}.isdisjoint(texts[2])


async def test_a_fork_of_a_fork_carries_both_generations(parent: Sandbox) -> None:
    async with started(await parent.fork()) as child:
        await child.bash("echo 2 > g; cd /tmp && export GEN=2")
        async with started(await child.fork()) as grandchild:
            seen = await grandchild.bash("pwd; echo $GEN; cat /workspace/repo/f /workspace/repo/g")
            assert seen.output.split() == ["/tmp", "2", "v1", "2"]


async def test_a_fork_has_its_own_limits(parent: Sandbox) -> None:
    small = LIMITS.model_copy(update={"max_output_bytes": 1000, "disk_bytes": 8 * MiB})
    async with started(await parent.fork(small)) as child:
        assert child.limits == small and parent.limits == LIMITS
        full = await child.bash("head -c 20M /dev/zero > /workspace/big; echo $?")
        assert full.output.strip().splitlines()[-1] != "0"  # the child's 8 MiB tmpfs is full
        assert (await parent.bash("head -c 20M /dev/zero > big; echo $?")).output.strip() == "0"
        long = await child.bash("head -c 5000 /dev/zero | tr '\\0' x")
        assert long.output_cut_bytes > 0


async def test_a_parent_too_full_for_the_childs_disk_fails_the_fork(parent: Sandbox) -> None:
    await parent.bash("head -c 12M /dev/zero > /workspace/big")
    before = our_processes()
    small = LIMITS.model_copy(update={"disk_bytes": 8 * MiB})
    with pytest.raises(SandboxError, match="fork"):
        await parent.fork(small)
    assert our_processes() - before == set()  # the half-made child is gone
    assert (await parent.bash("echo alive")).output.strip() == "alive"


async def test_closing_one_leaves_the_other_working(parent: Sandbox) -> None:
    child = await parent.fork()
    await parent.close()
    async with started(child):
        assert (await child.bash("cat f")).output.strip() == "v1"
        async with started(await child.fork()) as grandchild:
            await child.close()
            assert (await grandchild.bash("cat f")).output.strip() == "v1"


async def test_what_is_not_carried_is_said_once(parent: Sandbox) -> None:
    # Until the job is sleep itself (a loaded machine may still show the forked shell).
    await parent.bash('sleep 300 & until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done')
    async with started(await parent.fork()) as child:
        first = await child.bash("jobs | wc -l")
        assert first.output.strip() == "0"  # the child runs no copy of the sleep
        assert first.note is not None and "sleep" in first.note and parent.id in first.note
        assert (await child.bash("true")).note is None


async def test_nothing_is_left_after_both_close(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir()
    before = our_processes()
    parent = create_sandbox(BwrapConfig(limits=LIMITS, runtime_dir=runtime))
    await parent.start()
    await parent.bash("echo x > f; sleep 300 &")
    child = await parent.fork()
    await child.bash("sleep 300 &")
    assert our_processes() - before
    await parent.close()
    await child.close()
    assert our_processes() - before == set()
    assert list(runtime.iterdir()) == []


async def test_a_closed_sandbox_cannot_fork(parent: Sandbox) -> None:
    await parent.close()
    with pytest.raises(SandboxError, match="not running"):
        await parent.fork()


async def test_a_local_sandbox_cannot_fork() -> None:
    async with started(create_sandbox(LocalConfig())) as sb:
        with pytest.raises(SandboxError, match="cannot fork"):
            await sb.fork()


def test_the_shell_state_is_read_back_as_it_was_written() -> None:
    # Records between the nonce's markers: the directory, then NAME=VALUE, NUL-separated.
    output = "noise\nraas-shell-ab-begin\0/a dir/x\n\0A=1\0B=it's\0raas-shell-ab-end\0"
    state = ShellState.parse(output, "ab")
    assert state.cwd == "/a dir/x"
    assert state.env == (("A", "1"), ("B", "it's"))
    assert "\n\\builtin cd -- '/a dir/x' 2>/dev/null" in state.restore_command()


async def test_a_fork_holds_what_its_parent_holds_until_the_last_closes(parent: Sandbox) -> None:
    held: list[str] = []

    @contextlib.contextmanager
    def image_in_use() -> Iterator[None]:
        held.append("image")
        try:
            yield
        finally:
            held.remove("image")

    parent.hold(image_in_use())
    child = await parent.fork()
    await parent.close()
    assert held == ["image"]  # the child's root still stands on the image's layers
    await child.close()
    assert held == []


async def test_an_ipython_kernels_memory_is_not_carried_and_is_said(parent: Sandbox) -> None:
    assert (await parent.ipython("x = 6 * 7\nx")).result == "42"
    async with started(await parent.fork()) as child:
        first = await child.ipython("'x' in globals()")
        assert first.result == "False"
        assert first.note is not None and "IPython kernel" in first.note
        assert (await child.ipython("1")).note is None
    assert (await parent.ipython("x")).result == "42"
