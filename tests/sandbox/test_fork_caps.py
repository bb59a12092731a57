"""Forks inside the disk caps (issue 44, class 4): what a fork copies lands in the child's own
size-capped tmpfs mounts (its workspace, its /tmp, and for an image the tmpfs under its overlay),
never on the host's disk; sparse files stay sparse; a parent that holds more than the child's
caps allow is refused at once, with an error naming the cap.

The attacks: a workspace or an image root holding 18 GiB of holes (in files each under the
sandbox's RLIMIT_FSIZE, or one file where the parent's cap is large) made a fork copy them as
data until the child's tmpfs was full or its timeout came; an image fork put its parent's upper
layer in the host's runtime directory, outside every cap (and each kept snapshot, a fork, up to
``disk_bytes`` more there). Each attack stands beside a control that must keep working.

The ``images`` tests run on the Debian root filesystem of scripts/images/make-base-rootfs.sh
(``make test-images``); the others need bubblewrap only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from raas.bench.oci_fixtures import base_rootfs_dir
from raas.images.image import StoredImage
from raas.sandbox import (
    BwrapConfig,
    SandboxError,
    SandboxLimits,
    namespaced,
    procs,
    runtime_root,
)
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.rootfs import MOUNT_SCRIPT, ImageRoot
from tests.support import tiers
from tests.support.unprivileged import unprivileged_user

MiB = 1024 * 1024
GiB = 1024 * MiB
LIMITS = SandboxLimits(action_timeout_s=120, disk_bytes=64 * MiB, start_timeout_s=120)
# Generous for two busy cores: a fork that copied the holes as data took 19 s on idle ones.
DEADLINE_S = 60.0
# 300 files of 63 MiB of holes: 18.5 GiB, each file under a 64 MiB sandbox's RLIMIT_FSIZE.
HOLES = "mkdir -p {dir} && for i in $(seq 300); do truncate -s 63M {dir}/$i || exit 1; done"
# What the child reports of the holes: how many files, their size in all, and what they store.
SEEN = "ls {dir} | wc -l; du -s -B1M --apparent-size {dir} | cut -f1; du -s -B1 {dir} | cut -f1"
# Used and available bytes of the file system a sandbox path is on.
DF = "df -B1 --output=used,avail {path} | tail -1"


def our_processes() -> set[int]:
    return procs.descendants(os.getpid())


def host_bytes(path: Path) -> int:
    """What lies under ``path`` on the host's disk, in allocated blocks (st_blocks)."""
    total = 0
    for top, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def directory_fds(sandbox: BwrapSandbox) -> list[str]:
    """The open directories of the sandbox's processes (its launch's included), as seen here."""
    assert sandbox.process is not None
    found = []
    for pid in sorted(sandbox.host_pids() | {sandbox.process.pid}):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if stat.S_ISDIR(os.stat(f"/proc/{pid}/fd/{fd}").st_mode):
                        found.append(f"{pid}/{fd}: {os.readlink(f'/proc/{pid}/fd/{fd}')}")
    return found


async def df(sandbox: BwrapSandbox, path: str) -> tuple[int, int]:
    used, avail = (await sandbox.bash(DF.format(path=path))).output.split()
    return int(used), int(avail)


@contextlib.asynccontextmanager
async def started(sandbox: BwrapSandbox) -> AsyncIterator[BwrapSandbox]:
    try:
        if not sandbox.client:
            await sandbox.start()
        yield sandbox
    finally:
        await sandbox.close()


