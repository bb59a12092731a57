"""Small real OCI images, built offline with umoci and served by a real registry on 127.0.0.1:
what `raas bench images` and the image tier's tests (``tests/support/oci_images.py``) stand on.

``ImageBuilder`` makes images in one OCI layout: a base layer from a root filesystem directory
(``base``), then images that add files on top of it (``image``), so images built on one base
share that layer. ``registry`` starts Debian's ``docker-registry`` on 127.0.0.1 (plain HTTP: pull
with ``tls_verify=False``). ``build_and_push`` does both for one image.

The image tier's root filesystem (Debian bookworm with python3, pytest and git) is at
``base_rootfs_dir()``; ``scripts/images/make-base-rootfs.sh`` builds it (``make test-images``
runs it). ``missing()`` says in one line what of all this a machine lacks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from raas.helpers.children import terminate
from raas.helpers.ports import free_port
from raas.helpers.readiness import NotReady, wait_until_answers
from raas.paths import host_paths

TOOLS = {"umoci": "umoci", "skopeo": "skopeo", "docker-registry": "docker-registry"}
MAKE_ROOTFS = "scripts/images/make-base-rootfs.sh"


def missing_tools() -> list[str]:
    """The Debian packages this module needs that are not installed."""
    return [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]


def base_rootfs_dir() -> Path:
    """Where ``scripts/images/make-base-rootfs.sh`` puts the image tier's root filesystem
    (complete once it holds ``.raas-complete``)."""
    return host_paths().cache_dir / "swe-images" / "base-rootfs"


def rootfs_ready(root: Path) -> bool:
    return (root / ".raas-complete").exists()


def missing() -> str | None:
    """One line naming what building and serving images here lacks, and what to run; None
    when nothing is."""
    lacks = [f"the Debian packages {', '.join(p)}" for p in [missing_tools()] if p]
    if not rootfs_ready(base_rootfs_dir()):
        lacks.append(f"the base root filesystem {base_rootfs_dir()}")
    if not lacks:
        return None
    return f"needs {' and '.join(lacks)}: run `make test-images` once (or, as root, {MAKE_ROOTFS})"


def run_tool(*argv: str | Path) -> None:
    """Run a tool; its stderr in a RuntimeError if it fails."""
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))}: {proc.stderr.strip()}")


@dataclass
class Registry:
    """A Docker registry (HTTP API v2) on 127.0.0.1, its blobs under ``storage``."""

    host: str  # 127.0.0.1:PORT
    storage: Path
    proc: subprocess.Popen[bytes]

    def ref(self, name: str) -> str:
        return f"{self.host}/{name}"

    def blob(self, digest: str) -> Path:
        """Where the registry keeps blob ``digest`` (to corrupt it)."""
        hexdigest = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def stop(self) -> None:
        terminate(self.proc, 10.0)


@contextlib.contextmanager
def registry(workdir: Path) -> Iterator[Registry]:
    """A registry for the ``with`` block, stopped after it."""
    port = free_port()
    storage = workdir / "registry-data"
    storage.mkdir(parents=True, exist_ok=True)
    config = workdir / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    with open(workdir / "registry.log", "wb") as log:
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    reg = Registry(host=f"127.0.0.1:{port}", storage=storage, proc=proc)
    try:
        try:
            wait_until_answers(
                f"http://{reg.host}/v2/",
                30.0,
                gone=lambda: None if proc.poll() is None else "docker-registry exited",
            )
        except NotReady as e:
            raise RuntimeError(f"{e}: {(workdir / 'registry.log').read_text()[-2000:]}") from e
        yield reg
    finally:
        reg.stop()


class ImageBuilder:
    """Images in one OCI layout (``layout``), built with umoci."""

    def __init__(self, layout: Path) -> None:
        self.layout = layout
        self.work = layout.with_name(layout.name + "-work")
        if not (layout / "index.json").exists():
            run_tool("umoci", "init", "--layout", layout)
            run_tool("umoci", "new", "--image", f"{layout}:empty")

    def has(self, tag: str) -> bool:
        index = json.loads((self.layout / "index.json").read_text())
        return any(
            (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag
            for m in index.get("manifests", [])
        )

    def base_of(self, rootfs: Path) -> str:
        """The tag of the one-layer image of ``rootfs``, made the first time it is asked for."""
        tag = "base-" + hashlib.sha256(str(rootfs.resolve()).encode()).hexdigest()[:12]
        if not self.has(tag):
            self.base(rootfs, tag)
        return tag

    def base(self, rootfs: Path, tag: str = "base") -> str:
        """An image of one layer: the root filesystem ``rootfs``."""
        run_tool("umoci", "insert", "--image", f"{self.layout}:empty", "--tag", tag, rootfs, "/")
        return tag

    def image(
        self,
        tag: str,
        base: str,
        files: Mapping[str, str | bytes] | None = None,
        *,
        hardlinks: Mapping[str, str] | None = None,
        remove: Sequence[str] = (),
    ) -> str:
        """``base`` plus one layer: ``files`` (absolute path in the image -> content),
        ``hardlinks`` (new path -> a path of ``files``) and whiteouts for ``remove``."""
        if remove:
            bundle = self.work / f"bundle-{tag}"
            shutil.rmtree(bundle, ignore_errors=True)
            run_tool("umoci", "unpack", "--image", f"{self.layout}:{base}", bundle)
            rootfs = bundle / "rootfs"
            for path in remove:
                target = rootfs / path.lstrip("/")
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
            _write_files(rootfs, files or {}, hardlinks or {})
            run_tool("umoci", "repack", "--image", f"{self.layout}:{tag}", bundle)
            shutil.rmtree(bundle)
            return tag
        stage = self.work / f"stage-{tag}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        _write_files(stage, files or {}, hardlinks or {})
        run_tool("umoci", "insert", "--image", f"{self.layout}:{base}", "--tag", tag, stage, "/")
        shutil.rmtree(stage)
        return tag

    def push(self, tag: str, reg: Registry, name: str) -> str:
        """Push image ``tag`` to ``reg`` as ``name`` (NAME:TAG); the pullable reference."""
        ref = reg.ref(name)
        run_tool(
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci:{self.layout}:{tag}",
            f"docker://{ref}",
        )
        return ref


def _write_files(root: Path, files: Mapping[str, str | bytes], links: Mapping[str, str]) -> None:
    for path, content in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    for path, existing in links.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(root / existing.lstrip("/"), target)


def build_and_push(
    builder: ImageBuilder,
    reg: Registry,
    name: str,
    files: Mapping[str, str | bytes],
    rootfs: Path,
) -> str:
    """An image of ``rootfs`` plus one layer of ``files`` (absolute path in the image ->
    content), pushed to ``reg`` as ``name`` (NAME:TAG); its reference. Images one builder makes
    from one rootfs share its layer (made once)."""
    base = builder.base_of(rootfs)
    tag = name.replace("/", "-").replace(":", "-")
    builder.image(tag, base, files)
    return builder.push(tag, reg, name)
