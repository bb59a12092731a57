"""Harbor-style Dockerfile contexts built with real buildah into a real image store
(``raas.images.buildah``): the ``images`` tier (``make test-images``).

The base image is the tier's root filesystem (``scripts/images/make-base-rootfs.sh``: Debian
bookworm with python3), made an image with umoci and imported into the store as
``raas/harbor-base:bookworm``; builds take it from there, never from a registry. One store and
one buildah storage serve the module, so the base is loaded into buildah once."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.cli import main
from raas.images import buildah, manifests
from raas.images.buildah import (
    Buildah,
    BuildahDirs,
    base_tag,
    build_context,
    build_context_async,
)
from raas.images.errors import ImageError
from raas.images.image import StoredImage
from raas.images.store import ImageStore
from tests.support import tiers
from tests.support.oci_images import base_rootfs, image_builder, require_tools

BASE = "raas/harbor-base:bookworm"
DOCKERFILE = """\
FROM raas/harbor-base:bookworm
WORKDIR /app
COPY data.txt /app/data.txt
ENV GREETING=hello
RUN python3 -c "open('/app/built','w').write('ok')"
"""


@dataclass
class Setup:
    store: ImageStore
    dirs: BuildahDirs
    base: StoredImage


def _require_buildah() -> None:
    """Skip without buildah (fail, where the images tier was asked for)."""
    if shutil.which("buildah") is None:
        why = "the images tier's Dockerfile builds need buildah: scripts/install-system-deps.sh"
        if tiers.selected("images"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    require_tools()
    _require_buildah()
    rootfs = base_rootfs()
    work = tmp_path_factory.mktemp("harbor")
    builder = image_builder(tmp_path_factory, work / "layout", rootfs)
    tag = builder.base_of(rootfs)
    single = work / "base-layout"  # the one image alone, so the import may name it
    subprocess.run(
        ["skopeo", "copy", "--quiet", f"oci:{builder.layout}:{tag}", f"oci:{single}:base"],
        check=True,
        timeout=300,
    )
    store = ImageStore(work / "store")
    base = store.import_(single, BASE)
    # As root, buildah's unprivileged id must reach its storage: not below pytest's 0700 dirs.
    own = BuildahDirs.default().base.parent / f"buildah-test-{os.getpid()}"
    dirs = BuildahDirs(own) if os.geteuid() == 0 else BuildahDirs(work / "buildah")
    try:
        yield Setup(store=store, dirs=dirs, base=base)
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _context(root: Path, data: str = "data\n", dockerfile: str = DOCKERFILE) -> Path:
    root.mkdir(parents=True)
    (root / "Dockerfile").write_text(dockerfile)
    (root / "data.txt").write_text(data)
    return root


def _in_layers(image: StoredImage, path: str) -> str | None:
    """The content of ``path`` in the image, its topmost layer that has it."""
    for layer in reversed(image.layers):
        found = layer / path.lstrip("/")
        if found.is_file():
            return found.read_text()
    return None


def _build(s: Setup, ctx: Path, **kw: float) -> tuple[StoredImage, bool]:
    result = build_context(s.store, ctx, dirs=s.dirs, timeout_s=kw.get("timeout_s", 300.0))
    return result.image, result.cached


def _buildah(s: Setup, *args: str) -> str:
    # As raas runs it (as root: in its user namespace, which owns the storage).
    return Buildah(s.dirs, time.monotonic() + 60)._run(list(args), what="query", net=False)


@pytest.mark.images
def test_a_context_builds_on_the_stored_base_sharing_its_layers(
    setup: Setup, tmp_path: Path
) -> None:
    ctx = _context(tmp_path / "env", data="the task's data\n")
    image, cached = _build(setup, ctx)
    assert not cached and image.ref.startswith("localhost/raas-build/")
    assert _in_layers(image, "/app/built") == "ok"
    assert _in_layers(image, "/app/data.txt") == "the task's data\n"
    assert "GREETING=hello" in image.env and image.workdir == "/app"
    # The base's unpacked layers and its blobs are the built image's bottom ones, not copies.
    assert image.layers[: len(setup.base.layers)] == setup.base.layers
    built = manifests.read_image(setup.store.blob_dir, image.digest)
    base = manifests.read_image(setup.store.blob_dir, setup.base.digest)
    assert built.layers[: len(base.layers)] == base.layers
    assert setup.store.usage().layers == len(built.layers)  # nothing unpacked twice
    # buildah keeps the base (a cache of the store's, named by its store digest), not the
    # image it built, nor the copy of the base it pulled.
    names = _buildah(setup, "images", "--format", "{{.Name}}:{{.Tag}}").split()
    assert names == [base_tag(setup.base)]
    assert _buildah(setup, "containers", "-q").strip() == ""
    assert sorted(p.name for p in setup.dirs.base.iterdir()) == sorted(
        ["root", "runroot", "tmp", "locks", *(["home"] if os.geteuid() == 0 else [])]
    )
    assert list(setup.dirs.tmp.iterdir()) == []


@pytest.mark.images
def test_a_context_built_before_is_found_without_buildah(
    setup: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(tmp_path / "env", data="built once\n")
    first, _ = _build(setup, ctx)
    copy = _context(tmp_path / "elsewhere" / "env", data="built once\n")  # another task's
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no buildah (nor anything else)
    again, cached = _build(setup, copy)
    assert cached and again == first
    (copy / "data.txt").write_text("changed\n")
    with pytest.raises(ImageError, match="needs buildah: apt-get install buildah"):
        _build(setup, copy)  # a changed file is another image, which needs building


@pytest.mark.images
def test_a_changed_file_builds_another_image(setup: Setup, tmp_path: Path) -> None:
    one, _ = _build(setup, _context(tmp_path / "one", data="one\n"))
    two, cached = _build(setup, _context(tmp_path / "two", data="two\n"))
    assert not cached and one.ref != two.ref
    assert (
        _in_layers(two, "/app/data.txt") == "two\n" and _in_layers(one, "/app/data.txt") == "one\n"
    )


@pytest.mark.images
def test_a_failing_run_step_is_an_image_error_with_buildahs_words(
    setup: Setup, tmp_path: Path
) -> None:
    dockerfile = f"FROM {BASE}\nRUN echo raas-build-marker-7 >&2; exit 3\n"
    ctx = _context(tmp_path / "env", dockerfile=dockerfile)
    with pytest.raises(ImageError) as e:
        _build(setup, ctx)
    message = str(e.value)
    assert "buildah build failed" in message and "raas-build-marker-7" in message
    assert "exit status 3" in message
    assert _buildah(setup, "containers", "-q").strip() == ""  # --force-rm: none left


@pytest.mark.images
def test_run_steps_cannot_reach_the_hosts_network(setup: Setup, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        reach = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10)"
        ctx = _context(tmp_path / "env", dockerfile=f'FROM {BASE}\nRUN python3 -c "{reach}"\n')
        with pytest.raises(ImageError, match=r"buildah build failed.*(unreachable|refused)"):
            _build(setup, ctx)


def _marked(marker: str) -> list[int]:
    """The pids of processes whose command line holds ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _wait_marked(marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not _marked(marker):
        assert time.monotonic() < deadline, f"no process of {marker} after {timeout_s} s"
        time.sleep(0.1)


def _sleeping_context(root: Path, marker: str) -> Path:
    step = f"RUN python3 -c 'import time; time.sleep(600)' {marker}\n"
    return _context(root, dockerfile=f"FROM {BASE}\n{step}")


@pytest.mark.images
def test_a_build_past_its_deadline_is_killed_with_its_run_step(
    setup: Setup, tmp_path: Path
) -> None:
    marker = f"raas-deadline-{os.getpid()}"
    ctx = _sleeping_context(tmp_path / "env", marker)
    with pytest.raises(ImageError, match="ran past the build's deadline"):
        _build(setup, ctx, timeout_s=10.0)
    assert _marked(marker) == []
    assert _buildah(setup, "containers", "-q").strip() == ""


@pytest.mark.images
def test_cancelling_the_async_build_kills_buildah(setup: Setup, tmp_path: Path) -> None:
    marker = f"raas-cancel-{os.getpid()}"
    ctx = _sleeping_context(tmp_path / "env", marker)

    async def scenario() -> None:
        task = asyncio.create_task(
            build_context_async(setup.store, ctx, dirs=setup.dirs, timeout_s=300.0)
        )
        await asyncio.to_thread(_wait_marked, marker, 120.0)  # the RUN step runs
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert _marked(marker) == []


@pytest.mark.images
def test_the_cli_prints_the_ref_and_whether_it_was_cached(setup: Setup, tmp_path: Path) -> None:
    ctx = _context(tmp_path / "env", data="via the cli\n")
    image, _ = _build(setup, ctx)
    result = CliRunner().invoke(
        main, ["images", "build-context", str(ctx), "--store", str(setup.store.root)]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{image.ref} cached in ")
    missing = _context(tmp_path / "other", dockerfile="FROM raas/absent:v1\n")
    result = CliRunner().invoke(
        main, ["images", "build-context", str(missing), "--store", str(setup.store.root)]
    )
    assert result.exit_code == 1 and "raas images pull raas/absent:v1" in result.output


ESCAPE = (
    "import os\n"
    "os.makedirs('/esc', exist_ok=True)\n"
    "top = os.open('/', os.O_RDONLY)\n"
    "os.chroot('/esc')\n"
    "os.fchdir(top)\n"
    "for _ in range(64):\n"
    "    os.chdir('..')\n"
    "os.chroot('.')\n"
    "open('{marker}', 'w').write('escaped')\n"
)


@pytest.mark.images
def test_a_run_step_is_no_root_of_the_host_and_cannot_leave_its_chroot(
    setup: Setup, tmp_path: Path
) -> None:
    """A Dockerfile is a task's: its RUN steps ran as the host's root in a chroot they could
    leave (a chroot of their own, then ``..``), with all the host's files to write."""
    marker = f"/tmp/raas-build-escape-{os.getpid()}"
    ctx = tmp_path / "env"
    ctx.mkdir()
    (ctx / "escape.py").write_text(ESCAPE.format(marker=marker))
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE}\nCOPY escape.py /escape.py\n"
        "RUN (cat /proc/self/uid_map; python3 /escape.py) > /attempt.txt 2>&1 || true\n"
    )
    image, _ = _build(setup, ctx)
    attempt = _in_layers(image, "/attempt.txt") or ""
    assert not Path(marker).exists(), attempt
    if os.geteuid() == 0:  # root of its namespace only: an unprivileged id of the host's
        inside, outside, _ = attempt.split()[:3]
        assert inside == "0" and int(outside) >= 1_000_000
    assert "PermissionError" in attempt or "Operation not permitted" in attempt