async def timed_fork(parent: BwrapSandbox, limits: SandboxLimits | None = None) -> BwrapSandbox:
    """``parent.fork(limits)``, which must end (done or refused) well within DEADLINE_S."""
    start = time.monotonic()
    try:
        return await asyncio.wait_for(parent.fork(limits), DEADLINE_S)
    finally:
        assert time.monotonic() - start < DEADLINE_S


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A runtime directory of the test's own that the sandbox's uid (raas as root) can reach."""
    path = Path(tempfile.mkdtemp(prefix="fork-caps-", dir=runtime_root()))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the workspace (any bwrap sandbox) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("parent_disk", "make"),
    [
        (64 * MiB, HOLES.format(dir="/workspace/holes")),
        (32 * GiB, "mkdir /workspace/holes && truncate -s 18G /workspace/holes/1"),
    ],
    ids=["300-files-of-holes", "one-18G-file"],
)
async def test_holes_in_the_workspace_fork_quickly_and_stay_holes(
    runtime: Path, parent_disk: int, make: str
) -> None:
    limits = LIMITS.model_copy(update={"disk_bytes": parent_disk})
    config = BwrapConfig(limits=limits, runtime_dir=runtime)
    async with started(BwrapSandbox(config)) as parent:
        made = await parent.bash(f"{make} && head -c 1M /dev/urandom > /workspace/data && echo ok")
        assert made.output.strip().endswith("ok"), made.output
        files = (await parent.bash(SEEN.format(dir="/workspace/holes"))).output.split()[0]
        views = []
        for _ in range(2):  # the same result each time: no race with a deadline
            # Attack: 18 GiB of holes for a child with a 64 MiB workspace.
            async with started(await timed_fork(parent, LIMITS)) as child:
                count, apparent, stored = (
                    await child.bash(SEEN.format(dir="/workspace/holes"))
                ).output.split()
                assert int(stored) < MiB  # holes, not data
                assert host_bytes(runtime) < 4 * MiB  # and nothing of them on the host's disk
                # Control: the data beside the holes is carried as it was.
                sums = await asyncio.gather(
                    *(sb.bash("md5sum < /workspace/data") for sb in (parent, child))
                )
                assert sums[0].output == sums[1].output
                views.append((count, apparent))
        assert views[0] == views[1] and views[0][0] == files
        assert int(views[0][1]) >= 18 * 1024  # MiB: every hole is there


async def test_a_workspace_over_the_forks_disk_bytes_is_refused_at_once(runtime: Path) -> None:
    async with started(BwrapSandbox(BwrapConfig(limits=LIMITS, runtime_dir=runtime))) as parent:
        await parent.bash("head -c 40M /dev/urandom > /workspace/data")
        before = our_processes()
        small = LIMITS.model_copy(update={"disk_bytes": 16 * MiB})
        # Attack: 40 MiB of data for a child with 16 MiB: refused before anything is copied.
        with pytest.raises(SandboxError, match=r"workspace.*the fork's disk_bytes \(16777216 "):
            await timed_fork(parent, small)
        assert our_processes() - before == set()
        # Control: under a cap that holds it, the same workspace forks, byte for byte.
        larger = LIMITS.model_copy(update={"disk_bytes": 48 * MiB})
        async with started(await timed_fork(parent, larger)) as child:
            sums = [await sb.bash("md5sum < /workspace/data") for sb in (parent, child)]
            assert sums[0].output == sums[1].output


async def test_a_tmp_over_the_forks_tmp_bytes_is_refused_naming_it(runtime: Path) -> None:
    async with started(BwrapSandbox(BwrapConfig(limits=LIMITS, runtime_dir=runtime))) as parent:
        await parent.bash("head -c 20M /dev/urandom > /tmp/data")
        small = LIMITS.model_copy(update={"tmp_bytes": 8 * MiB})
        # Attack: /tmp holds more than the child's tmp_bytes.
        with pytest.raises(SandboxError, match=r"/tmp, more than the fork's tmp_bytes"):
            await timed_fork(parent, small)
        # Control: with room for it, /tmp is carried.
        async with started(await timed_fork(parent)) as child:
            assert (await child.bash("stat -c %s /tmp/data")).output.strip() == str(20 * MiB)


# -- image roots -----------------------------------------------------------------------------------


def test_a_forks_launch_is_told_its_seed_and_drops_it_before_the_sandbox_runs() -> None:
    image = StoredImage("example.org/swe/caps:1", "sha256:00", (Path("/layer"),))
    plain = ImageRoot(image, Path("/run/sb/image"), 64 * MiB, owner=1_200_001)
    assert "RAAS_SEED" not in plain.launch_env()  # control: no fork, no seed
    seeded = ImageRoot(image, Path("/run/sb/image"), 64 * MiB, 1_200_001, seed_fd=12, seed_owner=7)
    env = seeded.launch_env()
    assert (env["RAAS_SEED"], env["RAAS_SEED_OWNER"]) == ("12", "7") and env["RAAS_PYTHON"]
    assert seeded.launch_prefix() == plain.launch_prefix()  # the seed is in no command line
    # Into the capped tmpfs, holes kept; then the fd is closed and the variables unset.
    assert 'cp -a --sparse=always -- "/proc/self/fd/$seed/." "$1/"' in MOUNT_SCRIPT
    assert "os.close(int(sys.argv[1]))" in MOUNT_SCRIPT
    assert "unset PWD OLDPWD RAAS_PYTHON RAAS_COPY RAAS_SEED RAAS_SEED_OWNER" in MOUNT_SCRIPT


@pytest.fixture
def image(tmp_path: Path) -> StoredImage:
    debian = base_rootfs_dir()
    if not (debian / "usr/bin/python3").exists():
        why = f"no Debian root filesystem at {debian}: scripts/images/make-base-rootfs.sh builds it"
        if tiers.selected("images"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    top = tmp_path / "layer-top"
    for name, text in {"testbed/pkg/mod.py": "X = 1\n", "testbed/README": "r\n"}.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    return StoredImage("example.org/swe/caps:1", "sha256:00", (debian, top), (), "/testbed")


@pytest.fixture(params=["overlay", "copy"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "copy":  # as where the kernel refuses an overlay
        monkeypatch.setattr(namespaced, "overlay_options", lambda rootless: None)
    return str(request.param)


def image_sandbox(image: StoredImage, runtime: Path, limits: SandboxLimits) -> BwrapSandbox:
    return BwrapSandbox(BwrapConfig(limits=limits, runtime_dir=runtime), image)


@pytest.mark.images
async def test_an_image_root_over_the_forks_disk_bytes_is_refused_naming_it(
    image: StoredImage, runtime: Path
) -> None:
    async with started(image_sandbox(image, runtime, LIMITS)) as parent:
        await parent.bash("head -c 24M /dev/urandom > /testbed/data")
        small = LIMITS.model_copy(update={"disk_bytes": 16 * MiB})
        before, fds = our_processes(), os.listdir("/proc/self/fd")
        # Attack: an upper layer of 24 MiB for a child whose disk_bytes is 16 MiB.
        with pytest.raises(
            SandboxError, match=r"image root's changes, more than the fork's disk_bytes \(16777216"
        ):
            await timed_fork(parent, small)
        assert our_processes() - before == set()
        assert list(runtime.iterdir()) == [parent.dir]
        # Control: a small upper layer forks under the same cap, and the child sees its files.
        await parent.bash("rm /testbed/data /testbed/README && echo small > /testbed/small")
        async with started(await timed_fork(parent, small)) as child:
            seen = await child.bash(
                "cat /testbed/small /testbed/pkg/mod.py; test -e /testbed/README || echo gone"
            )
            assert seen.output.split("\n")[:-1] == ["small", "X = 1", "gone"]
            assert directory_fds(child) == []  # none of the parent's, nor any other
        assert len(os.listdir("/proc/self/fd")) == len(fds)  # raas kept none open either


@pytest.mark.images
async def test_a_forks_image_changes_are_counted_by_its_own_disk_cap(
    image: StoredImage, runtime: Path, how: str
) -> None:
    # The copy fallback's tmpfs holds the whole image (about 220 MiB) besides the changes.
    disk = 64 * MiB if how == "overlay" else 320 * MiB
    limits = LIMITS.model_copy(update={"disk_bytes": disk})
    async with started(image_sandbox(image, runtime, limits)) as parent:
        await parent.bash("head -c 20M /dev/urandom > /testbed/data")
        async with started(await timed_fork(parent)) as child:
            used, avail = await df(child, "/testbed")
            # The parent's changes lie in the child's own tmpfs, counted by its disk_bytes...
            assert used >= 20 * MiB and used + avail <= disk
            assert host_bytes(runtime) < 2 * MiB  # ...and not on the host's disk
            # Attack: write what is left and a MiB more: the cap holds (ENOSPC).
            full = await child.bash(f"head -c {avail + MiB} /dev/zero > /testbed/more; echo $?")
            assert "No space left on device" in full.output
            assert full.output.strip().splitlines()[-1] != "0"
            # Control: with room again, the child writes, and its files are the parent's.
            again = await child.bash("rm /testbed/more && head -c 4M /dev/zero > /testbed/ok")
            assert again.exit_code == 0, again.output
            sums = [await sb.bash("md5sum < /testbed/data") for sb in (parent, child)]
            assert sums[0].output == sums[1].output


@pytest.mark.images
async def test_holes_in_an_image_root_fork_quickly_and_stay_holes(
    image: StoredImage, runtime: Path
) -> None:
    async with started(image_sandbox(image, runtime, LIMITS)) as parent:
        made = await parent.bash(HOLES.format(dir="/testbed/holes") + " && echo ok")
        assert made.output.strip() == "ok", made.output
        views = []
        for _ in range(2):  # the same result each time
            # Attack: 18.5 GiB of holes in the upper layer of a 64 MiB image root.
            async with started(await timed_fork(parent)) as child:
                count, apparent, stored = (
                    await child.bash(SEEN.format(dir="/testbed/holes"))
                ).output.split()
                assert int(stored) < MiB and (await df(child, "/testbed"))[0] < 4 * MiB
                assert host_bytes(runtime) < 2 * MiB
                views.append((count, apparent))
        assert views[0] == views[1] and views[0][0] == "300"
        assert int(views[0][1]) >= 300 * 63  # MiB: every hole is there


@pytest.mark.images
async def test_a_snapshot_and_its_branch_each_hold_their_changes_in_their_own_cap(
    image: StoredImage, runtime: Path
) -> None:
    # A kept snapshot is an idle fork of the job's sandbox, and a branch a fork of that.
    parent = image_sandbox(image, runtime, LIMITS)
    async with started(parent):
        await parent.bash("head -c 20M /dev/urandom > /testbed/data")
        snapshot = await timed_fork(parent)
    async with started(snapshot), started(await timed_fork(snapshot)) as branch:
        for sandbox in (snapshot, branch):
            used, avail = await df(sandbox, "/testbed")
            assert used >= 20 * MiB and used + avail <= LIMITS.disk_bytes
        assert host_bytes(runtime) < 2 * MiB  # neither keeps anything on the host's disk
        # Attack: the branch writes past its cap; control: the snapshot is left as it was.
        full = await branch.bash("head -c 60M /dev/zero > /testbed/more; echo $?")
        assert "No space left on device" in full.output
        assert (await snapshot.bash("stat -c %s /testbed/data")).output.strip() == str(20 * MiB)


# Run as the unprivileged user: an image sandbox (rootless: its launch is in a user namespace of
# its own, where no other sandbox's /proc/PID/root can be read) writes, forks, and reports.
ROOTLESS_FORK = """
import asyncio, json, os, sys
from pathlib import Path
from raas.sandbox import BwrapConfig, SandboxError, SandboxLimits
from raas.sandbox.bwrap import BwrapSandbox
from raas.images.image import StoredImage

