"""Building an Apptainer image (a SIF or a sandbox directory) from a root filesystem, offline."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Literal

from raas.images.errors import ImageError


def build_image(
    rootfs: Path,
    out: Path,
    kind: Literal["sif", "sandbox"],
    binary: str,
    force: bool = False,
    fakeroot: bool = False,
    mksquashfs_args: str | None = None,
) -> list[str]:
    """Build a SIF or a sandbox directory at ``out`` from the root filesystem ``rootfs`` with
    ``binary``, the apptainer (or singularity) executable (``raas.sandbox.apptainer.find_binary``).

    Offline: apptainer reads only the local directory. Returns warnings (e.g. no python3, which
    raas's action server needs). Raises ImageError with apptainer's own words on failure.
    """
    if not rootfs.is_dir():
        raise ImageError(f"{rootfs} is not a directory (a root filesystem to build from)")
    if out.exists() and not force:
        raise ImageError(f"{out} already exists (--force replaces it)")
    warnings = []
    if not any((rootfs / d / "python3").exists() for d in ("usr/bin", "bin", "usr/local/bin")):
        warnings.append(
            f"{rootfs} has no python3: raas's action server needs one in the image (or set the"
            " sandbox config's python to the image's interpreter)"
        )
    args = [binary, "build"]
    if force:
        args.append("--force")
    if fakeroot:
        args.append("--fakeroot")
    if mksquashfs_args and kind == "sif":
        args += ["--mksquashfs-args", mksquashfs_args]
    if kind == "sandbox":
        args.append("--sandbox")
    args += [str(out), str(rootfs)]
    out.parent.mkdir(parents=True, exist_ok=True)  # apptainer wants it, after minutes of work
    result = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise ImageError(
            f"apptainer build failed ({' '.join(args)}): {(result.stderr or result.stdout)[-2000:]}"
        )
    return warnings
