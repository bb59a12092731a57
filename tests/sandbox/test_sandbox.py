"""Real sandboxes: tools, limits, isolation, cleanup.

Every behavioural test runs on bubblewrap and, under ``-m hpc`` (``make test-hpc``), on Apptainer
with a sandbox directory and with a SIF: the same tests, through the ``config`` fixture.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import socket
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from raas.sandbox import (
    ApptainerConfig,
    BwrapConfig,
    LocalConfig,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxPool,
    ToolError,
    create_sandbox,
    procs,
    runtime_root,
    sandbox_config,
    zygote,
)
from raas.sandbox.apptainer import ApptainerSandbox
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.client import PROTOCOL, ActionClient
from raas.sandbox.local import LocalSandbox
from tests.support.hpc import apptainer_config

MiB = 1024 * 1024
LIMITS = SandboxLimits(
    action_timeout_s=30,
    max_output_bytes=8192,
    memory_bytes=1024 * MiB,
    max_processes=64,
    disk_bytes=64 * MiB,
)


def host_processes() -> set[int]:
    """Every live process but the zygotes' (which outlive the sandboxes they fork)."""
    return {
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and procs.alive(int(p.name))
    } - zygote.own_pids()


@pytest.fixture(
    params=[
        pytest.param("bwrap"),
        pytest.param("raas-test", id="apptainer-dir", marks=pytest.mark.hpc),
        pytest.param("raas-test.sif", id="apptainer-sif", marks=pytest.mark.hpc),
    ]
)
def config(request: pytest.FixtureRequest) -> BwrapConfig | ApptainerConfig:
    if request.param == "bwrap":
        return BwrapConfig(limits=LIMITS)
    return apptainer_config(image=request.param, limits=LIMITS)


@pytest.fixture
async def sandbox(config: BwrapConfig | ApptainerConfig) -> AsyncIterator[Sandbox]:
    sb = create_sandbox(config)
    await sb.start()
    yield sb
    await sb.close()


async def test_shell_state_persists_between_calls(sandbox: Sandbox) -> None:
    await sandbox.bash("mkdir -p /tmp/deep/er && cd /tmp/deep/er && export GREETING=hello")
    await sandbox.bash('remember() { echo "remembered $1"; }; sleep 300 &')
    state = await sandbox.bash("pwd; echo $GREETING; remember it; jobs | wc -l")
    assert state.output == "/tmp/deep/er\nhello\nremembered it\n1\n"
    assert (await sandbox.bash("exit_with() { return $1; }; exit_with 7")).exit_code == 7


async def test_the_shells_terminal_neither_echoes_nor_wraps(sandbox: Sandbox) -> None:
    # What raas types is not read back, "\n" stays "\n" and programs that fit their output to
    # the terminal see 1000 columns; after a restart of the shell too.
    for _ in range(2):
        out = (await sandbox.bash("stty -a")).output
        assert "columns 1000;" in out and " -echo " in out and " -onlcr" in out, out
        assert (await sandbox.bash("printf 'a\\nb\\n'")).output == "a\nb\n"
        await sandbox.bash("exit")


async def test_a_command_that_never_ends_is_interrupted_and_the_shell_lives(
    sandbox: Sandbox,
) -> None:
    await sandbox.bash("export KEPT=yes")
    # 2 s, not less: "started" must be out before the deadline on a loaded machine too.
    slow = await sandbox.bash("echo started; sleep 1000; echo never", timeout_s=2)
    assert slow.timed_out and "started" in slow.output and "never" not in slow.output
    assert slow.exit_code == 130
    stubborn = await sandbox.bash("bash -c \"trap '' INT; sleep 1000\"", timeout_s=0.3)
    assert stubborn.timed_out and stubborn.exit_code == 137  # SIGINT ignored: SIGKILL
    after = await sandbox.bash("echo $KEPT")
    assert after.output == "yes\n" and not after.timed_out and not after.shell_restarted


