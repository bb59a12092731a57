"""The image store and image sandboxes as an unprivileged user (no root, no daemon).

As root these tests run raas as uid 65534 (``tests.support.unprivileged``), with a HOME, image store
and runtime directory it owns: ``raas images import`` of an OCI layout and ``raas images pull`` from
a registry on 127.0.0.1 unpack the layers without root (whiteouts as 0/0 character devices, which
any user may make since Linux 5.8; opaque directories marked ``user.overlay.opaque``), and a bwrap
sandbox of the image runs on a rootless overlay (``userxattr``, so the opaque marks count) or on the
copy fallback. The images are built here, as the test's own user, with umoci on the image tier's
Debian root filesystem (``make test-images``).
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raas.bench.oci_fixtures import run_tool
from raas.images.layers import WHITEOUT_PREFIX
from raas.images.overlay import is_opaque, is_whiteout
from tests.images.test_image_store import GZIP, _blob, _entry, _tar
from tests.sandbox.test_image_rootfs import snapshot
from tests.support.oci_images import ImageBuilder, base_rootfs, registry, require_tools
from tests.support.unprivileged import User, readable, unprivileged_user

pytestmark = pytest.mark.images

TAG = "swe-rootless"
IMPORTED = f"docker.io/library/{TAG}:latest"
FILES = {"/testbed/pkg/mod.py": "X = 1\n", "/testbed/README": "r\n", "/opt/env/old.py": ""}


@dataclass
class Setup:
    user: User
    reg_ref: str  # the image in a registry on 127.0.0.1
    imported: str  # what `raas images import` printed, as the user


def _top_layer(path: Path) -> Path:
    """An uncompressed layer tar that removes /etc/issue (a whiteout) and makes /opt/env
    opaque with a file of its own."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [
            ("etc/", None),
            ("etc/.wh.issue", b""),
            ("opt/", None),
            ("opt/env/", None),
            ("opt/env/.wh..wh..opq", b""),
            ("opt/env/new.py", b"NEW = 1\n"),
        ]:
            info = tarfile.TarInfo(name.rstrip("/"))
            info.type = tarfile.DIRTYPE if data is None else tarfile.REGTYPE
            info.mode = 0o755 if data is None else 0o644
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    with unprivileged_user() as user:
        yield user


@pytest.fixture(scope="module")
def setup(user: User) -> Iterator[Setup]:
    require_tools()
    rootfs = base_rootfs()
    builder = ImageBuilder(user.shared / "layout")
    swe = builder.image("swe", builder.base_of(rootfs), FILES)
    top = _top_layer(user.shared / "top.tar")
    layout = f"{builder.layout}:{swe}"
    run_tool("umoci", "raw", "add-layer", "--image", layout, "--tag", TAG, top)
    readable(user.shared)
    with registry(user.shared / "registry") as reg:
        reg_ref = builder.push(TAG, reg, "swe/rootless:v1")
        imported = user.raas("images", "import", str(builder.layout), "--ref", TAG)
        assert imported.returncode == 0, imported.stderr
        yield Setup(user, reg_ref, imported.stdout)


UNPACK = (
    "import sys; from pathlib import Path; from raas.images.layers import unpack_layer;"
    " unpack_layer(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], Path(sys.argv[5]))"
)


