"""Sandbox.checkpoint and Sandbox.restore on bubblewrap: a chain of workspace archives (level 0,
then incremental) and the shell's directory and variables, put back into a fresh sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import secrets
import shlex
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
from raas.sandbox.checkpoint import Checkpointed, CheckpointTooLarge, shell_data, shell_of
from raas.sandbox.fork import MAX_VARIABLES, VALUE_BYTES, ShellState
from tests.support.unprivileged import unprivileged_user

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


async def test_a_workspace_that_did_not_change_writes_no_archive(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    snar = jobs / "chain.snar"
    source = await sandboxes()
    await run(source, "mkdir d && echo one > d/f && cd d && export MARK=1")
    first = await source.checkpoint(snar, jobs / "1.tar", CAP)
    assert first.archive is not None and first.signature is not None
    # Reads, a directory change and a variable: no file changed, so no archive (the shell's
    # state is read all the same).
    await run(source, "cat f; ls -la /workspace; cd /workspace && export MARK=2")
    same = await source.checkpoint(snar, jobs / "2.tar", CAP, unchanged=first.signature)
    assert (same.archive, same.signature) == (None, first.signature)
    assert not (jobs / "2.tar").exists() and same.shell is not None
    assert same.shell.cwd == "/workspace" and ("MARK", "2") in (same.shell.env or ())
    # Each kind of change is seen: the same bytes written again, a touch back in time, a
    # rename, a mode.
    changes = [
        "echo one > d/f",
        "touch -d @0 d/f",
        "mv d/f d/g",
        "chmod 600 d/g",
    ]
    last = same.signature
    for i, change in enumerate(changes, start=3):
        await run(source, change)
        made = await source.checkpoint(snar, jobs / f"{i}.tar", CAP, unchanged=last)
        assert made.archive is not None and made.signature != last, change
        last = made.signature
    fresh = await sandboxes()
    archives = [first.archive, *(jobs / f"{i}.tar" for i in range(3, 3 + len(changes)))]
    await fresh.restore(archives, None)
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


# Swaps /workspace/x (a directory holding etc/passwd) for a link to argv[1] the moment tar
# opens a-big, which it reads after it has listed every directory and before it reads x/etc's
# files by their path: a tar on the host that followed the link would read the host's files.
SWAP_ON_OPEN = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace")
fd = libc.inotify_init1(0)
assert fd >= 0 and libc.inotify_add_watch(fd, b"a-big", 0x20) >= 0  # IN_OPEN
open("/tmp/armed", "w").close()
os.read(fd, 4096)
os.rename("x", "stash/x")
os.symlink(sys.argv[1], "x")
"""


async def race_a_swap(source: Sandbox, jobs: Path, target: str) -> Checkpointed | None:
    """A checkpoint of ``source`` while SWAP_ON_OPEN makes its x a link to ``target``: the
    archive, or None where what the swap did to tar's walk failed it (then nothing is kept)."""
    await run(source, "mkdir -p x/etc stash && echo mine > x/etc/passwd")
    await run(source, "head -c 24M /dev/urandom > a-big")
    await source.write_file("/tmp/swap.py", SWAP_ON_OPEN)
    armed = f"python3 /tmp/swap.py {shlex.quote(target)} & until [ -e /tmp/armed ]; do :; done"
    await run(source, armed)
    made: Checkpointed | None = None
    try:
        made = await bounded(source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP))
    except SandboxError:
        assert list(jobs.iterdir()) == []
    await run(source, "until [ -L /workspace/x ]; do :; done")  # it swapped (if late)
    return made


# The link's target: the root (a host's tar would read the host's), or tar's own root by /proc
# (a host's tar would read the host's again; in the sandbox's root, /proc is the sandbox's,
# where tar has no "self": nothing is there to read).
@pytest.mark.parametrize("target", ["/", "/proc/self/root"])
async def test_a_directory_swapped_for_a_link_while_tar_reads_yields_no_host_file(
    sandboxes: Callable[[], Any], tmp_path: Path, target: str
) -> None:
    made = await race_a_swap(await sandboxes(), chain_dir(tmp_path), target)
    assert made is not None  # the swap leaves tar a walk it can finish
    assert HOST_ONLY not in made.archive.read_bytes()
    # Control: tar read x/etc/passwd through the link (the sandbox's own /etc/passwd), or
    # before the swap (the file the sandbox wrote), or found nothing there; the big file is
    # there, whole.
    with tarfile.open(made.archive) as tar:
        names = tar.getnames()
        assert tar.getmember("workspace/a-big").size == 24 * MiB
        if target == "/" or "workspace/x/etc/passwd" in names:
            read = tar.extractfile("workspace/x/etc/passwd")
            assert read is not None
            passwd = read.read()
            assert passwd == b"mine\n" or passwd.startswith(b"sandbox:x:1000:")