async def test_huge_output_is_cut_keeping_head_and_tail(sandbox: Sandbox) -> None:
    result = await sandbox.bash("seq 1 200000")
    total = len("\n".join(str(i) for i in range(1, 200001))) + 1
    assert result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("199999\n200000\n")
    assert result.output_cut_bytes == total - 8192
    assert f"[... {total - 8192} bytes of output cut" in result.output
    assert len(result.output) < 8192 + 200


async def test_exit_restarts_the_shell_and_says_so(sandbox: Sandbox) -> None:
    await sandbox.bash("export GONE=1")
    result = await sandbox.bash("exit 3")
    assert result.shell_restarted and result.note is not None
    after = await sandbox.bash("echo ${GONE:-unset}")
    assert after.output == "unset\n"


async def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    before = host_processes()
    await sandbox.bash(":(){ :|:& };:", timeout_s=3)
    assert LIMITS.max_processes is not None
    assert len(sandbox.host_pids()) <= LIMITS.max_processes  # the limit held
    alive = await sandbox.bash("echo alive", timeout_s=60)  # generous: the bomb's wreck may linger
    assert not alive.timed_out, "the shell did not answer within 60 s of the fork bomb"
    assert "alive" in alive.output
    namespaces = {procs.pid_namespace(p) for p in sandbox.host_pids()} - {None}
    await sandbox.close()
    # Of the processes new since, none is the sandbox's or this test's (others share the host).
    new = host_processes() - before
    ours = procs.descendants(os.getpid())
    assert {p for p in new if procs.pid_namespace(p) in namespaces or p in ours} == set()


async def test_memory_hog_is_stopped(sandbox: Sandbox) -> None:
    hog = await sandbox.bash("python3 -c 'x = bytearray(4 * 1024**3); print(\"got it\")'")
    assert hog.exit_code != 0 and "MemoryError" in hog.output
    assert (await sandbox.bash("echo fine")).output == "fine\n"


async def test_workspace_disk_is_capped(sandbox: Sandbox) -> None:
    one_file = await sandbox.bash("head -c 100M /dev/zero > /workspace/big")
    assert "File size limit exceeded" in one_file.output  # no file larger than the disk
    many = await sandbox.bash("for i in 1 2 3; do head -c 30M /dev/zero > /workspace/f$i; done")
    assert "No space left on device" in many.output
    size, used = (
        await sandbox.bash("df -B1 --output=size,used /workspace | tail -1")
    ).output.split()
    assert int(size) == 64 * MiB and int(used) <= int(size)


