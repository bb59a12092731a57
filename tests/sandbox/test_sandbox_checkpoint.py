"""Sandbox.checkpoint and Sandbox.restore on bubblewrap: a chain of workspace archives (level 0,
then incremental) and the shell's directory and variables, put back into a fresh sandbox."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from raas.images.image import StoredImage
from raas.sandbox import BwrapConfig, Sandbox, SandboxError, SandboxLimits, create_sandbox
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.checkpoint import CheckpointTooLarge, shell_data, shell_of

MiB = 1024 * 1024
LIMITS = SandboxLimits(action_timeout_s=60, max_processes=64, disk_bytes=64 * MiB)
CAP = 32 * MiB

# What a tree holds, as the sandbox sees it (one fresh process): each path's mode and kind, a
# file's sha256 and mtime, a link's target, and which names share an inode.
MANIFEST = r"""
import hashlib, json, os, stat, sys
root = os.fsencode(sys.argv[1])
out, inodes = {}, {}
for top, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(top, name)
        st = os.lstat(path)
        rel = os.fsdecode(os.path.relpath(path, root))
        mode = oct(stat.S_IMODE(st.st_mode))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = [mode, "link", os.fsdecode(os.readlink(path))]
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = [mode, "dir"]
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            out[rel] = [mode, "file", digest, int(st.st_mtime), st.st_size]
            if st.st_nlink > 1:
                inodes.setdefault(st.st_ino, []).append(rel)
        else:
            out[rel] = [mode, stat.filemode(st.st_mode)[0]]
links = sorted(sorted(names) for names in inodes.values())
print(json.dumps({"tree": out, "hardlinks": links}))
"""


@contextlib.asynccontextmanager
async def started(sandbox: Sandbox) -> AsyncIterator[Sandbox]:
    try:
        await sandbox.start()
        yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture
async def sandboxes() -> AsyncIterator[Callable[[], Any]]:
    """``await make()``: a started bwrap sandbox, closed after the test."""
    made: list[Sandbox] = []

    async def make() -> Sandbox:
        sandbox = create_sandbox(BwrapConfig(limits=LIMITS))
        made.append(sandbox)
        await sandbox.start()
        return sandbox

    try:
        yield make
    finally:
        for sandbox in made:
            await sandbox.close()


async def manifest(sandbox: Sandbox, root: str = "/workspace") -> dict[str, Any]:
    seen = await sandbox.exec(["python3", "-c", MANIFEST, root], max_output=16 * MiB)
    assert seen.exit_code == 0, seen.stderr
    return dict(json.loads(seen.stdout))


async def run(sandbox: Sandbox, command: str) -> str:
    done = await sandbox.bash(command)
    assert done.exit_code == 0, done.output
    return done.output


def chain_dir(tmp_path: Path) -> Path:
    """Where a job's archives lie: a directory of raas's own (0700)."""
    jobs = tmp_path / "job"
    jobs.mkdir(mode=0o700, exist_ok=True)
    return jobs


# -- a chain, restored ------------------------------------------------------------------------


FIRST = """
mkdir -p repo/src empty a/b/c old/inner 'sp ace'
printf 'v1\\n' > repo/f && chmod 640 repo/f
printf '#!/bin/sh\\necho run\\n' > repo/run.sh && chmod 755 repo/run.sh
printf 'inner\\n' > old/inner/x && printf 'top\\n' > old/y
printf 'gone\\n' > gone && printf 's\\n' > 'sp ace/f i'
ln -s f repo/l && ln -s /etc/shadow host-link && ln -s /nowhere dangling
printf 'h\\n' > repo/h1 && ln repo/h1 repo/h2
chmod 700 a/b
"""

SECOND = """
printf 'v2\\n' >> repo/f && rm gone && rm repo/l && ln -s run.sh repo/l
mv old new && printf 'more\\n' > new/more && rmdir a/b/c && mkdir a/b/d
chmod 711 repo && head -c 300000 /dev/urandom > repo/src/blob
"""


async def test_a_chain_restored_into_a_fresh_sandbox_is_the_workspace_and_shell(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    snar = jobs / "chain.snar"
    source = await sandboxes()
    await run(source, FIRST)
    first = await source.checkpoint(snar, jobs / "1.tar", CAP)
    await run(source, SECOND)
    await run(source, "cd /workspace/new/inner && export TASK='a b' EMPTY= && unset LANG")
    # Until the job is sleep itself (a loaded machine may still show the forked shell).
    await run(source, 'sleep 300 & until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done')
    second = await source.checkpoint(snar, jobs / "2.tar", CAP)
    assert second.size < first.size + 400_000  # the changes, not every file again
    assert any("sleep" in lost for lost in second.lost)
    assert second.shell is not None and second.shell.cwd == "/workspace/new/inner"
    want = await manifest(source)
    assert "gone" not in want["tree"] and "old" not in want["tree"]

    shell = shell_of(json.loads(json.dumps(shell_data(second.shell))))  # as a row keeps it
    fresh = await sandboxes()
    restored = await fresh.restore([first.archive, second.archive], shell)
    assert restored.lost == ()
    assert await manifest(fresh) == want
    seen = await fresh.bash('pwd; echo "$TASK"; echo "${EMPTY-unset}"; echo "${LANG-unset}"; id -u')
    assert seen.output.split("\n")[:5] == ["/workspace/new/inner", "a b", "", "unset", "1000"]
    assert (await fresh.bash("jobs | wc -l")).output.strip() == "0"  # no process came back


async def test_an_archive_over_its_cap_leaves_nothing_and_the_chain_goes_on(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    snar = jobs / "chain.snar"
    source = await sandboxes()
    await run(source, "echo one > f")
    first = await source.checkpoint(snar, jobs / "1.tar", CAP)
    state = snar.read_bytes()
    await run(source, "head -c 4M /dev/urandom > big && echo two > g")
    with pytest.raises(CheckpointTooLarge):
        await source.checkpoint(snar, jobs / "2.tar", 1 * MiB)
    assert not (jobs / "2.tar").exists()
    assert snar.read_bytes() == state  # as the last checkpoint left it
    assert sorted(p.name for p in jobs.iterdir()) == ["1.tar", "chain.snar"]
    # The next checkpoint follows on from the last one written: the chain still restores.
    await run(source, "rm big && echo three > g")
    third = await source.checkpoint(snar, jobs / "3.tar", CAP)
    assert third.size < 1 * MiB
    fresh = await sandboxes()
    await fresh.restore([first.archive, third.archive], None)
    assert await manifest(fresh) == await manifest(source)


async def test_image_sandboxes_do_not_checkpoint(tmp_path: Path) -> None:
    image = StoredImage("example.org/swe/any:1", "sha256:00", (tmp_path / "layer",), ())
    sandbox = BwrapSandbox(BwrapConfig(limits=LIMITS), image)
    assert not sandbox.can_checkpoint
    with pytest.raises(SandboxError, match="not checkpointed"):
        await sandbox.checkpoint(tmp_path / "s.snar", tmp_path / "1.tar", CAP)
    with pytest.raises(SandboxError, match="not checkpointed"):
        await sandbox.restore([tmp_path / "1.tar"], None)
    assert not list(tmp_path.iterdir())
    assert create_sandbox(BwrapConfig(limits=LIMITS)).can_checkpoint