async def test_a_hard_link_to_a_file_outside_the_workspace_cannot_be_made(
    sandboxes: Callable[[], Any],
) -> None:
    sandbox = await sandboxes()
    # Attack: a hard link (which tar would archive as the file) to a file of the root, or of
    # /usr (the host's): the workspace is a file system of its own, so there is none.
    for outside in ("/etc/passwd", "/usr/bin/env", "/tmp/x"):
        await run(sandbox, "touch /tmp/x")
        made = await sandbox.exec(["ln", outside, "/workspace/link"])
        assert made.exit_code != 0 and "Invalid cross-device link" in made.stderr
    # Control: a hard link within the workspace is made (and kept: see the chain above).
    await run(sandbox, "touch f && ln f g")


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


async def test_special_files_neither_stall_nor_break_the_chain(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    # Attack: a fifo with a writer that never writes (a reader of it would wait for ever), a
    # socket, and the one device node a sandbox can make (0/0, an overlay whiteout).
    await run(source, "mkfifo fifo && (exec 3<>fifo; sleep 300) & mknod white c 0 0")
    await run(source, "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"")
    await run(source, "echo kept > f")
    made = await bounded(source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP))
    fresh = await sandboxes()
    await fresh.restore([made.archive], None)
    # Control: the fifo and the whiteout come back as what they are; the socket (no file) not.
    want = await manifest(source)
    assert want["tree"].pop("sock")[1] == "s"
    assert want["tree"]["fifo"][1] == "p" and want["tree"]["white"][1] == "c"
    assert await manifest(fresh) == want
    assert await fresh.read_file("/workspace/f") == b"kept\n"


async def test_sparse_files_of_many_times_the_disk_stay_sparse(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    # Attack: a file of 1 TiB (a hole) in a 64 MiB workspace: no file may be larger than the
    # workspace (the action server's RLIMIT_FSIZE), so that is refused...
    refused = await source.bash("truncate -s 1T big")
    assert refused.exit_code != 0 and "File size limit exceeded" in refused.output
    # ... so 200 files of 63 MiB each, a byte at each one's end: 12 GiB of holes.
    fill = "for i in $(seq 200); do printf x | dd of=s$i bs=1 seek=$((63<<20)) 2>/dev/null; done"
    await run(source, fill)
    made = await bounded(source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP))
    assert made.size < 2 * MiB
    fresh = await sandboxes()
    await bounded(fresh.restore([made.archive], None))
    # Control: the same files, their holes kept (what they store, not what they say they hold).
    listing = ["find", "/workspace", "-type", "f", "-printf", "%P %s\\n"]
    seen = sorted((await fresh.exec(listing)).stdout.splitlines())
    assert seen == sorted((await source.exec(listing)).stdout.splitlines())
    assert len(seen) == 201  # and big, empty: what truncate made before it was refused
    assert (await fresh.exec(["tail", "-c", "1", "/workspace/s7"])).stdout == "x"
    used = await fresh.exec(["du", "-s", "--block-size=1", "/workspace"])
    assert int(used.stdout.split()[0]) < 8 * MiB


async def test_many_empty_files_are_cut_off_at_the_cap(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    snar = jobs / "s.snar"
    source = await sandboxes()
    # Attack: 20,000 empty files (nothing in the tmpfs's size cap counts them), 400 of them
    # directories: each costs the archive a header.
    many = (
        "import os\n"
        "for d in range(400):\n"
        "    os.makedirs(f'/workspace/m/{d}')\n"
        "    for f in range(49): open(f'/workspace/m/{d}/{f}', 'w').close()\n"
    )
    assert (await source.exec(["python3", "-c", many], timeout_s=120)).exit_code == 0
    with pytest.raises(CheckpointTooLarge):
        await bounded(source.checkpoint(snar, jobs / "1.tar", 1 * MiB))
    assert list(jobs.iterdir()) == []  # no archive, no state: the next one starts the chain
    # Control: under a cap that holds them, the chain's state file is no larger than the
    # archives (the disk it takes is what the cap counts).
    first = await bounded(source.checkpoint(snar, jobs / "1.tar", 64 * MiB))
    again = await bounded(source.checkpoint(snar, jobs / "2.tar", 64 * MiB))
    assert first.size > 20_000 * 512 and snar.stat().st_size < again.size < first.size


async def test_a_file_growing_while_tar_reads_it_is_kept_as_far_as_it_was(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    # Attack: a file that grows all the while (a tar reading to its end would never end).
    await run(source, "(while :; do echo x; done >> grow) & until [ -s grow ]; do :; done")
    first = await bounded(source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP))
    second = await bounded(source.checkpoint(jobs / "s.snar", jobs / "2.tar", CAP))
    fresh = await sandboxes()
    await fresh.restore([first.archive, second.archive], None)
    # Control: what was read is whole lines of it, as the file was at some moment.
    grown = await fresh.read_file("/workspace/grow")
    assert grown and grown == b"x\n" * (len(grown) // 2)


async def test_names_tar_could_misread_come_back_as_names(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    # Attack: names that read as tar's options, or break a line-by-line reader, or are no
    # UTF-8; a name of 255 bytes; a path of 4000 bytes (past tar's header's 100).
    names = (
        "import os\n"
        "os.chdir('/workspace')\n"
        "for name in [b'--to-command=touch pwned', b'--checkpoint-action=exec=touch pwned',\n"
        "             b'--checkpoint=1', b'-P', b'-', b'a\\nb', b'\\n', b'\\xff\\xfe', b' s ',\n"
        "             b'back\\\\slash', b'q\\'\"$(touch pwned)', b'*', b'n' * 255]:\n"
        "    open(name, 'w').write('x')\n"
        "deep = '/'.join(['d' * 99] * 40)\n"
        "os.makedirs(deep)\n"
        "open(deep + '/f', 'w').write('deep')\n"
    )
    assert (await source.exec(["python3", "-c", names])).exit_code == 0
    first = await source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP)
    await run(source, "echo more > ./--checkpoint=1 && mv ./-P ./-x")
    second = await source.checkpoint(jobs / "s.snar", jobs / "2.tar", CAP)
    fresh = await sandboxes()
    await fresh.restore([first.archive, second.archive], None)
    # Control: the same tree, and nothing ran (in either sandbox, or beside the archives).
    assert await manifest(fresh) == await manifest(source)
    for sandbox in (source, fresh):
        assert (await sandbox.exec(["find", "/", "-xdev", "-name", "pwned"])).stdout == ""
    assert sorted(p.name for p in jobs.iterdir()) == ["1.tar", "2.tar", "s.snar"]


# -- the shell's state: data, never code --------------------------------------------------------

PLANT = "touch /tmp/pwned"
ODD_DIR = "/workspace/q'\"$(touch pwned)`touch pwned`\n; x"  # no /: one directory


async def pwned(sandbox: Sandbox) -> bool:
    """Whether a planted ``touch`` ran, in /tmp or where it ran (a fresh process looks)."""
    found = await sandbox.exec(["find", "/tmp", "/workspace", "-name", "pwned"])
    return found.stdout != ""


async def test_the_shell_comes_back_as_data_through_a_row(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    # Attack: a directory and values that are commands to any reader that evaluates them:
    # quotes of both kinds, $( ), backquotes, newlines, a NUL-free ; chain.
    await source.write_file("/tmp/setup.py", f"import os; os.makedirs({ODD_DIR!r})")
    await run(source, "python3 /tmp/setup.py && rm /tmp/setup.py")
    values = {"V": f"$({PLANT})", "W": f"'; {PLANT}; '\n\"`{PLANT}`\"", "X": "a\\\nb"}
    await source.bash(
        'cd "$(printf \'q%s\' "\'\\"")"*; '
        + "; ".join(f"export {n}={shlex.quote(v)}" for n, v in values.items())
    )
    made = await source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP)
    assert made.shell is not None and made.shell.cwd == ODD_DIR
    row = json.loads(json.dumps(shell_data(made.shell)))  # as the store keeps it
    fresh = await sandboxes()
    restored = await fresh.restore([made.archive], shell_of(row))
    # Control: the directory and every value as they were, and nothing ran anywhere.
    assert restored.lost == ()
    seen = await fresh.bash('printf "%s\\0" "$PWD" "$V" "$W" "$X"')
    assert seen.output.split("\0")[:4] == [ODD_DIR, *values.values()]
    assert not await pwned(fresh) and not await pwned(source)


def test_a_row_is_checked_again_as_the_shells_output_is() -> None:
    # Attack: a row written by other means than raas's reading of the shell (the store's
    # file edited): what ShellState.parse would never have kept.
    row = {
        "cwd": "/workspace",
        "env": [
            ["BASH_ENV", "/workspace/evil.sh"],  # read by every non-interactive bash
            ["PROMPT_COMMAND", PLANT],
            ["SHELLOPTS", "xtrace"],
            ["BASH_FUNC_ls%%", f"() {{ {PLANT}; }}"],
            ["A;touch pwned", "x"],
            ["NUL", "a\0b"],  # the shell's output never holds one: it separates its records
            ["BIG", "x" * (VALUE_BYTES + 1)],
            ["SURROGATE", "\udcff"],
            ["SHORT"],
            "KEPT=1",
            ["KEPT", "yes"],
        ],
        "dropped": ["said", 3],
    }
    state = shell_of(row)
    assert state is not None and state.env == (("KEPT", "yes"),) and state.dropped == ("said",)
    assert state.cwd == "/workspace"
    for cwd in ("workspace", "/a\0b", "/" + "d" * 5000, 7, None):
        state = shell_of({**row, "cwd": cwd})
        assert state is not None and state.cwd is None
    many = {"env": [[f"V{i}", "x"] for i in range(MAX_VARIABLES + 5)]}
    state = shell_of(many)
    assert state is not None and state.env is not None and len(state.env) == MAX_VARIABLES
    # Control: what a real shell gave comes back as it was.
    real = ShellState("/workspace/a b", (("A", "1"), ("B", "it's\n$(x)")), ("x (y)",))
    assert shell_of(json.loads(json.dumps(shell_data(real)))) == real
    assert shell_of(None) is None and shell_of(["cwd"]) is None


async def test_a_tampered_row_runs_nothing_in_the_fresh_sandbox(
    sandboxes: Callable[[], Any], tmp_path: Path
) -> None:
    jobs = chain_dir(tmp_path)
    source = await sandboxes()
    await source.write_file("/workspace/evil.sh", f"{PLANT}\n")
    made = await source.checkpoint(jobs / "s.snar", jobs / "1.tar", CAP)
    # Attack: BASH_ENV in the row, naming a script of the restored workspace: a bash started
    # after the restore (the judge's, the agent's) would run it.
    row = {"cwd": "/workspace", "env": [["BASH_ENV", "/workspace/evil.sh"], ["OK", "1"]]}
    fresh = await sandboxes()
    await fresh.restore([made.archive], shell_of(row))
    seen = await fresh.bash('echo "${BASH_ENV-unset} $OK"; bash -c true')
    assert seen.output.split("\n")[0] == "unset 1"
    assert not await pwned(fresh)


# -- rootless: raas's own files are the sandbox's user's ------------------------------------------

# Run as the unprivileged user: the swap race towards LOOT (the user's own: where a rootless raas
# keeps its database), a chain that writes through a link into TARGET (the user's too), and a
# chain restored whole (the control). Prints what it found, as JSON.
ROOTLESS = r"""
import asyncio, json, os, sys
from pathlib import Path
from raas.sandbox import BwrapConfig, SandboxError, create_sandbox
from tests.sandbox.test_sandbox_checkpoint import (
    CAP, LIMITS, manifest, race_a_swap, run, swap_member,
)

async def main(loot, target):
    home = Path(os.environ["HOME"])
    config = BwrapConfig(limits=LIMITS, runtime_dir=Path(os.environ["RAAS_SANDBOX_DIR"]))
    made, report = [], {}

    async def sandbox():
        made.append(create_sandbox(config))
        await made[-1].start()
        return made[-1]

    def jobs(name):
        (home / name).mkdir(mode=0o700)
        return home / name

    try:
        raced = await race_a_swap(await sandbox(), jobs("race"), loot)
        report["loot"] = raced is not None and b"raas-secret" in raced.archive.read_bytes()
        chain, source = jobs("chain"), await sandbox()
        await run(source, f"ln -s {target} z")
        first = await source.checkpoint(chain / "s.snar", chain / "1.tar", CAP)
        await run(source, "mkdir p && echo pwned > p/planted")
        second = await source.checkpoint(chain / "s.snar", chain / "2.tar", CAP)
        forged = swap_member(second.archive, "p", "z", chain / "2-forged.tar")
        try:
            await (await sandbox()).restore([first.archive, forged], None)
        except SandboxError:
            pass
        report["planted"] = os.listdir(target)
        fresh = await sandbox()
        await fresh.restore([first.archive, second.archive], None)
        report["whole"] = await manifest(fresh) == await manifest(source)
    finally:
        for each in made:
            await each.close()
    print(json.dumps(report))

asyncio.run(main(*sys.argv[1:]))
"""


def test_rootless_no_link_leads_tar_to_raas_own_files() -> None:
    with unprivileged_user() as user:
        loot, target = user.home / "loot", user.home / "target"
        (loot / "etc").mkdir(parents=True)
        (loot / "etc" / "passwd").write_text("raas-secret\n")
        target.mkdir()
        for path in (loot, loot / "etc", loot / "etc" / "passwd", target):
            os.chown(path, user.uid, user.uid)
            path.chmod(0o700 if path.is_dir() else 0o600)
        done = user.python_run("-c", ROOTLESS, str(loot), str(target), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.splitlines()[-1])
    # Attack: a rootless raas's tar runs as the user that owns raas's files.
    assert report["loot"] is False and report["planted"] == []
    # Control: as that user, a chain comes back whole.
    assert report["whole"] is True
