"""Sandbox.checkpoint and Sandbox.restore on bubblewrap: a chain of workspace archives (level 0,
then incremental) and the shell's directory and variables, put back into a fresh sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import secrets
import shutil
import signal
import tarfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from raas.images.image import StoredImage
from raas.sandbox import (
    BwrapConfig,
    Sandbox,
    SandboxError,
    SandboxLimits,
    checkpoint,
    create_sandbox,
    procs,
)
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
    jobs.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    assert snar.stat().st_mode & 0o777 == 0o600
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


# -- attacks: the sandbox's code, and a job whose checkpoint is restored -------------------------
#
# Each attack has a one-line comment, and beside it a control that shows what must still work.
# Host files are looked for by what only the host's hold: its /etc/passwd's root line (the
# sandbox's /etc/passwd names its own user alone).

HOST_ONLY = b"root:x:0:0:"
LIMIT_S = 120.0  # a test's bound on what must end (the work itself takes moments)


async def bounded(work: Any, seconds: float = LIMIT_S) -> Any:
    """``work`` awaited for at most ``seconds``; past that, the tar processes this test started
    are killed (a thread stuck on them would hang the run) and the test fails."""
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        for pid in procs.descendants(os.getpid()):
            if procs.command_line(pid).split()[:1] == ["tar"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        pytest.fail(f"did not end within {seconds} s")


def archive_names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


# Swaps /workspace/x (a directory holding etc/passwd) for a link to / the moment tar opens
# a-big, which it reads after it has listed every directory and before it reads x/etc's files
# by their path: a host's tar that followed the link would read the host's /etc/passwd.
SWAP_ON_OPEN = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace")
fd = libc.inotify_init1(0)
assert fd >= 0 and libc.inotify_add_watch(fd, b"a-big", 0x20) >= 0  # IN_OPEN
open("/tmp/armed", "w").close()
os.read(fd, 4096)
os.rename("x", "stash/x")
os.symlink("/", "x")
open("/tmp/swapped", "w").close()
"""


async def test_a_directory_swapped_for_a_link_while_tar_reads_yields_no_host_file(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    await run(source, "mkdir -p x/etc stash && echo mine > x/etc/passwd")
    await run(source, "head -c 24M /dev/urandom > a-big")
    await source.write_file("/tmp/swap.py", SWAP_ON_OPEN)
    await run(source, "python3 /tmp/swap.py & until [ -e /tmp/armed ]; do :; done")
    try:
        made = await bounded(source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP))
    except SandboxError:  # what the swap did to tar's walk may fail it: then nothing is kept
        assert sorted(p.name for p in jobs.iterdir()) == []
    else:
        data = made.archive.read_bytes()
        assert HOST_ONLY not in data
        # Control: the sandbox's own files are there, the big one whole.
        assert any(name.endswith("/a-big") for name in archive_names(made.archive))
        assert made.size > 24 * MiB
    assert (await source.exec(["test", "-L", "/workspace/x"])).exit_code == 0  # it swapped