async def test_no_network_and_no_host_files(sandbox: Sandbox, tmp_path: Path) -> None:
    marker = Path.home() / f"raas-marker-{os.getpid()}"
    marker.write_text("secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        interfaces = await sandbox.bash("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert interfaces.output == "lo\n"
        connect = await sandbox.bash(
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'"
        )
        assert connect.exit_code != 0 and "ConnectionRefused" in connect.output
        # Nor raas's runtime directory, where every sandbox's socket and files are.
        read = await sandbox.bash(
            f"cat {marker}; ls {Path.home()} {Path.cwd()} {tmp_path} {runtime_root()}"
        )
        assert "secret" not in read.output and read.exit_code != 0
        assert "No such file or directory" in read.output
    finally:
        marker.unlink()
        listener.close()


async def test_close_kills_every_process_of_that_sandbox_and_no_other(
    config: BwrapConfig | ApptainerConfig,
) -> None:
    a, b = create_sandbox(config), create_sandbox(config)
    await asyncio.gather(a.start(), b.start())
    try:
        for sb in (a, b):
            await sb.bash("sleep 1000 & (setsid sleep 1001 &) ; nohup sleep 1002 >/dev/null 2>&1 &")
        a_pids, b_pids = a.host_pids(), b.host_pids()
        assert len(a_pids) >= 5 and len(b_pids) >= 5 and not a_pids & b_pids
        await a.close()
        await a.close()  # idempotent
        assert not any(procs.alive(p) for p in a_pids)
        assert all(procs.alive(p) for p in b_pids)
        assert not a.dir.exists() and b.socket_path.exists()
        assert (await b.bash("echo b lives")).output == "b lives\n"
    finally:
        await b.close()
    assert not any(procs.alive(p) for p in b_pids)


UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork"]


def test_a_pinned_namespace_keeps_its_number_after_its_processes_died() -> None:
    """The kernel gives a freed namespace's number to the next namespace made (often the very
    next); a sandbox closing by "kill everything in namespace N" then killed a sandbox that had
    just started in the reused N. Pinned (as a sandbox pins its own until closed), N stays taken.
    """
    holder = subprocess.Popen([*UNSHARE, "sleep", "100"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # a safety net: the child comes in milliseconds
        while not (children := procs.children_of(holder.pid)):
            assert time.monotonic() < deadline, "unshare's child never came"
            time.sleep(0.01)
        number = procs.pid_namespace(children[0])
        assert number is not None
        pin = procs.pin_namespace(number, holder.pid)
        assert pin is not None
    finally:
        procs.kill(set(procs.children_of(holder.pid)))
        holder.wait(10)
    try:
        made = []
        for _ in range(10):  # new namespaces, each reading its own number
            out = subprocess.run(
                [*UNSHARE, "readlink", "/proc/self/ns/pid"],
                text=True,
                capture_output=True,
                timeout=10,
            ).stdout
            made.append(int(out.strip().removeprefix("pid:[").removesuffix("]")))
        assert number not in made
    finally:
        os.close(pin)


async def test_editor(sandbox: Sandbox) -> None:
    await sandbox.editor("create", "pkg/mod.py", file_text="a = 1\nb = 2\na = 1\n")
    with pytest.raises(ToolError, match="already exists"):
        await sandbox.editor("create", "pkg/mod.py", file_text="")
    with pytest.raises(ToolError, match=r"occurs 2 times .* \(at lines 1, 3\)"):
        await sandbox.editor("str_replace", "pkg/mod.py", old_str="a = 1", new_str="c = 3")
    with pytest.raises(ToolError, match="does not occur"):
        await sandbox.editor("str_replace", "pkg/mod.py", old_str="zzz", new_str="")
    out = await sandbox.editor("str_replace", "pkg/mod.py", old_str="b = 2", new_str="b = 20")
    assert "2\tb = 20" in out
    await sandbox.editor("insert", "pkg/mod.py", insert_line=0, new_str="# top")
    view = await sandbox.editor("view", "pkg/mod.py", view_range=[1, 2])
    assert view == "1\t# top\n2\ta = 1"
    await sandbox.editor("undo_edit", "pkg/mod.py")
    await sandbox.editor("undo_edit", "pkg/mod.py")
    assert await sandbox.read_file("/workspace/pkg/mod.py") == b"a = 1\nb = 2\na = 1\n"
    listing = await sandbox.editor("view", "/workspace")
    assert "/workspace/pkg/mod.py" in listing


async def test_files_upload_download(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "repo"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.bin").write_bytes(bytes(range(256)))
    (src / "README").write_text("hello")
    await sandbox.upload(src, "/workspace")
    listing = await sandbox.bash("cd /workspace/repo && find . -type f | sort")
    assert listing.output == "./README\n./sub/data.bin\n"
    await sandbox.write_file("/workspace/repo/new.txt", "made inside")
    out = tmp_path / "back"
    await sandbox.download("/workspace/repo", out)
    assert (out / "repo" / "sub" / "data.bin").read_bytes() == bytes(range(256))
    assert (out / "repo" / "new.txt").read_text() == "made inside"
    assert await sandbox.read_file("/workspace/repo/sub/data.bin") == bytes(range(256))


async def test_a_download_or_a_read_leaves_out_what_it_skips_and_refuses_more_than_its_bytes(
    sandbox: Sandbox,
) -> None:
    """A SWE image's /testbed carries its whole git history: the judge asks for the files alone,
    and a tree over the cap is refused in the sandbox, not packed and sent."""
    await sandbox.bash(
        "mkdir -p /workspace/t/.git/objects /workspace/t/pkg/__pycache__ && cd /workspace/t"
        " && head -c 3000 /dev/urandom > .git/objects/pack && echo 'a = 1' > pkg/mod.py"
        " && echo x > pkg/__pycache__/mod.cpython-311.pyc && echo y > pkg/old.pyc"
    )
    skip = [".git", "__pycache__", "*.pyc"]
    got = await sandbox.call("download", path="/workspace/t", skip=skip)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(got["tar_b64"]))) as tar:
        assert sorted(tar.getnames()) == ["t", "t/pkg", "t/pkg/mod.py"]
    everything = await sandbox.call("download", path="/workspace/t")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(everything["tar_b64"]))) as tar:
        assert "t/.git/objects/pack" in tar.getnames()  # nothing skipped unless asked
    await sandbox.call("download", path="/workspace/t", skip=skip, max_bytes=6)  # mod.py's 6
    with pytest.raises(ToolError, match="more than 5 bytes"):
        await sandbox.call("download", path="/workspace/t", skip=skip, max_bytes=5)
    with pytest.raises(ToolError, match="skip must be a list"):
        await sandbox.call("download", path="/workspace/t", skip=".git")
    # A file likewise: the judges read an agent's answer or solution with a cap of their own.
    assert await sandbox.read_file("/workspace/t/pkg/mod.py", max_bytes=6) == b"a = 1\n"
    with pytest.raises(ToolError, match="6 bytes, more than the limit of 5"):
        await sandbox.read_file("/workspace/t/pkg/mod.py", max_bytes=5)