def test_an_unprivileged_unpack_marks_read_only_directories_too(user: User) -> None:
    # Without root's CAP_DAC_OVERRIDE, a whiteout in (or an opaque mark on) a directory the tar
    # made 0555 needs the directory made writable meanwhile.
    raw = _tar(
        [
            (_entry("ro", tarfile.DIRTYPE, mode=0o555), None),
            (_entry("ro/.wh.gone"), b""),
            (_entry("ro/kept", mode=0o444), b"k"),
            (_entry("opaque", tarfile.DIRTYPE, mode=0o555), None),
            (_entry("opaque/.wh..wh..opq"), b""),
        ]
    )
    blob = _blob(user.shared, raw, "ro-blob")
    readable(user.shared)
    dest = user.home / "ro-layer"
    args = [str(blob.path), GZIP, blob.digest, blob.diff_id, str(dest)]
    unpacked = user.python_run("-c", UNPACK, *args)
    assert unpacked.returncode == 0, unpacked.stderr
    assert is_whiteout(os.lstat(dest / "ro/gone"))
    assert os.getxattr(dest / "opaque", "user.overlay.opaque") == b"y"
    for directory in ("ro", "opaque"):  # as the tar has them again
        assert stat.S_IMODE(os.lstat(dest / directory).st_mode) == 0o555
    assert (dest / "ro/kept").read_bytes() == b"k"


def _layer_dirs(store: Path) -> list[Path]:
    return sorted(p for p in (store / "layers").iterdir() if p.is_dir())


def test_an_unprivileged_user_imports_and_pulls_into_a_store_it_owns(setup: Setup) -> None:
    user = setup.user
    assert setup.imported.startswith(f"imported {IMPORTED} sha256:")
    assert setup.imported.rstrip().endswith("(3 layers)")
    pulled = user.raas("images", "pull", setup.reg_ref, "--tls-verify=false")
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.startswith(f"pulled {setup.reg_ref} ")
    listing = user.raas("images", "ls")
    assert "2 images, 3 layers" in listing.stdout, listing.stdout + listing.stderr
    layers = _layer_dirs(user.store)
    assert len(layers) == 3 and not list((user.store / "layers").glob("*.partial"))
    for layer in layers:  # every file the user's, no whiteout file left as a file
        for dirpath, dirnames, filenames in os.walk(layer):
            for name in [".", *dirnames, *filenames]:
                assert os.lstat(os.path.join(dirpath, name)).st_uid == user.uid
                assert not name.startswith(WHITEOUT_PREFIX), os.path.join(dirpath, name)
    (top,) = [layer for layer in layers if (layer / "opt/env/new.py").exists()]
    issue = os.lstat(top / "etc/issue")
    assert is_whiteout(issue) and issue.st_uid == user.uid
    assert os.getxattr(top / "opt/env", "user.overlay.opaque") == b"y"
    assert is_opaque(top / "opt/env")


@pytest.mark.parametrize("how", ["overlay", "copy"])
def test_an_unprivileged_users_sandbox_runs_in_its_image(setup: Setup, how: str) -> None:
    user = setup.user
    layers = _layer_dirs(user.store)
    small = [layer for layer in layers if not (layer / "usr").exists()]
    (base,) = set(layers) - set(small)
    before = [snapshot(layer) for layer in small]
    run = user.python_run("-m", "tests.support.unprivileged", "sandbox", IMPORTED, how, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    if how == "overlay":
        if report["overlay"] is None:
            pytest.skip("this kernel refuses an unprivileged overlay (userxattr needs 5.11+)")
        assert report["overlay"] == ",userxattr"
    assert report["python"] == [0, "(3, 11)"]  # the image's own
    assert report["uid"] == [0, ["1000"]]
    assert report["fs"] == [0, ["overlayfs" if how == "overlay" else "tmpfs"]]
    assert report["issue"] == [0, ["gone"]]  # the top layer's whiteout hides it
    assert report["opaque"] == [0, ["new.py"]]  # the opaque directory hides old.py
    # The agent edits /testbed, and replaces a directory of the image with one of its own.
    assert report["edit"] == [0, ["new", "pkg", "X", "=", "1", "Y", "=", "2"]]
    assert report["refill"] == [0, ["mine"]]
    assert report["left"] == []  # the runtime directory, once the sandbox closed
    assert [snapshot(layer) for layer in small] == before
    assert stat.S_ISREG(os.lstat(base / "etc/issue").st_mode)
    assert list(user.runtime.iterdir()) == []
