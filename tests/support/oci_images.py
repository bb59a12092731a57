"""Small real OCI images for tests: ``raas.bench.oci_fixtures`` (umoci images, a real registry
on 127.0.0.1; shared with `raas bench images`), with the root filesystem a test skips without.

``build_and_push`` builds on ``base_rootfs()`` unless given another root filesystem: the SWE tests
use it to make images with a project at /testbed. ``image_builder`` starts a layout that already
holds the base root filesystem's layer, made once a test process (``umoci insert`` of the whole
root filesystem: seconds of gzip at each module's set-up otherwise). ``make_sif`` writes a
``.sif`` without apptainer.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from raas.bench import oci_fixtures
from raas.bench.oci_fixtures import ImageBuilder, Registry, missing_tools, registry, run_tool
from tests.support import tiers

__all__ = [
    "ImageBuilder",
    "Registry",
    "base_rootfs",
    "build_and_push",
    "image_builder",
    "make_sif",
    "missing_tools",
    "registry",
    "require_tools",
]


def base_rootfs() -> Path:
    """The image tier's base root filesystem (skips the test where it was not built)."""
    root = oci_fixtures.base_rootfs_dir()
    if not oci_fixtures.rootfs_ready(root):
        pytest.skip(f"no base root filesystem at {root}: {oci_fixtures.MAKE_ROOTFS}")
    return root


_SEEDS: dict[Path, Path] = {}


def _seed_layout(factory: pytest.TempPathFactory, rootfs: Path) -> Path:
    """An OCI layout holding the one-layer image of ``rootfs`` (``ImageBuilder.base_of``'s tag),
    made the first time this process asks for it, in pytest's temporary directory."""
    if rootfs not in _SEEDS:
        builder = ImageBuilder(factory.mktemp("base-layout") / "layout")
        builder.base_of(rootfs)
        _SEEDS[rootfs] = builder.layout
    return _SEEDS[rootfs]


def _link_blob_or_copy(src: str, dst: str) -> object:
    """Blobs are named by their digest and never written again: linked. The rest (index.json,
    which umoci rewrites) copied."""
    if f"{os.sep}blobs{os.sep}" in src:
        try:
            os.link(src, dst)
            return dst
        except OSError:  # another file system
            pass
    return shutil.copy2(src, dst)


def image_builder(
    factory: pytest.TempPathFactory, layout: Path, rootfs: Path | None = None
) -> ImageBuilder:
    """An ``ImageBuilder`` at ``layout`` (which must not exist) whose base image of ``rootfs``
    (by default ``base_rootfs()``) is already there: the same layer ``base_of`` would make,
    made once a process and linked in, so ``base_of`` finds it."""
    seed = _seed_layout(factory, (rootfs or base_rootfs()).resolve())
    shutil.copytree(seed, layout, copy_function=_link_blob_or_copy)
    return ImageBuilder(layout)


def require_tools() -> None:
    """Skip where the tools the images tier needs are missing (fail, where the run asked for
    the tier by its marker)."""
    missing = missing_tools()
    if missing:
        why = f"the images tier needs {', '.join(missing)}: scripts/install-system-deps.sh"
        if tiers.selected("images"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)


def build_and_push(
    builder: ImageBuilder,
    reg: Registry,
    name: str,
    files: Mapping[str, str | bytes],
    rootfs: Path | None = None,
) -> str:
    """``oci_fixtures.build_and_push`` on ``rootfs``, by default ``base_rootfs()``."""
    return oci_fixtures.build_and_push(builder, reg, name, files, rootfs or base_rootfs())


def make_sif(rootfs: Path, out: Path) -> Path:
    """A SIF (github.com/sylabs/sif's layout) holding ``rootfs`` as its primary squashfs
    partition, written without apptainer (needs mksquashfs)."""
    squash = out.with_suffix(".squashfs")
    run_tool("mksquashfs", rootfs, squash, "-noappend", "-quiet", "-all-root")
    data = squash.read_bytes()
    squash.unlink()
    descr_offset, data_offset, now = 4096, 32768, int(time.time())
    header = struct.pack(
        "<32s10s3s3s16sqqqqqqqq",
        b"#!/usr/bin/env run-singularity\n",
        b"SIF_MAGIC",
        b"01",
        b"02",
        os.urandom(16),
        now,
        now,
        47,  # free descriptors
        48,  # descriptors in all
        descr_offset,
        585,
        data_offset,
        len(data),
    )
    extra = struct.pack("<ii3s", 1, 2, b"02")  # squashfs, primary system partition, amd64
    descriptor = struct.pack(
        "<iBIIIqqqqqqq128s384s",
        0x4004,  # a partition
        1,
        1,
        0xF0000001,
        0,
        data_offset,
        len(data),
        len(data),
        now,
        now,
        0,
        0,
        b"rootfs",
        extra,
    )
    with open(out, "wb") as f:
        f.write(header)
        f.seek(descr_offset)
        f.write(descriptor)
        f.seek(data_offset)
        f.write(data)
    return out