async def test_ipython_keeps_state_and_reports_tracebacks(sandbox: Sandbox) -> None:
    first = await sandbox.ipython("import math\nx = 6 * 7\nprint('side')\nx")
    assert first.result == "42" and first.stdout == "side\n" and first.error is None
    second = await sandbox.ipython("math.sqrt(x * x)")
    assert second.result == "42.0"
    boom = await sandbox.ipython("def f():\n    return 1 / 0\nf()")
    assert boom.error is not None and boom.error["ename"] == "ZeroDivisionError"
    assert "return 1 / 0" in boom.error["traceback"]
    slow = await sandbox.ipython("import time\ntime.sleep(100)", timeout_s=1)
    assert slow.timed_out and slow.error is not None
    assert (await sandbox.ipython("x")).result == "42"  # interrupted, not restarted


async def test_fifty_concurrent_sandboxes_stay_isolated(
    config: BwrapConfig | ApptainerConfig,
) -> None:
    sandboxes = [create_sandbox(config) for _ in range(50)]
    all_pids: list[set[int]] = []
    await asyncio.gather(*(sb.start() for sb in sandboxes))
    try:
        await asyncio.gather(
            *(
                sb.bash(f"echo {i} > /workspace/mine; echo {i} > /tmp/mine")
                for i, sb in enumerate(sandboxes)
            )
        )
        seen = await asyncio.gather(
            *(sb.bash("cat /workspace/mine /tmp/mine; ls /workspace /tmp") for sb in sandboxes)
        )
        for i, result in enumerate(seen):  # each sees its own files and no one else's
            assert result.output.split() == [str(i), str(i), "/tmp:", "mine", "/workspace:", "mine"]
        all_pids = [sb.host_pids() for sb in sandboxes]
        assert sum(len(p) for p in all_pids) == len(set().union(*all_pids))
    finally:
        await asyncio.gather(*(sb.close() for sb in sandboxes))
    assert all(sb.host_pids() == set() for sb in sandboxes)
    # Nothing left on the host: no sandbox process, no launcher, no mount, no files.
    assert not any(procs.alive(p) for pids in all_pids for p in pids)
    left = procs.descendants(os.getpid()) - zygote.own_pids()  # zygotes outlive sandboxes
    assert {p for p in left if procs.alive(p)} == set()
    assert str(runtime_root()) not in Path("/proc/self/mountinfo").read_text()
    assert not any(sb.dir.exists() for sb in sandboxes)


