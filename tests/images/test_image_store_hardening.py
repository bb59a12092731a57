"""The image store on a shared host (issue 44, classes 1 and 3): nothing of a layer a local user
could use against the host, and layers verified and capped while they stream.

Each attack sits beside its control, which shows that the attack works where the defence is
absent. The unmarked tests build layers by hand with tarfile (``make test``); those that run a
command as another local user need root (``tests.support.unprivileged``: uid 65534). The ``images``
tier pulls real images from a registry on 127.0.0.1 and starts a sandbox from one.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raas.images.errors import ImageError
from raas.images.layers import (
    Caps,
    DigestError,
    LayerError,
    LayerTooLarge,
    Unpacked,
    unpack_layer,
)
from raas.images.manifests import Image, Layer
from raas.images.overlay import is_whiteout
from raas.images.store import HARDENED, ImageStore
from tests.images.test_image_store import GZIP, Blob, _blob, _entry, _layer, _tar
from tests.support.oci_images import (
    Registry,
    base_rootfs,
    build_and_push,
    image_builder,
    make_sif,
    registry,
    require_tools,
)
from tests.support.unprivileged import User, unprivileged_user

ROOT = os.geteuid() == 0
MiB = 1 << 20
BLOCK = 4096
needs_root = pytest.mark.skipif(not ROOT, reason="another local user (setpriv) needs root")
CAP_SETUID = 7
NOTHING = Unpacked()


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    """The attacker: another local user (uid 65534), with a directory it can read
    (``user.shared``, 0755 like the store's folders were)."""
    if not ROOT:
        pytest.skip("another local user (setpriv) needs root")
    with unprivileged_user() as user:
        yield user


def _unpack(
    blob: Blob, dest: Path, caps: Caps | None = None, below: Unpacked = NOTHING
) -> Unpacked:
    return unpack_layer(blob.path, GZIP, blob.digest, blob.diff_id, dest, caps=caps, below=below)


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): os.lstat(p).st_mode
        for p in (root, *root.rglob("*"))
        if not p.is_symlink()
    }


# -- class 1: what a layer makes on the host ---------------------------------------------------


@needs_root
def test_a_set_uid_root_program_of_a_layer_gives_a_local_user_no_root(
    user: User, tmp_path: Path
) -> None:
    program = Path(shutil.which("id") or "/usr/bin/id").read_bytes()
    blob = _layer(
        tmp_path,
        [
            (_entry("bin", tarfile.DIRTYPE), None),
            (_entry("bin/id", mode=0o4755, uid=0, gid=0), program),
            (_entry("bin/gid", mode=0o2755, uid=0, gid=0), program),
        ],
    )
    dest = user.shared / "suid-layer"  # a layer where other users reach it (a 0755 store)
    _unpack(blob, dest)
    for name in ("bin/id", "bin/gid"):
        st = os.lstat(dest / name)
        assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == 0  # the owner is kept
    control = user.shared / "control-id"
    control.write_bytes(program)
    os.chown(control, 0, 0)
    control.chmod(0o6755)
    try:
        # Control: the same program set-uid root by hand makes the user root here (no nosuid).
        assert user.run(str(control), "-u").stdout.split() == ["0"]
        assert user.run(str(control), "-g").stdout.split() == ["0"]
        # Attack: the layer's set-uid-root and set-gid-root program runs as the user.
        assert user.run(str(dest / "bin/id"), "-u").stdout.split() == [str(user.uid)]
        assert user.run(str(dest / "bin/gid"), "-g").stdout.split() == [str(user.uid)]
    finally:
        control.unlink()


