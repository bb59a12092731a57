"""The OCI image store: layers unpacked once and shared, whiteouts, safety, locks, prune, the
size cap, errors as one line, and ``raas images``.

The unmarked tests build layers by hand with tarfile and run in ``make test``; the ``images``
tier (``make test-images``) builds small real images with umoci, serves them from a real
registry on 127.0.0.1 and pulls them with skopeo.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.cli import main
from raas.cli.images import dataset_images
from raas.images.errors import ImageError
from raas.images.layers import DigestError, LayerError, unpack_layer
from raas.images.refs import normalize
from raas.images.store import ImageStore, default_store_dir
from tests.support.oci_images import (
    ImageBuilder,
    Registry,
    base_rootfs,
    build_and_push,
    image_builder,
    make_sif,
    registry,
    require_tools,
)

ROOT = os.geteuid() == 0
GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


# -- hand-built layers ---------------------------------------------------------------------


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in kw.items():
        setattr(info, key, value)
    return info


@dataclass
class Blob:
    path: Path
    digest: str
    diff_id: str


def _blob(tmp: Path, raw: bytes, name: str = "blob") -> Blob:
    packed = gzip.compress(raw, mtime=0)
    path = tmp / name
    path.write_bytes(packed)
    return Blob(
        path=path,
        digest="sha256:" + hashlib.sha256(packed).hexdigest(),
        diff_id="sha256:" + hashlib.sha256(raw).hexdigest(),
    )


def _unpack(blob: Blob, dest: Path) -> None:
    unpack_layer(blob.path, GZIP, blob.digest, blob.diff_id, dest)


def _layer(tmp: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> Blob:
    return _blob(tmp, _tar(entries))


@pytest.mark.skipif(not ROOT, reason="whiteouts (0/0 devices) and trusted xattrs need root")
def test_whiteouts_become_overlayfs_whiteouts_and_hard_links_stay_links(tmp_path: Path) -> None:
    blob = _layer(
        tmp_path,
        [
            (_entry("etc", tarfile.DIRTYPE), None),
            (_entry("etc/.wh.issue"), b""),
            (_entry("opt", tarfile.DIRTYPE), None),
            (_entry("opt/.wh..wh..opq"), b""),
            (_entry("opt/one"), b"data"),
            (_entry("opt/two", tarfile.LNKTYPE, linkname="opt/one"), None),
            (_entry("dev", tarfile.DIRTYPE), None),
            (_entry("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3), None),
            (_entry("tmp", tarfile.DIRTYPE, mode=0o1777), None),
            (_entry("usr/bin/su", mode=0o4755), b"#!"),
        ],
    )
    dest = tmp_path / "layer"
    _unpack(blob, dest)
    st = os.lstat(dest / "etc/issue")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert not (dest / "etc/.wh.issue").exists()
    assert os.getxattr(dest / "opt", "trusted.overlay.opaque") == b"y"
    assert not (dest / "opt/.wh..wh..opq").exists()
    assert os.stat(dest / "opt/one").st_ino == os.stat(dest / "opt/two").st_ino
    assert not (dest / "dev/null").exists()  # device nodes are the sandbox's own
    # Masked on the host (tests/images/test_image_store_hardening.py); the sandbox's /tmp is
    # its own.
    assert stat.S_IMODE(os.stat(dest / "tmp").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "usr/bin/su").st_mode) == 0o755
    assert not dest.with_name("layer.partial").exists()


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([(_entry("../evil"), b"x")], "outside"),
        ([(_entry("a/../../evil"), b"x")], "outside"),
        (
            [(_entry("esc", tarfile.SYMTYPE, linkname="/"), None), (_entry("esc/tmp/x"), b"x")],
            "outside",
        ),
        (
            [
                (_entry("up", tarfile.SYMTYPE, linkname="../../.."), None),
                (_entry("up/evil"), b"x"),
            ],
            "outside",
        ),
        ([(_entry("pw", tarfile.LNKTYPE, linkname="../../etc/passwd"), None)], "hard link"),
    ],
    ids=[
        "dotdot",
        "nested-dotdot",
        "through-absolute-symlink",
        "through-relative-symlink",
        "hardlink-out",
    ],
)
def test_unsafe_members_fail_the_layer_and_leave_nothing(
    tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]], why: str
) -> None:
    blob = _layer(tmp_path, entries)
    dest = tmp_path / "store" / "layer"
    dest.parent.mkdir()
    with pytest.raises(LayerError, match=why):
        _unpack(blob, dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == []
    assert not (tmp_path / "evil").exists()


def test_absolute_symlinks_are_kept_for_the_sandbox_to_resolve(tmp_path: Path) -> None:
    blob = _layer(
        tmp_path,
        [
            (_entry("usr/bin", tarfile.DIRTYPE), None),
            (_entry("usr/bin/python", tarfile.SYMTYPE, linkname="/usr/bin/python3"), None),
            (_entry("/etc/hostname"), b"box"),  # a leading slash is the archive's root
        ],
    )
    _unpack(blob, tmp_path / "layer")
    assert os.readlink(tmp_path / "layer/usr/bin/python") == "/usr/bin/python3"
    assert (tmp_path / "layer/etc/hostname").read_text() == "box"


def test_a_blob_or_tar_that_does_not_match_its_digest_leaves_no_layer(tmp_path: Path) -> None:
    blob = _layer(tmp_path, [(_entry("a"), b"a")])
    dest = tmp_path / "layer"
    with pytest.raises(DigestError, match="has digest"):
        unpack_layer(blob.path, GZIP, "sha256:" + "0" * 64, blob.diff_id, dest)
    with pytest.raises(DigestError, match="not the config's"):
        unpack_layer(blob.path, GZIP, blob.digest, "sha256:" + "0" * 64, dest)
    blob.path.write_bytes(blob.path.read_bytes()[:-12] + b"\0" * 12)  # a damaged gzip trailer
    with pytest.raises(DigestError):
        _unpack(blob, dest)
    assert list(tmp_path.glob("layer*")) == []


def test_a_layer_killed_mid_unpack_leaves_only_a_partial_that_the_next_try_replaces(
    tmp_path: Path,
) -> None:
    """A process SIGKILLed while unpacking (its blob arrives through a FIFO we stop feeding)."""
    size = 1 << 16
    raw = _tar([(_entry("first"), b"1" * size), (_entry("second"), b"2" * size)])
    whole = _blob(tmp_path, raw, "whole")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dest = tmp_path / "layer"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from raas.images.layers import"
            " unpack_layer as u; u(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4],"
            " Path(sys.argv[5]))",
            str(fifo),
            "application/vnd.oci.image.layer.v1.tar",
            "sha256:" + hashlib.sha256(raw).hexdigest(),
            whole.diff_id,
            str(dest),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    try:
        with open(fifo, "wb") as feed:
            # The first member and some of the second (readers ask for whole 10 kB records).
            feed.write(raw[: 512 + size + 512 + 20480])
            feed.flush()
            partial_first = tmp_path / "layer.partial" / "first"
            deadline = time.monotonic() + 30
            while not (partial_first.exists() and partial_first.stat().st_size == size):
                assert child.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
            child.send_signal(signal.SIGKILL)
            child.wait()
    except BrokenPipeError:
        pass
    assert not dest.exists() and (tmp_path / "layer.partial").exists()
    unpack_layer(whole.path, GZIP, whole.digest, whole.diff_id, dest)
    assert (dest / "second").read_bytes() == b"2" * size
    assert not (tmp_path / "layer.partial").exists()


def test_a_tar_without_its_end_blocks_unpacks_as_go_readers_take_it(tmp_path: Path) -> None:
    """umoci 0.4's insert ends a layer right after the last file's data."""
    raw = _tar([(_entry("testbed", tarfile.DIRTYPE), None), (_entry("testbed/a.py"), b"A = 1\n")])
    cut = raw[: 2 * 512 + 6]
    _unpack(_blob(tmp_path, cut), tmp_path / "layer")
    assert (tmp_path / "layer/testbed/a.py").read_text() == "A = 1\n"


@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs squashfs-tools")
def test_a_sif_is_imported_as_one_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "testbed").mkdir(parents=True)
    (rootfs / "testbed/a.py").write_text("A = 1\n")
    sif = make_sif(rootfs, tmp_path / "env.sif")
    store = ImageStore(tmp_path / "store")
    image = store.import_(sif)
    assert image.ref == "docker.io/library/env:latest"
    assert len(image.layers) == 1
    assert (image.layers[0] / "testbed/a.py").read_text() == "A = 1\n"
    assert store.import_(sif, "other/name:v1").layers == image.layers  # unpacked once
    store.remove("env")
    store.remove("other/name:v1")
    assert list((store.root / "layers").iterdir()) == []
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(ImageError, match=r"cannot import .*env.sif .*squashfs-tools"):
        store.import_(sif)


def test_refs_are_normalised_as_docker_does() -> None:
    assert normalize("ubuntu") == "docker.io/library/ubuntu:latest"
    assert normalize("swebench/x:v1") == "docker.io/swebench/x:v1"
    assert normalize("127.0.0.1:5000/a/b") == "127.0.0.1:5000/a/b:latest"
    assert normalize("ghcr.io/a/b@sha256:" + "0" * 64) == "ghcr.io/a/b@sha256:" + "0" * 64
    with pytest.raises(ValueError):
        normalize("no spaces please")


def test_an_unknown_image_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=r"raas images pull swebench/x$") as e:
        ImageStore(tmp_path).resolve("swebench/x")
    assert "\n" not in str(e.value)


def test_prune_removes_what_killed_pulls_left(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    (store.root / "layers" / ("sha256-" + "a" * 64 + ".partial") / "etc").mkdir(parents=True)
    (store.root / "tmp" / "copy-x" / "blobs").mkdir(parents=True)
    (store.root / "blobs" / "sha256").mkdir(parents=True)
    (store.root / "blobs" / "sha256" / ("b" * 64)).write_bytes(b"orphan")
    result = store.prune()
    assert result.blobs == 1
    assert [p for p in (store.root / "layers").iterdir()] == []
    assert [p for p in (store.root / "tmp").iterdir()] == []
    assert [p for p in (store.root / "blobs/sha256").iterdir()] == []


def test_the_default_store_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAAS_IMAGE_STORE", raising=False)
    monkeypatch.setenv("RAAS_CACHE_DIR", "/cache")
    assert default_store_dir() == Path("/cache/oci")
    monkeypatch.setenv("RAAS_IMAGE_STORE", "/store")
    assert default_store_dir() == Path("/store")


def test_prefetch_finds_the_images_of_task_rows_and_jobs() -> None:
    rows = [
        {"data_source": "swe", "image_name": "a/b:1"},
        {"instance": {"data_source": "swe", "docker_image": "c/d"}},
        {"data_source": "swe", "image_name": "a/b:1"},
        {"data_source": "swe", "extra_info": {"image_name": "e/f"}},
        {"data_source": "math", "instance_id": "gsm8k-1"},
        {"instance_id": "getmoto__moto-5752", "repo": "getmoto/moto", "base_commit": "abc"},
    ]
    # A SWE-Gym row names no image: SWE-Gym's own name for it, as the swe task runs it.
    swe_gym = "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    assert dataset_images(rows) == ["a/b:1", "c/d", "e/f", swe_gym]


# -- real images, a real registry (make test-images) ------------------------------------------


@dataclass
class Images:
    reg: Registry
    builder: ImageBuilder
    a: str  # base + /testbed/a.py
    b: str  # base + /testbed/b.py
    c: str  # base + a layer that removes /etc/issue and holds a hard link
    small: list[str]  # three one-layer images of 1 MB each, nothing shared


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    require_tools()
    rootfs = base_rootfs()
    work = tmp_path_factory.mktemp("oci")
    builder = image_builder(tmp_path_factory, work / "layout", rootfs)
    with registry(work) as reg:
        a = build_and_push(builder, reg, "swe/a:v1", {"/testbed/a.py": "A = 1\n"}, rootfs)
        b = build_and_push(builder, reg, "swe/b:v1", {"/testbed/b.py": "B = 2\n"}, rootfs)
        base = builder.base_of(rootfs)
        c_tag = builder.image(
            "c",
            base,
            {"/opt/data/one": "same inode\n"},
            hardlinks={"/opt/data/two": "/opt/data/one"},
            remove=["/etc/issue"],
        )
        c = builder.push(c_tag, reg, "swe/c:v1")
        assert builder.has("c") and not builder.has("nothing")
        small = [
            builder.push(
                builder.image(f"s{i}", "empty", {"/blob": os.urandom(1 << 20)}), reg, f"s/{i}:v1"
            )
            for i in range(3)
        ]
        yield Images(reg=reg, builder=builder, a=a, b=b, c=c, small=small)


def _store(tmp_path: Path, **kw: int) -> ImageStore:
    return ImageStore(tmp_path / "store", **kw)  # type: ignore[arg-type]


@pytest.mark.images
def test_pulled_images_share_their_base_layer_unpacked_once(images: Images, tmp_path: Path) -> None:
    store = _store(tmp_path)
    a, b, c = (store.pull(ref, tls_verify=False) for ref in (images.a, images.b, images.c))
    assert a.layers[0] == b.layers[0] == c.layers[0]
    assert len({*a.layers, *b.layers, *c.layers}) == 4
    assert len([p for p in (store.root / "layers").iterdir() if p.is_dir()]) == 4
    assert (a.layers[-1] / "testbed/a.py").read_text() == "A = 1\n"
    inode = os.stat(a.layers[0]).st_ino
    store.pull(images.a, tls_verify=False)  # again: nothing unpacked anew
    assert os.stat(a.layers[0]).st_ino == inode
    usage = store.usage()
    assert usage.images == 3 and usage.layers == 4
    assert usage.share_ratio > 2.5  # three images, one base layer stored once
    assert store.resolve(images.a) == a
    assert next(i.ref for i in store.list()) == a.ref  # most recently used first


@pytest.mark.images
@pytest.mark.skipif(not ROOT, reason="mounting overlayfs here needs root")
def test_a_whiteout_hides_the_lower_file_in_the_overlay(images: Images, tmp_path: Path) -> None:
    store = _store(tmp_path)
    c = store.pull(images.c, tls_verify=False)
    assert (c.layers[0] / "etc/issue").exists()
    top = c.layers[-1]
    assert os.stat(top / "opt/data/one").st_ino == os.stat(top / "opt/data/two").st_ino
    (tmp_path / "upper").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "root").mkdir()
    lower = ":".join(str(p) for p in reversed(c.layers))
    subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'}",
            str(tmp_path / "root"),
        ],
        check=True,
    )
    try:
        assert not (tmp_path / "root/etc/issue").exists()
        assert (tmp_path / "root/etc/os-release").exists()
        assert (tmp_path / "root/opt/data/two").read_text() == "same inode\n"
    finally:
        subprocess.run(["umount", str(tmp_path / "root")], check=True)


@pytest.mark.images
def test_a_corrupt_blob_fails_the_pull_in_one_line_and_leaves_no_layer(
    images: Images, tmp_path: Path
) -> None:
    tag = images.builder.image("bad", "empty", {"/x": os.urandom(4096)})
    ref = images.builder.push(tag, images.reg, "swe/bad:v1")
    manifest = json.loads(
        subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
            capture_output=True,
            check=True,
        ).stdout
    )
    blob = images.reg.blob(manifest["layers"][0]["digest"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    store = _store(tmp_path)
    with pytest.raises(ImageError, match=r"cannot pull .*swe/bad:v1: .*[Dd]igest") as e:
        store.pull(ref, tls_verify=False)
    assert "\n" not in str(e.value)
    assert list((store.root / "layers").iterdir()) == []
    with pytest.raises(ImageError, match="raas images pull"):
        store.resolve(ref)


@pytest.mark.images
def test_a_blob_damaged_in_the_store_is_caught_at_unpack_and_fetched_again(
    images: Images, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    a = store.pull(images.a, tls_verify=False)
    store.remove(images.a)
    store.pull(images.b, tls_verify=False)  # keeps the base blob; a's top blob goes
    store.pull(images.a, tls_verify=False)
    top_blob = json.loads(
        (store.root / "blobs/sha256" / a.digest.removeprefix("sha256:")).read_text()
    )["layers"][-1]["digest"]
    path = store.root / "blobs/sha256" / top_blob.removeprefix("sha256:")
    store.remove(images.a)
    store.pull(images.a, tls_verify=False)
    # Damage a's top blob and its layer; skopeo reuses a blob already in the store unread.
    from raas.images.layers import remove_tree

    remove_tree(a.layers[-1])
    path.write_bytes(b"garbage")
    with pytest.raises(ImageError, match="has digest"):
        store.pull(images.a, tls_verify=False)
    assert not a.layers[-1].exists() and not path.exists()
    assert not list((store.root / "layers").glob("*.partial"))
    assert store.pull(images.a, tls_verify=False) == a  # fetched again


@pytest.mark.images
def test_a_pull_killed_while_unpacking_leaves_no_layer_and_the_next_pull_completes(
    images: Images, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    code = (
        "import sys; from pathlib import Path; from raas.images.store import ImageStore;"
        " ImageStore(Path(sys.argv[1])).pull(sys.argv[2], tls_verify=False)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen([sys.executable, "-c", code, str(root), images.a], env=env)
    deadline = time.monotonic() + 120
    while not list((root / "layers").glob("*.partial/*")):  # the base layer half unpacked
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert [p for p in (root / "layers").iterdir() if not p.name.endswith(".partial")] == []
    store = ImageStore(root)
    with pytest.raises(ImageError, match="raas images pull"):
        store.resolve(images.a)
    image = store.pull(images.a, tls_verify=False)
    assert (image.layers[0] / "usr/bin/python3").exists()
    assert not list((root / "layers").glob("*.partial"))


@pytest.mark.images
def test_registry_down_and_unknown_image_are_one_line_each(images: Images, tmp_path: Path) -> None:
    from raas.helpers.ports import free_port

    store = _store(tmp_path)
    down = f"127.0.0.1:{free_port()}/swe/a:v1"
    with pytest.raises(ImageError, match=rf"cannot pull {down}: .*connection refused") as e:
        store.pull(down, tls_verify=False)
    assert "\n" not in str(e.value)
    with pytest.raises(ImageError, match=r"swe/nothing:v1: .*manifest unknown") as e:
        store.pull(images.reg.ref("swe/nothing:v1"), tls_verify=False)
    assert "\n" not in str(e.value)


@pytest.mark.images
@pytest.mark.skipif(not ROOT, reason="a small tmpfs for the store needs root")
def test_a_full_disk_is_one_line_and_leaves_no_partial_layer(
    images: Images, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(disk)], check=True)
    try:
        store = ImageStore(disk / "store")
        with pytest.raises(ImageError, match=r"cannot pull .*s/0:v1: .*no space left") as e:
            store.pull(images.small[0], tls_verify=False)  # 1 MB blob + 1 MB unpacked
        assert "\n" not in str(e.value)
        assert [p for p in (store.root / "layers").iterdir() if p.is_dir()] == []
        with pytest.raises(ImageError, match="raas images pull"):
            store.resolve(images.small[0])
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.images
def test_prune_and_remove_keep_an_image_a_sandbox_is_using(images: Images, tmp_path: Path) -> None:
    store = _store(tmp_path)
    a = store.pull(images.a, tls_verify=False)
    store.pull(images.b, tls_verify=False)
    with store.in_use(a):
        with pytest.raises(ImageError, match="in use"):
            store.remove(images.a)
        store.remove(images.b)
        assert all(p.is_dir() for p in a.layers)
        # The name moves to another image and is pulled anew: the held one's layers stay.
        moving = images.builder.push("swe-b-v1", images.reg, "swe/moving:v1")
        held = store.pull(moving, tls_verify=False)
        with store.in_use(held):
            images.builder.push("c", images.reg, "swe/moving:v1")
            assert store.pull(moving, tls_verify=False).digest != held.digest
            store.prune()
            assert all(p.is_dir() for p in held.layers)
        store.remove(moving)
        assert not held.layers[-1].exists()
        assert all(p.is_dir() for p in a.layers)
        assert [i.ref for i in store.list()] == [a.ref]
    store.remove(images.a)
    assert list((store.root / "layers").iterdir()) == []
    assert list((store.root / "blobs/sha256").iterdir()) == []


@pytest.mark.images
def test_the_size_cap_evicts_the_least_recently_used_image_no_sandbox_holds(
    images: Images, tmp_path: Path
) -> None:
    s0, s1, s2 = images.small
    store = _store(tmp_path)
    store.pull(s0, tls_verify=False)
    store.pull(s1, tls_verify=False)
    two = store.usage().total_bytes
    capped = ImageStore(store.root, max_bytes=two + two // 4)  # room for two, not three
    capped.resolve(s0)  # s1 is now the least recently used
    capped.pull(s2, tls_verify=False)
    assert sorted(i.ref for i in capped.list()) == sorted([s0, s2])
    assert capped.usage().total_bytes <= capped.max_bytes  # type: ignore[operator]
    with capped.in_use(capped.resolve(s0)):  # held: s2 goes though s0 is older
        capped.resolve(s2)
        capped.pull(s1, tls_verify=False)
    assert sorted(i.ref for i in capped.list()) == sorted([s0, s1])


@pytest.mark.images
def test_import_of_docker_save_and_oci_layout(images: Images, tmp_path: Path) -> None:
    layout = images.builder.layout
    archive = tmp_path / "a.tar"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            f"oci:{layout}:swe-a-v1",
            f"docker-archive:{archive}:local/a:v1",
        ],
        check=True,
    )
    store = _store(tmp_path)
    from_archive = store.import_(archive)
    assert from_archive.ref == "docker.io/local/a:v1"
    assert (from_archive.layers[-1] / "testbed/a.py").read_text() == "A = 1\n"
    with pytest.raises(ImageError, match=r"holds \d images: pick one with --ref"):
        store.import_(layout)
    from_layout = store.import_(layout, "swe-b-v1")
    assert from_layout.ref == "docker.io/library/swe-b-v1:latest"
    assert from_layout.layers[0] == from_archive.layers[0]  # the same base, by diff_id
    with pytest.raises(ImageError, match=r"cannot import .*nothing"):
        store.import_(tmp_path / "nothing")
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC\0")
    with pytest.raises(ImageError, match=r"x.sif .*not a SIF file"):
        store.import_(sif)


@pytest.mark.images
def test_two_processes_pulling_one_image_unpack_it_once(images: Images, tmp_path: Path) -> None:
    root = tmp_path / "store"
    code = (
        "import sys; from pathlib import Path; from raas.images.store import ImageStore;"
        " print(ImageStore(Path(sys.argv[1])).pull(sys.argv[2], tls_verify=False).digest)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(root), images.c], stdout=subprocess.PIPE, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1]
    assert len([p for p in (root / "layers").iterdir() if p.is_dir()]) == 2


@pytest.mark.images
def test_the_images_commands(images: Images, tmp_path: Path) -> None:
    runner = CliRunner()
    store = ["--store", str(tmp_path / "store")]

    def cli(*args: str) -> str:
        result = runner.invoke(main, ["images", *args, *store])
        assert result.exit_code == 0, result.output
        return result.output

    assert "pulled " + images.a in cli("pull", images.a, "--tls-verify=false")
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"data_source": "swe", "image_name": ref} for ref in (images.a, images.b)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli("prefetch", str(tasks), "--tls-verify=false")
    assert "[1/2] " + images.a + ": stored already" in out
    assert "[2/2] " + images.b + ": pulled" in out
    listing = cli("ls")
    table = [line for line in listing.splitlines() if not line.startswith("store: ")]
    assert all(len(line) <= 80 for line in table), listing
    assert "swe/a:v1" in listing and "2 images, 3 layers" in listing
    assert "share ratio 2.00" in listing
    assert "removed" in cli("rm", images.b)
    assert "removed 0 layers" in cli("prune")
    bad = runner.invoke(main, ["images", "pull", "127.0.0.1:1/x", "--tls-verify=false", *store])
    assert bad.exit_code == 1
    assert bad.output.startswith("Error: cannot pull 127.0.0.1:1/x:latest: ")
    assert len(bad.output.strip().splitlines()) == 1