async def main():
    layers = tuple(Path(p) for p in sys.argv[1:3])
    image = StoredImage("example.org/swe/caps:1", "sha256:00", layers, (), "/testbed")
    limits = SandboxLimits(action_timeout_s=120, disk_bytes=64 << 20, start_timeout_s=120)
    runtime = Path(os.environ["RAAS_SANDBOX_DIR"])
    parent = BwrapSandbox(BwrapConfig(limits=limits, runtime_dir=runtime), image)
    await parent.start()
    report = {}
    try:
        await parent.bash("head -c 20M /dev/urandom > /testbed/data && rm /testbed/README")
        try:
            await parent.fork(limits.model_copy(update={"disk_bytes": 16 << 20}))
        except SandboxError as e:
            report["refused"] = str(e)
        child = await parent.fork()
        try:
            seen = await child.bash("ls /testbed; df -B1 --output=used /testbed | tail -1")
            report["seen"] = seen.output.split()
            full = await child.bash("head -c 60M /dev/zero > /testbed/more; echo $?")
            report["full"] = full.output
        finally:
            await child.close()
    finally:
        await parent.close()
    print(json.dumps(report))

asyncio.run(main())
"""


@pytest.mark.images
def test_a_rootless_fork_keeps_its_image_changes_in_its_own_cap(image: StoredImage) -> None:
    with unprivileged_user() as user:
        # The image as the user's: the base hard-linked (read, never written), the top its own.
        debian, top = user.shared / "debian", user.home / "top"
        linked = subprocess.run(["cp", "-al", str(image.layers[0]), str(debian)], check=False)
        if linked.returncode != 0:  # another file system: a copy
            shutil.rmtree(debian, ignore_errors=True)
            subprocess.run(["cp", "-a", str(image.layers[0]), str(debian)], check=True)
        shutil.copytree(image.layers[1], top)
        for path in (top, *top.rglob("*")):
            os.chown(path, user.uid, user.uid)
        run = user.python_run("-c", ROOTLESS_FORK, str(debian), str(top), timeout=300)
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
    # Attack: more than the fork's disk_bytes is refused, naming it.
    assert "more than the fork's disk_bytes (16777216 bytes)" in report["refused"]
    # Control: the fork sees the parent's files, held in its own tmpfs, which its cap bounds.
    names, used = report["seen"][:-1], int(report["seen"][-1])
    assert names == ["data", "pkg"] and used >= 20 * MiB
    assert "No space left on device" in report["full"]
