"""A runtime directory only raas's user can touch (issue 44, class 2), each attack beside its
control.

The attacker is another local user of the host (uid 65534 through ``tests/support/unprivileged.py``,
where the tests run as root; else the tests that need a second user skip). Each test has a
runtime root of its own, in a directory that is as ``/tmp`` is (1777, root's) and that
``RAAS_SANDBOX_DIR`` names: the root is made, or refused, there.

- the root: another user's (made first), one others may write in (0777), a link in its place,
  a parent others may write in without the sticky bit: refused in one line naming it;
- staged copies: one whose files changed after it was staged, one replaced by another
  directory, one another process made whose files are not what its sources give: not bound;
- launch records: a record naming a process that is no sandbox (ours, or another user's) kills
  nothing; a real sandbox a dead server left is killed, and a launch that mounted its root.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from raas.images.layers import remove_tree
from raas.sandbox import BwrapConfig, SandboxLimits, claim_runtime_dir, create_sandbox, procs
from raas.sandbox.copies import StagedCopyError
from raas.sandbox.pydeps import staged_binds
from raas.sandbox.runtime import NAME_KEY, RuntimeDirError, record_launch, runtime_root
from tests.support.unprivileged import NOBODY, TOOLS_PATH, User, unprivileged_user

MiB = 1024 * 1024
LIMITS = SandboxLimits(disk_bytes=32 * MiB, tmp_bytes=32 * MiB, shm_bytes=8 * MiB)
REPO = Path(__file__).resolve().parents[2]
ROOT_MODE = 0o711 if os.geteuid() == 0 else 0o700
SETPRIV = shutil.which("setpriv", path=TOOLS_PATH) or "setpriv"
AS_NOBODY = [SETPRIV, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "--"]

# Stages SOURCE in a process of its own (its copy then is another process's), prints the path.
STAGER = """
import sys
from raas.sandbox.pydeps import staged_binds
[host] = staged_binds(None, {sys.argv[1]: "/.raas/agent"}, own_files=True)
print(host, flush=True)
"""

# A server that starts a sandbox (with no cgroup: only its launch record can find it), then
# dies as far as its runtime directory goes (its lock given up, nothing cleaned) while the
# sandbox lives on; prints where, then the sandbox's exit status once something kills it.
PREDECESSOR = r"""
import asyncio, json, os, sys
from raas.sandbox import BwrapConfig, SandboxLimits, cgroups, claim_runtime_dir, create_sandbox

cgroups._hierarchy = lambda: None