def _members(data: bytes) -> list[tuple[int, int, bytes]]:
    """The archive's members as (start, end, name): a pax header goes with the member after."""
    found: list[tuple[int, int, bytes]] = []
    at = start = 0
    while at + 512 <= len(data) and data[at : at + 512] != bytes(512):
        header = data[at : at + 512]
        end = at + 512 + -(-int(header[124:136].strip(b"\0 ") or b"0", 8) // 512) * 512
        if header[156:157] != b"x":
            found.append((start, end, header[:100].rstrip(b"\0")))
            start = end
        at = end
    return found


def swap_member(archive: Path, path: str, link_to: str, dest: Path) -> Path:
    """``archive`` with its member for the workspace's directory ``path`` made a link to
    ``link_to``: the archive a race can make (a directory dumped as a link when tar looked at
    it, its files read after)."""
    data = archive.read_bytes()
    parts = []
    for start, end, found in _members(data):
        if found.rstrip(b"/").endswith(b"/" + path.encode()):
            link = tarfile.TarInfo(found.rstrip(b"/").decode())
            link.type, link.linkname = tarfile.SYMTYPE, link_to
            parts.append(link.tobuf(format=tarfile.GNU_FORMAT))
        else:
            parts.append(data[start:end])
    dest.write_bytes(b"".join(parts) + bytes(1024))
    return dest


async def test_a_chain_that_writes_through_a_link_writes_only_into_the_fresh_sandbox(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    name = f"raas-escape-{secrets.token_hex(6)}"
    host = Path("/tmp") / name
    source = await sandboxes()
    await run(source, "ln -s /tmp z")
    first = await source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP)
    await run(source, f"mkdir p && echo pwned > p/{name}")
    second = await source.checkpoint(jobs / "s.snar", jobs / "2.tar", CAP)
    # Attack: the second archive has p as a link to z (a link to /tmp, made by the first),
    # and after it the file p/NAME: a restore that follows them on the host writes /tmp/NAME.
    forged = swap_member(second.archive, "p", "z", jobs / "2-forged.tar")
    with tarfile.open(forged) as tar:
        link, planted = tar.getmembers()[-2:]
    assert link.issym() and planted.name == f"{link.name}/{name}"
    fresh = await sandboxes()
    try:
        await fresh.restore([first.archive, forged], None)
        assert not host.exists()
        # Control: the chain was followed, but inside the fresh sandbox (its own /tmp).
        assert await fresh.read_file(f"/tmp/{name}") == b"pwned\n"
    finally:
        if host.exists():
            host.unlink()


async def test_a_directory_moved_into_a_former_link_to_the_host_stays_in_the_sandbox(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    name = f"raas-escape-{secrets.token_hex(6)}"
    host = Path("/tmp") / name
    source = await sandboxes()
    await run(source, "ln -s /tmp p && mkdir a && echo x > a/f")
    first = await source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP)
    # Attack: tar puts the move back (a rename) before it removes the link p, and makes the
    # directories the rename needs through it: on the host, /tmp/NAME.
    await run(source, f"rm p && mkdir -p p/{name} && mv a p/{name}/a")
    second = await source.checkpoint(jobs / "s.snar", jobs / "2.tar", CAP)
    fresh = await sandboxes()
    try:
        # The fresh sandbox's /tmp is another file system: the rename fails, and the job
        # runs from the start (tar's order, not raas's to change).
        with contextlib.suppress(SandboxError):
            await fresh.restore([first.archive, second.archive], None)
        assert not host.exists()
    finally:
        if host.is_dir():
            shutil.rmtree(host)
    # Control: the same moves with p a directory from the start come back whole.
    jobs = chain_dir(tmp_path / "control")
    other = await sandboxes()
    await run(other, "mkdir p && mkdir a && echo x > a/f")
    first = await other.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP)
    await run(other, f"mkdir -p p/{name} && mv a p/{name}/a")
    second = await other.checkpoint(jobs / "s.snar", jobs / "2.tar", CAP)
    again = await sandboxes()
    await again.restore([first.archive, second.archive], None)
    assert await manifest(again) == await manifest(other)


async def test_members_named_outside_land_inside_the_fresh_sandbox(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    # Attack: an archive (not one a dump makes: one swapped on disk) with an absolute name
    # and one climbing out by .., each naming a file of the host's /tmp.
    name = f"raas-escape-{secrets.token_hex(6)}"
    forged = tmp_path / "forged.tar"
    with tarfile.open(forged, "w", format=tarfile.GNU_FORMAT) as tar:
        for path in (f"/tmp/{name}-abs", f"workspace/../../../../tmp/{name}-up", "workspace/ok"):
            info = tarfile.TarInfo(path)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"hi\n"))
    fresh = await sandboxes()
    try:
        with contextlib.suppress(SandboxError):
            await fresh.restore([forged], None)
        assert not list(Path("/tmp").glob(f"{name}*"))
        # Control: the member named plainly is there.
        assert await fresh.read_file("/workspace/ok") == b"hi\n"
    finally:
        for path in Path("/tmp").glob(f"{name}*"):
            path.unlink()


async def test_thousands_of_complaints_from_tar_do_not_stall_it(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    # Attack: a line on tar's error pipe for each of 4000 sockets ("socket ignored"): a host
    # that read that pipe only at the end would wait forever on a tar blocked writing it.
    sockets = (
        "import os, socket\nos.mkdir('/workspace/s')\n"
        "for i in range(4000):\n"
        "    s = socket.socket(socket.AF_UNIX); s.bind(f'/workspace/s/{i:05d}'); s.close()\n"
    )
    assert (await source.exec(["python3", "-c", sockets])).exit_code == 0
    await run(source, "echo kept > f")
    made = await bounded(source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP))
    # Control: the archive is whole (a socket is not a file to keep).
    fresh = await sandboxes()
    await fresh.restore([made.archive], None)
    assert await fresh.read_file("/workspace/f") == b"kept\n"
    assert (await fresh.exec(["ls", "-A", "/workspace/s"])).stdout == ""


def test_a_tar_that_never_ends_is_killed_at_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Attack: whatever the sandbox did to tar, it neither ends nor stops talking.
    monkeypatch.setattr(checkpoint, "ARCHIVE_TIMEOUT_S", 1.0)
    endless = ["sh", "-c", "while :; do echo complaint >&2; done"]
    before = procs.descendants(os.getpid())
    with open(tmp_path / "out", "wb") as out, pytest.raises(SandboxError, match="took over"):
        checkpoint._stream(endless, out, CAP, ())
    assert procs.descendants(os.getpid()) - before == set()
    # Control: one that ends is read to its end.
    with open(tmp_path / "out", "wb") as out:
        size, _, code, error = checkpoint._stream(["sh", "-c", "echo hi; echo e >&2"], out, CAP, ())
    assert (size, code, error) == (3, 0, b"e\n")
