"""Sandboxes whose root is an OCI image's layers (raas.sandbox.rootfs): a copy-on-write overlay
in a mount namespace of the sandbox's own, or the copy fallback.

The ``images`` tests run real bwrap sandboxes on the Debian root filesystem of
scripts/images/make-base-rootfs.sh (``make test-images``) as the bottom layer; the others build
their tiny layers here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from raas.bench.oci_fixtures import base_rootfs_dir
from raas.images.errors import ImageError
from raas.images.image import StoredImage
from raas.sandbox import (
    BwrapConfig,
    LocalConfig,
    SandboxLimits,
    create_sandbox,
    namespaced,
    runtime_root,
)
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.rootfs import (
    ImageRoot,
    check_layers,
    image_python,
    lookup,
    top_entries,
    work_dirs,
)
from raas.tasks.services import TaskServices
from tests.support import tiers
from tests.support.hpc import apptainer_config

MiB = 1024 * 1024
LIMITS = SandboxLimits(action_timeout_s=60, disk_bytes=256 * MiB, start_timeout_s=60)
PATH = "/usr/local/bin:/usr/bin:/bin"
ELF = b"\x7fELF\x02\x01\x01"  # what the python3 of an image must start with


def whiteout(path: Path) -> None:
    """An overlayfs whiteout (a 0/0 character device) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    except PermissionError:
        pytest.skip("cannot make a whiteout (mknod of a 0/0 character device) here")