async def main(key):
    runtime = claim_runtime_dir(key)
    limits = SandboxLimits(disk_bytes=32 << 20, tmp_bytes=32 << 20, shm_bytes=8 << 20)
    # Started cold: a zygote's sandbox dies with the server that forked it (tested beside).
    config = BwrapConfig(limits=limits, runtime_dir=runtime.path, zygote=False)
    sandbox = create_sandbox(config)
    await sandbox.start()
    os.close(runtime._fd)  # as if this server had died: its directory is a dead one's
    runtime._fd = None
    print(json.dumps({"dir": str(sandbox.dir), "pid": sandbox.process.pid}), flush=True)
    print(await sandbox.process.wait(), flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture
def shared_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory as /tmp is (root's, 1777), where the test's runtime root goes."""
    path = Path(tempfile.mkdtemp(prefix="raas-shared-"))
    path.chmod(0o1777)
    monkeypatch.setenv("RAAS_SANDBOX_DIR", str(path))
    yield path
    remove_tree(path)


@pytest.fixture(scope="module")
def other_user() -> Iterator[User]:
    """Another local user (uid 65534): only root can have one here."""
    if os.geteuid() != 0:
        pytest.skip("needs a second user: run as root (the tests then act as uid 65534)")
    try:
        with unprivileged_user() as user:
            yield user
    except RuntimeError as e:
        pytest.skip(str(e))


def _root(base: Path) -> Path:
    return base / f"raas-{os.getuid()}"


def _refusal(excinfo: pytest.ExceptionInfo[RuntimeDirError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message  # one line
    return message


# -- the runtime root ---------------------------------------------------------------------------


async def test_a_runtime_root_raas_makes_is_private_and_sandboxes_start_in_it(
    shared_tmp: Path,
) -> None:
    root = runtime_root()
    assert root == _root(shared_tmp)
    st = os.lstat(root)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o7777 == ROOT_MODE
    sandbox = create_sandbox(BwrapConfig(limits=LIMITS))
    await sandbox.start()
    try:
        assert sandbox.dir.parent == root
        assert (await sandbox.bash("echo hi")).output.strip() == "hi"
    finally:
        await sandbox.close()


async def test_a_runtime_root_another_user_made_first_is_refused(
    shared_tmp: Path, other_user: User
) -> None:
    # Attack: another user makes <tmp>/raas-<our uid> before raas does (a reboot, a /tmp clean).
    root = _root(shared_tmp)
    made = other_user.run("mkdir", "-m", "0777", str(root))
    assert made.returncode == 0, made.stderr
    with pytest.raises(RuntimeDirError) as refused:
        runtime_root()
    message = _refusal(refused)
    assert str(root) in message and f"owned by uid {NOBODY}, not you" in message
    assert "remove it" in message and "RAAS_SANDBOX_DIR" in message
    with pytest.raises(RuntimeDirError):  # and so is every sandbox that would live there
        await create_sandbox(BwrapConfig(limits=LIMITS)).start()


def test_a_runtime_root_others_may_write_in_is_refused(shared_tmp: Path) -> None:
    # Attack: the root is ours but 0777: anyone may have put copies or records in it. Refused,
    # not fixed: a chmod now would leave what they put there.
    root = _root(shared_tmp)
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(RuntimeDirError) as refused:
        runtime_root()
    message = _refusal(refused)
    assert str(root) in message and "writable by others (mode 0777)" in message
    assert os.lstat(root).st_mode & 0o777 == 0o777  # left as it was, for its owner to remove


def test_a_runtime_root_of_ours_no_one_else_could_write_in_is_tightened(shared_tmp: Path) -> None:
    # Control: ours and 0755 (raas before this check made it 0711): no one else can have put
    # anything in it, so it is made private and used.
    root = _root(shared_tmp)
    root.mkdir()
    root.chmod(0o755)
    assert runtime_root() == root
    assert os.lstat(root).st_mode & 0o7777 == ROOT_MODE


def test_a_link_in_place_of_the_runtime_root_is_refused(shared_tmp: Path, other_user: User) -> None:
    # Attack: another user puts a link at <tmp>/raas-<our uid> to a directory of theirs.
    root, theirs = _root(shared_tmp), shared_tmp / "theirs"
    for argv in (["mkdir", "-m", "0777", str(theirs)], ["ln", "-s", str(theirs), str(root)]):
        done = other_user.run(*argv)
        assert done.returncode == 0, done.stderr
    with pytest.raises(RuntimeDirError) as refused:
        runtime_root()
    message = _refusal(refused)
    assert str(root) in message and f"is a symbolic link (to {theirs})" in message
    assert list(theirs.iterdir()) == []  # nothing of raas went there


def test_a_link_of_ours_in_place_of_the_runtime_root_is_refused_too(shared_tmp: Path) -> None:
    # Attack (by any user, as this one): a link in its place, even to a directory of ours.
    target = shared_tmp / "elsewhere"
    target.mkdir(mode=0o700)
    _root(shared_tmp).symlink_to(target)
    with pytest.raises(RuntimeDirError, match="is a symbolic link"):
        runtime_root()


def test_a_parent_others_may_write_in_without_the_sticky_bit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Attack: RAAS_SANDBOX_DIR names a directory anyone may write in (no sticky bit), where
    # anyone could rename raas's root away and put theirs in its place.
    base = Path(tempfile.mkdtemp(prefix="raas-open-"))
    try:
        base.chmod(0o777)
        monkeypatch.setenv("RAAS_SANDBOX_DIR", str(base))
        with pytest.raises(RuntimeDirError) as refused:
            runtime_root()
        message = _refusal(refused)
        assert str(base) in message and "no sticky bit" in message
        base.chmod(0o1777)  # control: with it, as /tmp, the root is made there
        assert runtime_root() == _root(base)
    finally:
        remove_tree(base)


def test_the_runtime_root_is_under_xdg_runtime_dir_where_that_is_the_users_own(
    other_user: User,
) -> None:
    """As a user (not root: its sandboxes' uids could not pass a 0700 directory), the root goes
    to $XDG_RUNTIME_DIR where it is theirs and 0700, and to the temporary directory where not."""
    env = {k: v for k, v in other_user.env.items() if k != "RAAS_SANDBOX_DIR"}
    tmp = other_user.home / "tmp"
    tmp.mkdir(mode=0o700)
    os.chown(tmp, other_user.uid, other_user.uid)
    code = (
        "import os; from raas.sandbox.runtime import runtime_root; r = runtime_root();"
        " print(r, oct(os.lstat(r).st_mode & 0o7777))"
    )
    xdg = other_user.env["XDG_RUNTIME_DIR"]
    for given, expected in ((xdg, f"{xdg}/raas-{NOBODY} 0o700"), (str(REPO), f"{tmp}/raas-")):
        env |= {"XDG_RUNTIME_DIR": given, "TMPDIR": str(tmp)}
        user = User(other_user.uid, other_user.home, other_user.shared, other_user.python, env)
        done = user.python_run("-c", code, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(expected), done.stdout


# -- staged copies ------------------------------------------------------------------------------


def _agent(tmp_path: Path) -> Path:
    source = tmp_path / "agent"
    source.mkdir()
    (source / "agent.py").write_text("print('the agent')\n")
    return source


async def _started_with(binds: dict[str, str]) -> str:
    """Start a sandbox that binds ``binds``, read the agent's file in it, close it."""
    sandbox = create_sandbox(BwrapConfig(limits=LIMITS, ro_binds=binds))
    await sandbox.start()
    try:
        return (await sandbox.bash("cat /.raas/agent/agent.py")).output.strip()
    finally:
        await sandbox.close()


async def test_an_untouched_staged_copy_is_bound_and_its_sandbox_starts(
    shared_tmp: Path, tmp_path: Path
) -> None:
    # Control: staged, then bound as it was staged, twice.
    binds = staged_binds(None, {str(_agent(tmp_path)): "/.raas/agent"}, own_files=True)
    [copy] = binds
    assert Path(copy).is_relative_to(runtime_root())
    assert await _started_with(binds) == "print('the agent')"
    os.utime(Path(copy) / "agent.py")  # touched, not changed: still what was staged
    assert await _started_with(binds) == "print('the agent')"


async def test_a_staged_copy_changed_after_staging_is_not_bound(
    shared_tmp: Path, tmp_path: Path
) -> None:
    binds = staged_binds(None, {str(_agent(tmp_path)): "/.raas/agent"}, own_files=True)
    [copy] = binds
    # Attack: a file of the staged copy is changed after it was staged.
    (Path(copy) / "agent.py").write_text("import os; os.system('steal')\n")
    with pytest.raises(StagedCopyError, match="changed since it was staged"):
        await _started_with(binds)


async def test_a_staged_copy_others_may_write_is_not_bound(
    shared_tmp: Path, tmp_path: Path
) -> None:
    binds = staged_binds(None, {str(_agent(tmp_path)): "/.raas/agent"}, own_files=True)
    [copy] = binds
    # Attack: a file of it made writable by anyone (then anyone could change it after a check).
    (Path(copy) / "agent.py").chmod(0o666)
    with pytest.raises(StagedCopyError, match=r"agent\.py is writable by others"):
        await _started_with(binds)


async def test_a_staged_copy_replaced_by_another_directory_is_not_bound(
    shared_tmp: Path, tmp_path: Path
) -> None:
    binds = staged_binds(None, {str(_agent(tmp_path)): "/.raas/agent"}, own_files=True)
    top = Path(next(iter(binds))).parent
    # Attack: the whole copy swapped for another directory of the same name and files.
    shutil.copytree(top, tmp_path / "swapped", symlinks=True)
    (tmp_path / "swapped" / "dir0" / "agent.py").write_text("print('theirs')\n")
    top.rename(tmp_path / "original")
    shutil.move(tmp_path / "swapped", top)
    with pytest.raises(StagedCopyError, match="removed or replaced since it was staged"):
        await _started_with(binds)


def _staged_elsewhere(source: Path) -> Path:
    """Stage ``source`` in another process (which then exits): its copy's top directory."""
    done = subprocess.run(
        [sys.executable, "-c", STAGER, str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    return Path(done.stdout.strip()).parent


async def test_a_copy_another_process_staged_is_verified_against_its_sources(
    shared_tmp: Path, tmp_path: Path
) -> None:
    source = _agent(tmp_path)
    top = _staged_elsewhere(source)
    # Control: another process's copy, untouched, is taken (after comparing it with the
    # sources) and bound.
    binds = staged_binds(None, {str(source): "/.raas/agent"}, own_files=True)
    assert Path(next(iter(binds))).parent == top
    assert await _started_with(binds) == "print('the agent')"


def test_a_copy_another_process_staged_and_someone_changed_is_not_taken(
    shared_tmp: Path, tmp_path: Path
) -> None:
    source = _agent(tmp_path)
    top = _staged_elsewhere(source)
    # Attack: a copy already there (another process's) whose file is not the source's.
    (top / "dir0" / "agent.py").write_text("print('theirs')\n")
    with pytest.raises(StagedCopyError, match=r"does not hold what its sources do \(dir0/agent"):
        staged_binds(None, {str(source): "/.raas/agent"}, own_files=True)


# -- launch records -----------------------------------------------------------------------------


@contextlib.contextmanager
def _started(argv: list[str], **kwargs: object) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, text=True, **kwargs)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=60)


def _dead_servers_dir() -> Path:
    """A claimed runtime directory whose holder is gone (its lock given up, nothing cleaned)."""
    runtime = claim_runtime_dir(uuid.uuid4().hex)
    assert runtime._fd is not None
    os.close(runtime._fd)
    runtime._fd = None
    return runtime.path


def test_a_record_naming_a_process_that_is_no_sandbox_kills_nothing(
    shared_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    others = [AS_NOBODY] if os.geteuid() == 0 else []
    with contextlib.ExitStack() as stack:
        sleeps = [stack.enter_context(_started([*p, "sleep", "1000"])) for p in [[], *others]]
        dead = _dead_servers_dir()
        for i, sleep in enumerate(sleeps):
            # Attack: a record naming a process (its PID, its true start time, this boot).
            (dead / f"sandbox-{i}").mkdir()
            record_launch(dead / f"sandbox-{i}", sleep.pid)
        with caplog.at_level(logging.WARNING), claim_runtime_dir(uuid.uuid4().hex):
            assert not dead.exists()  # the dead server's directory was cleaned...
        for sleep in sleeps:  # ...and none of the processes its records named was killed
            assert sleep.poll() is None and procs.alive(sleep.pid)
            assert f"names process {sleep.pid}, not killed" in caplog.text


def test_a_sandbox_a_dead_server_left_is_killed(shared_tmp: Path) -> None:
    # Control: a real sandbox of a server that died, found by its launch record alone.
    argv = [sys.executable, "-c", PREDECESSOR, uuid.uuid4().hex]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with _started(argv, stdout=subprocess.PIPE, env=env) as server:
        assert server.stdout is not None
        left = json.loads(server.stdout.readline())  # EOF if it failed: the test fails
        sandbox_dir, pid = Path(left["dir"]), int(left["pid"])
        assert procs.alive(pid) and procs.descendants(pid)
        with claim_runtime_dir(uuid.uuid4().hex):
            assert not sandbox_dir.exists()
        # bwrap killed, or gone first with its child (the namespace's init) killed under it.
        status = int(server.stdout.readline())
        assert status in (-signal.SIGKILL, 128 + signal.SIGKILL)
        assert not procs.alive(pid)


ZYGOTE_SERVER = r"""
import asyncio, json, sys
from raas.sandbox import BwrapConfig, claim_runtime_dir, create_sandbox
from raas.sandbox.zygote import ForkedProcess

async def main():
    runtime = claim_runtime_dir(sys.argv[1])
    sandbox = create_sandbox(BwrapConfig(runtime_dir=runtime.path))
    await sandbox.start()
    await sandbox.bash("sleep 1000 &")
    forked = isinstance(sandbox.process, ForkedProcess)
    print(json.dumps({"forked": forked, "pids": sorted(sandbox.host_pids())}), flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


def test_a_zygotes_sandbox_dies_with_the_server_that_forked_it() -> None:
    # A successor cannot prove a zygote's fork its sandbox from the launch record (its
    # directory is the zygote's): it need not, as nothing of it outlives the server.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    key = uuid.uuid4().hex
    command = [sys.executable, "-c", ZYGOTE_SERVER, key]
    with _started(command, stdout=subprocess.PIPE, env=env) as server:
        assert server.stdout is not None
        started = json.loads(server.stdout.readline())  # EOF if it failed: the test fails
        pids = set(started["pids"])
        assert started["forked"] and len(pids) >= 3  # control: init, server, bash, sleep
        assert all(procs.alive(p) for p in pids)
        server.kill()
        assert server.wait(timeout=60) == -signal.SIGKILL
        assert procs.wait_gone(pids, 30) == set()
    with claim_runtime_dir(key):  # what it left on disk and in cgroups (else left for good)
        pass


def test_a_launch_that_mounted_the_sandboxs_root_is_killed(shared_tmp: Path) -> None:
    # Control: an image sandbox's launch (mounts its root in a namespace of its own, then runs
    # from /) is found by that mount.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount")
    dead = _dead_servers_dir()
    (dead / "sandbox" / "image").mkdir(parents=True)
    mount = 'mount -t tmpfs tmpfs "$0" && cd / && echo mounted && exec sleep 1000'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount]
    with _started([*argv, str(dead / "sandbox" / "image")], stdout=subprocess.PIPE) as launch:
        assert launch.stdout is not None
        assert launch.stdout.readline().strip() == "mounted"
        record_launch(dead / "sandbox", launch.pid)
        with claim_runtime_dir(uuid.uuid4().hex):
            assert not dead.exists()
        assert launch.wait(timeout=60) == -signal.SIGKILL


def test_a_staged_copys_name_cannot_be_worked_out_from_its_sources(
    shared_tmp: Path, tmp_path: Path
) -> None:
    # Attack (a red team's find): a copy is world-readable (each sandbox runs as a uid of its
    # own), so its name hid it, and the name was a digest of what anyone may stat of its
    # sources; a local user read a 0600 file of the agent's from the copy. Now the name mixes
    # in the user's secret: the same sources under another secret are another name.
    source = _agent(tmp_path)
    [first] = staged_binds(None, {str(source): "/.raas/agent"}, own_files=True)
    key = runtime_root() / NAME_KEY
    st = key.lstat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    [again] = staged_binds(None, {str(source): "/.raas/agent"}, own_files=True)
    assert again == first  # control: one secret, one name (the copy is shared)
    key.unlink()
    [other] = staged_binds(None, {str(source): "/.raas/agent"}, own_files=True)
    assert Path(other).parent.name != Path(first).parent.name