@needs_root
def test_a_file_capability_in_a_layer_is_not_set(tmp_path: Path) -> None:
    # A VFS capability (revision 2, effective) granting CAP_SETUID, as `setcap cap_setuid+ep`.
    cap = struct.pack("<IIIII", 0x02000001, 1 << CAP_SETUID, 0, 0, 0)
    info = _entry("bin/tool", mode=0o755)
    info.pax_headers = {"SCHILY.xattr.security.capability": cap.decode("utf-8", "surrogateescape")}
    raw = _tar([(_entry("bin", tarfile.DIRTYPE), None), (info, b"#!/bin/sh\n")])
    blob = _blob(tmp_path, raw)
    dest = tmp_path / "layer"
    _unpack(blob, dest)
    with pytest.raises(OSError) as none:
        os.getxattr(dest / "bin/tool", "security.capability")
    assert none.value.errno == errno.ENODATA
    # Control: GNU tar, told to keep extended attributes, sets it from the same tar.
    if shutil.which("tar") is None:
        return
    control = tmp_path / "control"
    control.mkdir()
    (tmp_path / "layer.tar").write_bytes(raw)
    untar = ["tar", "--xattrs", "--xattrs-include=*", "-xpf", str(tmp_path / "layer.tar")]
    subprocess.run([*untar, "-C", str(control)], check=True, capture_output=True)
    assert os.getxattr(control / "bin/tool", "security.capability") == cap