def layer(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under ``root``: its mode, owner and (files) contents."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        found[str(path.relative_to(root))] = (st.st_mode, st.st_uid, data)
    return found


# -- unit: the layers as overlayfs merges them, the launch's arguments, the errors --------------


@pytest.fixture
def layers(tmp_path: Path) -> tuple[Path, Path]:
    bottom = layer(
        tmp_path / "bottom",
        {"etc/issue": "Debian\n", "etc/keep": "k\n", "data/a": "a", "usr/lib/python3.9/os.py": ""},
    )
    (bottom / "usr/bin").mkdir()
    (bottom / "usr/bin/python3.9").write_bytes(ELF)
    (bottom / "usr/bin/python3.9").chmod(0o755)
    (bottom / "usr/bin/python3").symlink_to("python3.9")
    (bottom / "bin").symlink_to("usr/bin")
    (bottom / "testbed").mkdir()
    (bottom / "proc").mkdir()
    top = layer(tmp_path / "top", {"testbed/pkg/mod.py": "X = 1\n", "work/x": ""})
    whiteout(top / "etc/issue")
    whiteout(top / "data")
    (top / "linked").symlink_to("/etc")
    return bottom, top


def image_of(*layers: Path, workdir: str = "/", env: tuple[str, ...] = ()) -> StoredImage:
    return StoredImage("example.org/swe/repo:1", "sha256:00", tuple(layers), env, workdir)


def test_the_layers_merge_as_overlayfs_does(layers: tuple[Path, Path]) -> None:
    bottom, top = layers
    image = image_of(bottom, top)
    assert lookup(image, "/etc/keep") == bottom / "etc/keep"
    assert lookup(image, "/etc/issue") is None  # the top layer's whiteout hides it
    assert lookup(image, "/data/a") is None  # a whited-out directory hides what is in it
    assert lookup(image, "/testbed/pkg/mod.py") == top / "testbed/pkg/mod.py"
    assert lookup(image, "/bin/python3") == bottom / "usr/bin/python3.9"  # links followed
    assert lookup(image, "/linked/keep") == bottom / "etc/keep"  # absolute: from the image root
    assert lookup(image, "/linked/keep", follow=False) is None
    assert top_entries(image) == {
        "bin": "usr/bin",
        "etc": None,
        "linked": "/etc",
        "proc": None,
        "testbed": None,
        "usr": None,
        "work": None,
    }


def test_an_opaque_directory_hides_the_lower_ones(tmp_path: Path) -> None:
    bottom = layer(tmp_path / "bottom", {"opt/env/old.py": "", "opt/keep": ""})
    top = layer(tmp_path / "top", {"opt/env/new.py": ""})
    try:
        os.setxattr(top / "opt/env", "trusted.overlay.opaque", b"y")
    except OSError:
        pytest.skip("cannot set overlayfs' trusted xattrs here")
    image = image_of(bottom, top)
    assert lookup(image, "/opt/env/new.py") == top / "opt/env/new.py"
    assert lookup(image, "/opt/env/old.py") is None
    assert lookup(image, "/opt/keep") == bottom / "opt/keep"  # only that directory is opaque


def test_the_python_is_read_from_the_layers(layers: tuple[Path, Path], tmp_path: Path) -> None:
    bottom, top = layers
    assert image_python(image_of(bottom, top), "python3", PATH) == ("/usr/bin/python3", (3, 9))
    old = layer(tmp_path / "old", {"usr/lib/python3.6/os.py": ""})
    (old / "usr/bin").mkdir()
    (old / "usr/bin/python3.6").write_bytes(ELF)
    (old / "usr/bin/python3.6").chmod(0o755)
    (old / "usr/bin/python3").symlink_to("python3.6")
    with pytest.raises(ImageError, match=r"example.org/swe/repo:1: .*Python 3\.6; .*3\.8 or newer"):
        image_python(image_of(bottom, old), "python3", PATH)
    gone = tmp_path / "gone"
    whiteout(gone / "usr/bin/python3")
    with pytest.raises(ImageError, match=r"example.org/swe/repo:1: no python3 on its PATH"):
        image_python(image_of(bottom, gone), "python3", PATH)


def test_only_real_directories_are_work_dirs(layers: tuple[Path, Path]) -> None:
    bottom, top = layers
    assert work_dirs(image_of(bottom, top, workdir="/work")) == ["/work", "/testbed"]
    # A link on the way could lead root's chown out of the image: never a work dir.
    assert work_dirs(image_of(bottom, top, workdir="/linked")) == ["/testbed"]
    assert work_dirs(image_of(bottom, top, workdir="/../work/..")) == ["/testbed"]


def test_the_launch_mounts_then_drops_to_the_sandbox_uid(layers: tuple[Path, Path]) -> None:
    bottom, top = layers
    image = image_of(bottom, top, workdir="/work")
    root = ImageRoot(image, Path("/run/sb/image"), 64 * MiB, owner=1_200_003)
    prefix = root.launch_prefix()
    assert prefix[1:6] == ["--mount", "--propagation", "private", "--", "/bin/sh"]
    script_args = prefix[prefix.index("sh") :]
    assert script_args[1:6] == [
        "/run/sb/image",
        f"size={64 * MiB},mode=0755,nosuid,nodev",
        "overlay",
        script_args[4],
        "1200003",
    ]
    # The layers top first, then the directories to chown, then setpriv to the sandbox's uid.
    rest = script_args[6:]
    assert rest[:7] == [str(top), str(bottom), "--", "/work", "/testbed", "--", rest[6]]
    assert rest[6].endswith("setpriv") and rest[7:12] == [
        "--reuid",
        "1200003",
        "--regid",
        "1200003",
        "--clear-groups",
    ]
    rootless = ImageRoot(image, Path("/run/sb/image"), 64 * MiB).launch_prefix()
    assert rootless[1:4] == ["--user", "--map-root-user", "--mount"]
    assert not any(arg.endswith("setpriv") for arg in rootless)
    assert rootless[-4:] == [str(top), str(bottom), "--", "--"]  # nothing to chown
    # Writable binds of the root's entries, but /proc (the sandbox gets bwrap's own).
    assert root.bwrap_args() == [
        *("--symlink", "usr/bin", "/bin"),
        *("--bind", "/run/sb/image/root/etc", "/etc"),
        *("--symlink", "/etc", "/linked"),
        *("--bind", "/run/sb/image/root/testbed", "/testbed"),
        *("--bind", "/run/sb/image/root/usr", "/usr"),
        *("--bind", "/run/sb/image/root/work", "/work"),
    ]


def test_a_missing_layer_is_an_error_naming_it(tmp_path: Path) -> None:
    image = image_of(tmp_path, tmp_path / "sha256-abc")
    with pytest.raises(
        ImageError, match=r"example.org/swe/repo:1: its layer directory .*sha256-abc"
    ):
        check_layers(image)


async def test_an_image_without_python_fails_its_start(tmp_path: Path) -> None:
    # raas would lend it its own Python (tests/sandbox/test_image_python.py), but it has no
    # bash either.
    image = image_of(layer(tmp_path / "only", {"bin/sh": ""}))
    sandbox = create_sandbox(BwrapConfig(limits=LIMITS, runtime_dir=tmp_path), image)
    with pytest.raises(
        ImageError, match=r"example.org/swe/repo:1: .*no python3 on its PATH.* no bash on its PATH"
    ):
        await sandbox.start()
    assert sandbox.closed and not sandbox.dir.exists()


async def test_a_missing_layer_fails_the_start(tmp_path: Path) -> None:
    image = image_of(tmp_path / "gone")
    sandbox = create_sandbox(BwrapConfig(limits=LIMITS, runtime_dir=tmp_path), image)
    with pytest.raises(ImageError, match=r"its layer directory .*gone is missing"):
        await sandbox.start()


def test_local_sandboxes_run_no_images(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="the local provider cannot run images"):
        create_sandbox(LocalConfig(), image_of(tmp_path))


# -- images: real sandboxes on the Debian root filesystem ----------------------------------------


@pytest.fixture
def debian() -> Path:
    root = base_rootfs_dir()
    if not (root / "usr/bin/python3").exists():
        why = f"no Debian root filesystem at {root}: scripts/images/make-base-rootfs.sh builds it"
        if tiers.selected("images"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return root


@pytest.fixture
def swe_image(debian: Path, tmp_path: Path) -> StoredImage:
    top = layer(tmp_path / "layer-top", {"testbed/pkg/mod.py": "X = 1\n", "testbed/README": "r\n"})
    whiteout(top / "etc/issue")
    env = ("PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin", "REPO=example")
    return image_of(debian, top, workdir="/testbed", env=env)


@pytest.fixture(params=["overlay", "copy"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "copy":  # as where the kernel refuses an overlay
        monkeypatch.setattr(namespaced, "overlay_options", lambda rootless: None)
    return str(request.param)


@contextlib.asynccontextmanager
async def started(image: StoredImage, runtime: Path) -> AsyncIterator[BwrapSandbox]:
    sandbox = BwrapSandbox(BwrapConfig(limits=LIMITS, runtime_dir=runtime), image)
    await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A runtime directory of the test's own where the sandbox's uid (raas as root) can
    reach its root (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="images-", dir=runtime_root()))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.images
async def test_a_sandbox_runs_in_its_image(swe_image: StoredImage, runtime: Path, how: str) -> None:
    top = swe_image.layers[-1]
    before = snapshot(top), (swe_image.layers[0] / "etc/issue").read_bytes()
    async with started(swe_image, runtime) as sandbox:
        result = await sandbox.exec(["python3", "-c", "import sys;print(sys.version_info[:2])"])
        assert result.exit_code == 0 and result.stdout.strip() == "(3, 11)"  # Debian's own
        shell = await sandbox.bash("id -u; echo $REPO; echo $PATH; test -e /etc/issue || echo gone")
        lines = shell.output.split()
        assert lines == ["1000", "example", "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin", "gone"]
        # The agent (the sandbox's uid) edits the image's work directory and makes new files.
        edit = await sandbox.bash(
            "echo 'Y = 2' >> /testbed/pkg/mod.py && mkdir /testbed/new && touch /testbed/new/f"
            ' && rm /testbed/README && python3 -c \'import sys; sys.path.insert(0, "/testbed");'
            " import pkg.mod; print(pkg.mod.Y)'"
        )
        assert edit.exit_code == 0, edit.output
        assert edit.output.strip() == "2"
        assert (await sandbox.read_file("/testbed/pkg/mod.py")) == b"X = 1\nY = 2\n"
        # Elsewhere the image stays root's.
        denied = await sandbox.bash("touch /usr/bin/x 2>/dev/null || echo denied")
        assert denied.output.strip() == "denied"
    # The layers on disk never changed.
    assert (snapshot(top), (swe_image.layers[0] / "etc/issue").read_bytes()) == before


@pytest.mark.images
async def test_two_sandboxes_of_one_image_do_not_share_writes(
    swe_image: StoredImage, runtime: Path
) -> None:
    async with started(swe_image, runtime) as one, started(swe_image, runtime) as two:
        await one.bash("echo one > /testbed/pkg/mod.py; echo one > /etc/one")
        seen = await two.bash("cat /testbed/pkg/mod.py; test -e /etc/one && echo leaked")
        assert seen.output.strip() == "X = 1"


@pytest.mark.images
async def test_nothing_is_left_after_close(swe_image: StoredImage, runtime: Path, how: str) -> None:
    async with started(swe_image, runtime) as sandbox:
        assert sandbox.process is not None
        pid = sandbox.process.pid
        mounts = Path(f"/proc/{pid}/mountinfo").read_text()
        # The root is mounted in the sandbox's own mount namespace, not in raas's.
        assert str(sandbox.dir / "image") in mounts
        assert str(sandbox.dir) not in Path("/proc/self/mountinfo").read_text()
        await sandbox.bash("head -c 1000000 /dev/zero > /testbed/big")
        directory = sandbox.dir
    assert not Path(f"/proc/{pid}").exists()
    assert not directory.exists()
    assert sandbox.id not in Path("/proc/self/mountinfo").read_text()
    assert list(runtime.iterdir()) == []


@pytest.mark.images
async def test_a_fork_starts_from_the_parents_root(
    swe_image: StoredImage, runtime: Path, how: str
) -> None:
    top = swe_image.layers[-1]
    before = snapshot(top)
    async with started(swe_image, runtime) as parent:
        await parent.bash(
            "echo 'Y = 2' >> /testbed/pkg/mod.py && rm /testbed/README && mkdir /testbed/new"
            " && touch /testbed/new/f && cd /testbed/new && export STEP=1"
        )
        child = await parent.fork()
        try:
            seen = await child.bash(
                "pwd; echo $STEP; cat /testbed/pkg/mod.py; test -e /testbed/README || echo gone;"
                " test -e /etc/issue || echo gone; id -u; echo z > /testbed/pkg/mod.py && echo ok"
            )
            assert seen.output.split("\n")[:-1] == [
                "/testbed/new",
                "1",
                "X = 1",
                "Y = 2",
                "gone",
                "gone",
                "1000",
                "ok",
            ]
            await parent.bash("echo p > /testbed/p")
            assert (await parent.read_file("/testbed/pkg/mod.py")) == b"X = 1\nY = 2\n"
            assert (await child.bash("test -e /testbed/p || echo unseen")).output == "unseen\n"
            directories = parent.dir, child.dir
        finally:
            await child.close()
        assert (await parent.bash("cat /testbed/new/f /testbed/p")).output == "p\n"
    assert snapshot(top) == before  # the layers on disk never changed
    assert not any(d.exists() for d in directories)
    assert list(runtime.iterdir()) == []


class StandInStore:
    """The image store's API (resolve, in_use), over one image."""

    def __init__(self, image: StoredImage) -> None:
        self.image = image
        self.held: list[str] = []
        self.resolved: list[str] = []

    def resolve(self, ref: str) -> StoredImage:
        self.resolved.append(ref)
        if ref != self.image.ref:
            raise ImageError(f"image {ref}: not in the store")
        return self.image

    @contextlib.contextmanager
    def in_use(self, image: StoredImage) -> Iterator[None]:
        self.held.append(image.ref)
        try:
            yield
        finally:
            self.held.remove(image.ref)


@pytest.mark.images
async def test_a_task_sandbox_of_an_image_holds_it_while_it_runs(
    swe_image: StoredImage, runtime: Path
) -> None:
    store = StandInStore(swe_image)
    config = BwrapConfig(limits=LIMITS, runtime_dir=runtime)
    services = TaskServices(llm=None, sandbox_config=config, image_store=store)  # type: ignore[arg-type]
    sandbox = await services.sandbox(swe_image.ref)
    try:
        assert store.held == [swe_image.ref]
        assert (await sandbox.bash("cat /testbed/pkg/mod.py")).output.strip() == "X = 1"
    finally:
        await sandbox.close()
    assert store.held == []
    with pytest.raises(ImageError, match="image other:1: not in the store"):
        await services.sandbox("other:1")
    await services.close()


@pytest.mark.hpc
async def test_apptainer_runs_an_image_from_its_layers(
    swe_image: StoredImage, runtime: Path
) -> None:
    top = swe_image.layers[-1]
    before = snapshot(top)
    config = apptainer_config(limits=LIMITS, runtime_dir=runtime)
    sandbox = create_sandbox(config, swe_image)
    await sandbox.start()
    try:
        result = await sandbox.exec(["python3", "-c", "import sys;print(sys.version_info[:2])"])
        assert result.stdout.strip() == "(3, 11)"
        shell = await sandbox.bash(
            "echo $REPO; test -e /etc/issue || echo gone; echo 'Y = 2' >> /testbed/pkg/mod.py"
            " && touch /testbed/new && cat /testbed/pkg/mod.py"
        )
        assert shell.output.split() == ["example", "gone", "X", "=", "1", "Y", "=", "2"]
    finally:
        await sandbox.close()
    assert snapshot(top) == before
    assert list(runtime.iterdir()) == []