@pytest.mark.images
def test_bases_beyond_the_last_used_are_pruned_from_buildahs_storage(
    setup: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two bases: the stored one, and an image built on it that a second context names.
    first, _ = _build(setup, _context(tmp_path / "one", data="first\n"))
    on_first = f"FROM {first.ref}\nRUN test -f /app/built\n"
    names = lambda: _buildah(setup, "images", "--format", "{{.Name}}:{{.Tag}}").split()  # noqa: E731
    locks = lambda: sorted(p.name for p in setup.dirs.locks.glob("base-*.lock"))  # noqa: E731
    # control: within KEEP_BASES, both stay
    _build(setup, _context(tmp_path / "two", dockerfile=on_first))
    assert sorted(names()) == sorted([base_tag(setup.base), base_tag(first)])
    # beyond it, the one used longest ago goes, with its lock file
    monkeypatch.setattr(buildah, "KEEP_BASES", 1)
    _build(setup, _context(tmp_path / "three", data="x\n", dockerfile=on_first))
    assert names() == [base_tag(first)]
    assert locks() == [f"base-{first.digest.replace(':', '-')}.lock"]
    # and a build on it again loads it anew
    again, cached = _build(setup, _context(tmp_path / "four", data="again\n"))
    assert not cached and _in_layers(again, "/app/data.txt") == "again\n"
    assert names() == [base_tag(setup.base)]


# The distribution reference grammar's path component: alphanumerics joined by ".", "_", "__"
# or runs of "-". buildah refuses a layout whose path is not made of these.
COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


def test_a_base_layouts_scratch_dir_is_always_a_valid_reference_component(
    tmp_path: Path,
) -> None:
    # tempfile's names failed about one draw in 20 (a trailing "_", "-_", "___"): 400 draws.
    for _ in range(400):
        with buildah._reference_safe_tmp(tmp_path, "base-") as scratch:
            assert COMPONENT.fullmatch(scratch.name), scratch.name
            assert stat.S_IMODE(scratch.stat().st_mode) == 0o700
        assert not scratch.exists()
    assert COMPONENT.fullmatch("base-y53h0t__") is None  # the name CI's images tier met