def test_device_nodes_and_fifos_of_a_layer_are_never_made(tmp_path: Path) -> None:
    blob = _layer(
        tmp_path,
        [
            (_entry("dev", tarfile.DIRTYPE), None),
            (_entry("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0, mode=0o666), None),
            (_entry("dev/mem", tarfile.CHRTYPE, devmajor=1, devminor=1, mode=0o666), None),
            (_entry("run/initctl", tarfile.FIFOTYPE, mode=0o666), None),
            (_entry("dev/README"), b"kept"),
        ],
    )
    dest = tmp_path / "layer"
    _unpack(blob, dest)
    assert (dest / "dev/README").read_bytes() == b"kept"  # control: the layer's file is made
    for name in ("dev/sda", "dev/mem", "run/initctl"):
        assert not os.path.lexists(dest / name), name
    for mode in _modes(dest).values():
        assert stat.S_ISDIR(mode) or stat.S_ISREG(mode)


@needs_root
def test_a_world_writable_directory_of_a_layer_is_not_writable_by_a_local_user(
    user: User,
) -> None:
    blob = _layer(
        user.shared,
        [
            (_entry("tmp", tarfile.DIRTYPE, mode=0o1777), None),
            (_entry("var/tmp", tarfile.DIRTYPE, mode=0o1777), None),
            (_entry("opt/shared", tarfile.DIRTYPE, mode=0o777), None),
            (_entry("opt/group", tarfile.DIRTYPE, mode=0o775, gid=user.uid), None),
            (_entry("etc/data", mode=0o666), b"image's\n"),
        ],
    )
    dest = user.shared / "ww-layer"
    _unpack(blob, dest)
    control = user.shared / "control-tmp"
    control.mkdir()
    control.chmod(0o1777)
    # Control: a 1777 directory made by hand lets the user plant a file.
    assert user.run("touch", str(control / "planted")).returncode == 0
    for directory in ("tmp", "var/tmp", "opt/shared", "opt/group"):
        planted = user.run("touch", str(dest / directory / "planted"))
        assert planted.returncode != 0 and "Permission denied" in planted.stderr, directory
        assert stat.S_IMODE(os.lstat(dest / directory).st_mode) == 0o755
    changed = user.run("sh", "-c", f"echo mine > {dest / 'etc/data'}")
    assert changed.returncode != 0 and (dest / "etc/data").read_text() == "image's\n"
    assert stat.S_IMODE(os.lstat(dest / "etc/data").st_mode) == 0o644
    shutil.rmtree(control)


def test_directories_a_tar_leaves_implicit_are_0755_whatever_the_umask(tmp_path: Path) -> None:
    blob = _layer(tmp_path, [(_entry("usr/lib/deep/file"), b"x")])
    old = os.umask(0)
    try:
        _unpack(blob, tmp_path / "layer")
    finally:
        os.umask(old)
    # Control: tarfile alone makes them 0777 less the umask (here all of it).
    control = tmp_path / "control"
    old = os.umask(0)
    try:
        with tarfile.open(blob.path) as tar:
            tar.extractall(control, filter="fully_trusted")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(control / "usr/lib").st_mode) == 0o777
    for directory in ("", "usr", "usr/lib", "usr/lib/deep"):
        assert stat.S_IMODE(os.lstat(tmp_path / "layer" / directory).st_mode) == 0o755


def test_the_store_root_is_0700_and_made_so_again(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store", group="")
    store.prune()  # makes the store
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    for sub in ("blobs", "layers", "images", "locks", "tmp"):
        assert stat.S_IMODE((store.root / sub).stat().st_mode) == 0o700
    store.root.chmod(0o755)  # as an older raas left it
    with pytest.raises(ImageError, match="not in the image store"):
        store.resolve("swe/x")
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700  # checked, and made so, at each use
    grouped = ImageStore(store.root, group=str(os.getgid()))
    grouped.prune()
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o750
    assert store.root.stat().st_gid == os.getgid()
    assert stat.S_IMODE((store.root / "layers").stat().st_mode) == 0o750
    assert stat.S_IMODE((store.root / "locks").stat().st_mode) == 0o700
    with pytest.raises(ImageError, match="RAAS_IMAGE_STORE_GROUP=no-such-group-here"):
        ImageStore(store.root, group="no-such-group-here").prune()


@needs_root
def test_a_local_user_cannot_enter_the_store_nor_hand_raas_a_store_of_its_own(
    user: User,
) -> None:
    path = user.shared / "store"
    ImageStore(path, group="").prune()
    for folder in (path, path / "layers"):
        folder.chmod(0o755)
    # Control: a store left 0755 (an older raas's) is open to the user.
    assert user.run("ls", str(path / "layers")).returncode == 0
    ImageStore(path, group="").prune()
    denied = user.run("ls", str(path / "layers"))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    # A store another user made (say, first, in a shared /tmp) is refused, not used.
    theirs = user.home / "theirs"
    assert user.run("mkdir", str(theirs)).returncode == 0
    with pytest.raises(ImageError, match=f"belongs to uid {user.uid}, not to raas's user"):
        ImageStore(theirs).prune()
    with pytest.raises(ImageError, match="belongs to uid"):
        ImageStore(theirs).resolve("swe/x")


def test_a_store_an_older_raas_filled_is_made_safe_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    layer = root / "layers" / ("sha256-" + "a" * 64)
    (layer / "tmp").mkdir(parents=True)
    (layer / "tmp").chmod(0o1777)
    (layer / "usr/bin").mkdir(parents=True)
    (layer / "usr/bin/su").write_bytes(b"#!")
    (layer / "usr/bin/su").chmod(0o4755)
    os.mkfifo(layer / "tmp/fifo")
    whiteout = ROOT
    cap = struct.pack("<IIIII", 0x02000001, 1 << CAP_SETUID, 0, 0, 0)
    if whiteout:
        os.mknod(layer / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
        os.setxattr(layer / "usr/bin/su", "security.capability", cap)
    store = ImageStore(root, group="")
    with pytest.raises(ImageError):
        store.resolve("swe/x")
    assert (root / HARDENED).exists()
    assert stat.S_IMODE((layer / "tmp").stat().st_mode) == 0o755
    assert stat.S_IMODE((layer / "usr/bin/su").stat().st_mode) == 0o755
    assert not os.path.lexists(layer / "tmp/fifo")
    if whiteout:  # an overlayfs whiteout stays; a file capability does not
        assert is_whiteout(os.lstat(layer / "gone"))
        assert "security.capability" not in os.listxattr(layer / "usr/bin/su")
    (layer / "tmp").chmod(0o1777)  # once: the mark says it was done
    with pytest.raises(ImageError):
        store.resolve("swe/y")
    assert stat.S_IMODE((layer / "tmp").stat().st_mode) == 0o1777


@needs_root
@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs squashfs-tools")
def test_a_sif_is_imported_as_safely_and_within_the_caps(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    for directory in ("usr/bin", "dev", "tmp"):
        (rootfs / directory).mkdir(parents=True)
    (rootfs / "usr/bin/su").write_bytes(b"#!")
    (rootfs / "usr/bin/su").chmod(0o4755)
    (rootfs / "tmp").chmod(0o1777)
    os.mknod(rootfs / "dev/sda", stat.S_IFBLK | 0o666, os.makedev(8, 0))
    os.mkfifo(rootfs / "dev/fifo")
    sif = make_sif(rootfs, tmp_path / "env.sif")
    small = ImageStore(tmp_path / "store", group="", caps=Caps(layer_entries=3))
    with pytest.raises(ImageError, match=r"goes past 3 entries.*RAAS_LAYER_MAX_ENTRIES"):
        small.import_(sif)
    assert list(small.layer_dir.iterdir()) == []  # refused from its listing: nothing unpacked
    (layer,) = ImageStore(small.root, group="").import_(sif).layers  # control: default caps
    assert (layer / "usr/bin/su").read_bytes() == b"#!"
    assert _unsafe(layer) == []
    assert not os.path.lexists(layer / "dev/sda") and not os.path.lexists(layer / "dev/fifo")


# -- class 3: verified while streaming, capped ------------------------------------------------


def test_a_blob_that_does_not_match_its_digest_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = _layer(tmp_path, [(_entry("zeros"), bytes(4 * MiB))])
    calls: list[str] = []
    real = tarfile.TarFile.extractall

    def spy(self: tarfile.TarFile, *args: object, **kw: object) -> None:
        calls.append("extractall")
        real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(tarfile.TarFile, "extractall", spy)
    store = tmp_path / "layers"
    store.mkdir()
    with pytest.raises(DigestError, match="has digest"):
        unpack_layer(blob.path, GZIP, "sha256:" + "0" * 64, blob.diff_id, store / "layer")
    assert calls == [] and list(store.iterdir()) == []  # refused before a byte was unpacked
    _unpack(blob, store / "layer")  # control: with its own digest it unpacks
    assert calls == ["extractall"] and [p.name for p in store.iterdir()] == ["layer"]


def test_a_tar_that_does_not_match_its_diff_id_is_not_moved_into_place(tmp_path: Path) -> None:
    blob = _layer(tmp_path, [(_entry("a"), b"a")])
    store = tmp_path / "layers"
    store.mkdir()
    with pytest.raises(DigestError, match="not the config's"):
        unpack_layer(blob.path, GZIP, blob.digest, "sha256:" + "0" * 64, store / "layer")
    assert list(store.iterdir()) == []
    _unpack(blob, store / "layer")  # control
    assert (store / "layer/a").read_bytes() == b"a"


def _zeros_layer(tmp: Path, files: int, size: int) -> tuple[Blob, bytes]:
    raw = _tar([(_entry(f"f{i:05}"), bytes(size)) for i in range(files)])
    return _blob(tmp, raw), raw


def test_a_bomb_layer_stops_at_the_cap_with_its_disk_use_bounded(tmp_path: Path) -> None:
    blob, raw = _zeros_layer(tmp_path, files=16, size=MiB)  # 16 MiB of zeros
    assert blob.path.stat().st_size < 64 * 1024  # in a blob of a few KiB
    cap = 4 * MiB
    store = tmp_path / "layers"
    store.mkdir()
    with pytest.raises(LayerTooLarge) as stopped:
        _unpack(blob, store / "layer", Caps(layer_bytes=cap))
    # Stopped while the tar still streamed (not after it), its staging directory never past
    # the cap and one block, and nothing is left.
    assert stopped.value.unpacked.size < len(raw) // 2
    assert cap - MiB < stopped.value.staged_bytes <= cap + BLOCK
    assert list(store.iterdir()) == []
    message = str(stopped.value)
    assert blob.digest in message and "4.0 MiB" in message and "RAAS_LAYER_MAX_BYTES" in message
    assert "one layer's unpacked bytes" in message
    _unpack(blob, store / "layer", Caps(layer_bytes=32 * MiB))  # control: under its cap
    assert len(list((store / "layer").iterdir())) == 16


def test_one_huge_file_is_refused_before_a_byte_of_it_is_written(tmp_path: Path) -> None:
    blob, _ = _zeros_layer(tmp_path, files=1, size=64 * MiB)
    with pytest.raises(LayerTooLarge) as stopped:
        _unpack(blob, tmp_path / "layer", Caps(layer_bytes=8 * MiB))
    assert stopped.value.staged_bytes <= BLOCK  # its header said: nothing of it was made
    assert stopped.value.unpacked.size < 8 * MiB + 64 * 1024
    assert not list(tmp_path.glob("layer*"))


def test_junk_after_the_tars_end_counts_against_the_cap(tmp_path: Path) -> None:
    raw = _tar([(_entry("a"), b"a")])
    blob = _blob(tmp_path, raw + bytes(32 * MiB), "junk")
    with pytest.raises(LayerTooLarge):
        _unpack(blob, tmp_path / "layer", Caps(layer_bytes=4 * MiB))
    assert not list(tmp_path.glob("layer*"))
    _unpack(_blob(tmp_path, raw), tmp_path / "layer", Caps(layer_bytes=4 * MiB))  # control


def test_entries_are_capped_and_implicit_directories_count(tmp_path: Path) -> None:
    many = _layer(tmp_path, [(_entry(f"f{i}"), b"") for i in range(2000)])
    with pytest.raises(LayerTooLarge, match=r"1000 entries.*RAAS_LAYER_MAX_ENTRIES") as stopped:
        _unpack(many, tmp_path / "layer", Caps(layer_entries=1000))
    assert stopped.value.unpacked.entries == 1000  # stopped before the first one past it
    assert not list(tmp_path.glob("layer*"))
    deep = _blob(tmp_path, _tar([(_entry("d/" * 400 + "f"), b"")]), "deep")
    with pytest.raises(LayerTooLarge, match="entries"):
        _unpack(deep, tmp_path / "layer", Caps(layer_entries=100))
    _unpack(many, tmp_path / "layer", Caps(layer_entries=2001))  # control: within its cap


def test_an_images_caps_count_the_layers_below(tmp_path: Path) -> None:
    caps = Caps(layer_bytes=4 * MiB, image_bytes=5 * MiB, image_entries=10_000)
    one = _blob(tmp_path, _tar([(_entry(f"one{i}"), bytes(MiB)) for i in range(3)]), "one")
    two = _blob(tmp_path, _tar([(_entry(f"two{i}"), bytes(MiB)) for i in range(3)]), "two")
    below = _unpack(one, tmp_path / "layer-one", caps)  # control: 3 MiB, under both caps
    assert 3 * MiB < below.size < 4 * MiB and below.entries == 3
    with pytest.raises(LayerTooLarge, match=r"an image's unpacked bytes.*RAAS_IMAGE_MAX_BYTES"):
        _unpack(two, tmp_path / "layer-two", caps, below)
    assert not list(tmp_path.glob("layer-two*"))


def test_caps_come_from_the_environment() -> None:
    env = {
        "RAAS_LAYER_MAX_BYTES": "512M",
        "RAAS_IMAGE_MAX_ENTRIES": "7",
        "RAAS_IMAGE_MAX_BYTES": "",
    }
    assert Caps.from_env(env) == Caps(layer_bytes=512 * MiB, image_entries=7)
    assert Caps.from_env({}) == Caps()
    assert Caps().layer_bytes == 16 << 30 and Caps().layer_entries == 1_000_000
    with pytest.raises(LayerError, match="RAAS_LAYER_MAX_ENTRIES='lots'"):
        Caps.from_env({"RAAS_LAYER_MAX_ENTRIES": "lots"})


def test_a_store_refuses_a_bomb_image_and_keeps_nothing_of_it(tmp_path: Path) -> None:
    """Through the store: an image's layers from an OCI layout's blobs (no skopeo needed)."""
    blob, _ = _zeros_layer(tmp_path, files=16, size=MiB)
    store = ImageStore(tmp_path / "store", group="", caps=Caps(layer_bytes=4 * MiB))
    store.prune()  # makes it
    layer = Layer(digest=blob.digest, diff_id=blob.diff_id, media_type=GZIP)
    dest = store.layer_dir / layer.key
    shutil.copy(blob.path, store.blob_dir / "sha256" / blob.digest.removeprefix("sha256:"))
    image = Image(digest="sha256:" + "1" * 64, config_digest="sha256:" + "2" * 64, layers=(layer,))
    with pytest.raises(LayerTooLarge):
        store._unpack(image, store.caps or Caps())
    assert list(store.layer_dir.iterdir()) == [] and not dest.exists()
    store._unpack(image, Caps())  # control: within the default caps
    assert dest.is_dir() and (store.layer_dir / (layer.key + ".unpacked")).exists()


# -- the images tier: real images, a real registry, a sandbox ----------------------------------


def _unsafe(layer: Path) -> list[str]:
    """What in ``layer`` a local user could use: set-uid/gid bits, group- or world-writable
    entries, device nodes (other than overlayfs whiteouts), FIFOs, sockets."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(layer):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_IMODE(st.st_mode) & 0o7022:
                bad.append(f"{path} {stat.S_IMODE(st.st_mode):o}")
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or is_whiteout(st)):
                bad.append(f"{path} kind {stat.S_IFMT(st.st_mode):o}")
    return bad


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, str, str]]:
    """A registry with an image on the Debian base (set-uid programs, 1777 /tmp, /dev nodes)
    and a bomb image (64 MiB of zeros in one small layer)."""
    require_tools()
    rootfs = base_rootfs()
    work = tmp_path_factory.mktemp("hardening")
    builder = image_builder(tmp_path_factory, work / "layout", rootfs)
    with registry(work) as reg:
        swe = build_and_push(builder, reg, "harden/swe:v1", {"/testbed/a.py": "A = 1\n"}, rootfs)
        zeros = {f"/zeros/{i}": bytes(8 * MiB) for i in range(8)}
        bomb = builder.push(builder.image("bomb", "empty", zeros), reg, "harden/bomb:v1")
        yield reg, swe, bomb


@pytest.mark.images
def test_a_pulled_image_keeps_nothing_a_local_user_could_use(
    pushed: tuple[Registry, str, str], tmp_path: Path
) -> None:
    _, swe, _ = pushed
    base = base_rootfs()
    # Control: the image's own root filesystem has set-uid programs, 1777 dirs and devices.
    assert (base / "usr/bin/passwd").stat().st_mode & stat.S_ISUID
    assert stat.S_IMODE((base / "var/tmp").stat().st_mode) == 0o1777
    assert stat.S_ISCHR(os.lstat(base / "dev/null").st_mode)
    store = ImageStore(tmp_path / "store", group="")
    image = store.pull(swe, tls_verify=False)
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    for layer in image.layers:
        assert _unsafe(layer) == []
    assert (image.layers[0] / "usr/bin/passwd").stat().st_uid == 0  # owners kept


@pytest.mark.images
def test_a_bomb_image_is_refused_at_the_cap_and_a_normal_one_still_runs(
    pushed: tuple[Registry, str, str], tmp_path: Path
) -> None:
    import asyncio

    _, swe, bomb = pushed
    caps = Caps(layer_bytes=16 * MiB)
    store = ImageStore(tmp_path / "store", group="", caps=caps)
    with pytest.raises(ImageError, match="RAAS_LAYER_MAX_BYTES") as refused:
        store.pull(bomb, tls_verify=False)
    assert str(refused.value).startswith(f"cannot pull {bomb}: layer sha256:")
    assert list(store.layer_dir.iterdir()) == [] and store.names() == []
    with pytest.raises(ImageError, match="RAAS_IMAGE_MAX_BYTES"):
        ImageStore(store.root, group="", caps=Caps(image_bytes=64 * MiB)).pull(
            swe, tls_verify=False
        )
    assert store.names() == []
    # Control: a normal image pulls within the default caps and a sandbox starts from it.
    image = ImageStore(store.root, group="").pull(swe, tls_verify=False)
    said = asyncio.run(_sandbox_says(image))
    assert said == ["1000", "tmp-ok", "var-tmp-ok", "A", "=", "1"]


async def _sandbox_says(image: object) -> list[str]:
    import tempfile

    from raas.sandbox import BwrapConfig, SandboxLimits, runtime_root
    from raas.sandbox.bwrap import BwrapSandbox

    runtime = Path(tempfile.mkdtemp(prefix="harden-", dir=runtime_root()))
    runtime.chmod(0o711)
    limits = SandboxLimits(action_timeout_s=60, disk_bytes=256 * MiB, start_timeout_s=60)
    sandbox = BwrapSandbox(BwrapConfig(limits=limits, runtime_dir=runtime), image)  # type: ignore[arg-type]
    try:
        await sandbox.start()
        # The image's /tmp (0755 in the store) is the sandbox's own, writable; its /var/tmp
        # (0755 in the store too) is given to the sandbox's uid, as its work directories are.
        result = await sandbox.bash(
            "id -u; touch /tmp/x && echo tmp-ok; touch /var/tmp/x && echo var-tmp-ok;"
            " cat /testbed/a.py"
        )
        return result.output.split()
    finally:
        await sandbox.close()
        shutil.rmtree(runtime, ignore_errors=True)


# --- a red team's finds: a path that resolves past PATH_MAX, a header held in memory ----------


def _past_path_max(outside: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Links that resolve past PATH_MAX, then ``..`` back up: realpath (before Python 3.11.13)
    took the name too long for the kernel for a plain directory, so the path looked inside the
    layer while the kernel followed the links out of it, to ``outside``."""
    long_dir, steps, entries, path = "d" * 247, "abcdefghijklmnop", [], ""
    for step in steps:
        entries.append((_entry(os.path.join(path, long_dir), tarfile.DIRTYPE), None))
        entries.append((_entry(os.path.join(path, step), tarfile.SYMTYPE, linkname=long_dir), None))
        path = os.path.join(path, long_dir)
    far = os.path.join(*steps, "l" * 254)
    entries.append((_entry(far, tarfile.SYMTYPE, linkname="../" * len(steps)), None))
    up = far + "/.." * (len(steps) + 1)
    entries.append((_entry("escape", tarfile.SYMTYPE, linkname=up), None))
    entries.append((_entry("escape/" + str(outside / "pwned").lstrip("/")), b"owned"))
    return entries


def test_a_path_that_resolves_past_path_max_writes_nothing_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = tmp_path / "layers"
    store.mkdir()
    with pytest.raises(LayerError, match="resolves past"):
        _unpack(_layer(tmp_path, _past_path_max(outside)), store / "layer")
    assert list(outside.iterdir()) == [] and list(store.iterdir()) == []
    # Control: the same links without the long names resolve inside and unpack.
    short = [
        (_entry("d", tarfile.DIRTYPE), None),
        (_entry("a", tarfile.SYMTYPE, linkname="d"), None),
    ]
    _unpack(_layer(tmp_path, [*short, (_entry("a/f"), b"in")]), store / "ok")
    assert (store / "ok/d/f").read_bytes() == b"in"


def test_a_long_name_header_is_refused_before_it_is_read_into_memory(tmp_path: Path) -> None:
    """A GNU long name of 64 MiB (tarfile reads a header's data whole, before any filter sees
    the member): refused from its size, before it is read."""
    header = _entry("././@LongLink", tarfile.GNUTYPE_LONGNAME)
    header.size = 64 << 20
    raw = header.tobuf(format=tarfile.GNU_FORMAT) + b"a" * (64 << 20)
    raw += _entry("x").tobuf(format=tarfile.GNU_FORMAT) + bytes(1024)
    blob = _blob(tmp_path, raw)
    with pytest.raises(LayerError, match="a header of the layer holds 67108864 bytes"):
        _unpack(blob, tmp_path / "layer")
    assert not (tmp_path / "layer").exists()
    # Control: a long name of an ordinary length (a pax header) unpacks.
    name = "/".join(["n" * 60] * 5)
    _unpack(_layer(tmp_path, [(_entry(name), b"ok")]), tmp_path / "ok")
    assert (tmp_path / "ok" / name).read_bytes() == b"ok"