async def test_warm_pool_hands_out_started_sandboxes_and_refills(
    config: BwrapConfig | ApptainerConfig,
) -> None:
    pool = SandboxPool(config, size=2)
    pool.fill()
    await pool.wait_filled()
    assert pool.ready == 2
    sb = await pool.acquire()
    try:
        assert (await sb.bash("echo warm")).output == "warm\n"
        await pool.wait_filled()
        assert pool.ready == 2
    finally:
        await sb.close()
        await pool.close()
    assert pool.ready == 0


async def test_local_provider_warns_loudly(capfd: pytest.CaptureFixture[str]) -> None:
    async with create_sandbox(LocalConfig(limits=LIMITS)) as sb:
        assert (await sb.bash("echo local")).output == "local\n"
        pids = sb.host_pids()
    assert "NO isolation" in capfd.readouterr().err
    assert not any(procs.alive(p) for p in pids)


async def test_a_missing_image_is_a_clear_error(tmp_path: Path) -> None:
    sb = create_sandbox(BwrapConfig(image=tmp_path / "nope", limits=LIMITS))
    with pytest.raises(Exception, match="is not a directory"):
        await sb.start()
    assert sb.closed and not sb.dir.exists()


def test_a_config_names_and_creates_its_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAAS_APPTAINER_IMAGE", "from-env.sif")
    bwrap, local, apptainer = (sandbox_config(n) for n in ("bwrap", "local", "apptainer"))
    assert bwrap == BwrapConfig() and local == LocalConfig()
    assert isinstance(apptainer, ApptainerConfig) and apptainer.image == "from-env.sif"
    assert isinstance(create_sandbox(bwrap), BwrapSandbox)
    assert isinstance(create_sandbox(local), LocalSandbox)
    assert isinstance(create_sandbox(apptainer), ApptainerSandbox)
    with pytest.raises(
        ValueError, match=r"unknown sandbox type 'docker': .* bwrap, local, apptainer"
    ):
        sandbox_config("docker")


async def test_bwrap_and_apptainer_sandboxes_never_share_a_host_uid() -> None:
    bwrap, apptainer = create_sandbox(BwrapConfig()), create_sandbox(ApptainerConfig(image="x"))
    assert isinstance(bwrap, BwrapSandbox) and isinstance(apptainer, ApptainerSandbox)
    try:
        first = bwrap._sandbox_uid()
        assert first != apptainer._sandbox_uid()
    finally:
        await bwrap.close()
        await apptainer.close()
    again = create_sandbox(BwrapConfig())
    assert isinstance(again, BwrapSandbox)
    assert again._sandbox_uid() == first  # close gave the slots back (a zygote may hold one)
    await again.close()


async def test_a_silent_action_server_is_an_error_naming_its_socket(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    connections: list[asyncio.StreamWriter] = []

    async def hello_then_nothing(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        if len(connections) > 1:
            writer.write(b'{"hello": {"protocol": %d}}\n' % PROTOCOL)

    server = await asyncio.start_unix_server(hello_then_nothing, str(path))
    try:
        with pytest.raises(SandboxError, match=re.escape(f"{path} sent no hello within 0.2 s")):
            await ActionClient.connect(path, timeout_s=0.2)
        client = await ActionClient.connect(path, timeout_s=5)
        try:
            with pytest.raises(SandboxError, match=r"did not answer bash within 0\.2 s"):
                await client.call("bash", {"command": "true"}, deadline_s=0.2)
        finally:
            await client.close()
    finally:
        for writer in connections:
            writer.close()
        server.close()
