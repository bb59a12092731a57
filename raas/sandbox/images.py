"""Apptainer images: finding the binary, resolving a task's image name, building one offline.

Task data names images the way Docker does (SWE-bench: ``swebench/sweb.eval.x86_64.django__
django-11099:latest``); an HPC site keeps them as SIF files or sandbox directories in one local
directory, converted once on a machine with a registry (``apptainer pull docker://...``) or built
here from a root filesystem (``raas images build``). Compute nodes have no network, so nothing
here fetches anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from raas.sandbox.client import SandboxError
from raas.sandbox.config import ApptainerConfig

BINARIES = ("apptainer", "singularity")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def find_binary(binary: str | None) -> str:
    """The apptainer (or singularity) executable to run; a SandboxError says what to do."""
    if binary is not None and os.sep in binary:
        if os.access(binary, os.X_OK) and not os.path.isdir(binary):
            return binary
        raise SandboxError(f"apptainer binary {binary} does not exist or is not executable")
    for name in (binary,) if binary else BINARIES:
        found = shutil.which(name)
        if found is not None:
            return found
    raise SandboxError(
        f"{binary or 'apptainer (or singularity)'} is not on PATH: install Apptainer or"
        " SingularityCE, or set the sandbox config's binary to its path (for tests on a"
        " machine without one: scripts/hpc/make-apptainer-env.sh builds a nested apptainer)"
    )


def candidate_names(name: str) -> list[str]:
    """File names an image called ``name`` may have in the images directory, best first.

    ``swebench/sweb.eval.x86_64.django__django-11099:latest`` may be there as
    ``swebench_sweb.eval.x86_64.django__django-11099_latest`` (the whole name, made safe) or
    ``sweb.eval.x86_64.django__django-11099_latest`` (what ``apptainer pull`` names it), each as
    ``.sif`` or as a sandbox directory; a name without a tag is also looked up with ``latest``.
    """
    names = [name]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and not name.endswith(".sif"):
        names.append(f"{name}:latest")
    found: list[str] = []
    for n in names:
        for stem in (_UNSAFE.sub("_", n).strip("_"), _UNSAFE.sub("_", n.rsplit("/", 1)[-1])):
            for candidate in (stem, f"{stem}.sif") if not stem.endswith(".sif") else (stem,):
                if candidate and candidate not in found:
                    found.append(candidate)
    return found


def resolve_image(config: ApptainerConfig, name: str | None = None) -> Path:
    """The SIF or sandbox directory for image ``name`` (default: ``config.image``).

    A path (absolute, or starting with ``.``) is taken as is; otherwise ``config.image_map``
    is asked first, then the images directory under the names of ``candidate_names``.
    """
    name = name or config.image
    if not name:
        raise SandboxError(
            "no apptainer image given: set the sandbox config's image (or $RAAS_APPTAINER_IMAGE)"
            f" to a SIF, a sandbox directory, or a name of one in {config.images_dir}"
        )
    mapped = config.image_map.get(name)
    if mapped is not None:
        path = Path(mapped) if os.path.isabs(mapped) else config.images_dir / mapped
        if path.exists():
            return path
        raise SandboxError(
            f"apptainer image {name!r} is mapped to {path}, which does not exist: build it"
            " (raas images build ROOTFS_DIR OUT) or pull it (apptainer pull) there"
        )
    if os.path.isabs(name) or name.startswith("."):
        if Path(name).exists():
            return Path(name)
        raise SandboxError(f"apptainer image {name} does not exist")
    tried = candidate_names(name)
    for candidate in tried:
        path = config.images_dir / candidate
        if path.exists():
            return path
    raise SandboxError(
        f"no apptainer image for {name!r} in {config.images_dir} (looked for"
        f" {', '.join(tried)}): put a SIF or sandbox directory there under one of those names"
        " (apptainer pull / apptainer build on a machine with a registry, or raas images build"
        " ROOTFS_DIR OUT from a root filesystem), or map the name in image_map"
    )


def build_image(
    rootfs: Path,
    out: Path,
    kind: Literal["sif", "sandbox"],
    binary: str | None = None,
    force: bool = False,
    fakeroot: bool = False,
    mksquashfs_args: str | None = None,
) -> list[str]:
    """Build a SIF or a sandbox directory at ``out`` from the root filesystem ``rootfs``.

    Offline: apptainer reads only the local directory. Returns warnings (e.g. no python3, which
    raas's action server needs). Raises SandboxError with apptainer's own words on failure.
    """
    if not rootfs.is_dir():
        raise SandboxError(f"{rootfs} is not a directory (a root filesystem to build from)")
    if out.exists() and not force:
        raise SandboxError(f"{out} already exists (--force replaces it)")
    warnings = []
    if not any((rootfs / d / "python3").exists() for d in ("usr/bin", "bin", "usr/local/bin")):
        warnings.append(
            f"{rootfs} has no python3: raas's action server needs one in the image (or set the"
            " sandbox config's python to the image's interpreter)"
        )
    args = [find_binary(binary), "build"]
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
        raise SandboxError(
            f"apptainer build failed ({' '.join(args)}): {(result.stderr or result.stdout)[-2000:]}"
        )
    return warnings
