"""Apptainer's own images: a task's image name looked up as a SIF or a sandbox directory.

Task data names images the way Docker does (SWE-bench: ``swebench/sweb.eval.x86_64.django__
django-11099:latest``); an HPC site keeps them as SIF files or sandbox directories in one local
directory, converted once on a machine with a registry (``apptainer pull docker://...``) or built
here from a root filesystem (``raas images build``, ``raas.images.build``). Compute nodes have no
network, so nothing here fetches anything. An apptainer sandbox that is not given an image of the
store runs what this finds directly (root or not).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from raas.images.errors import ImageError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SifDir(Protocol):
    """Where the names are looked up (the apptainer sandbox config: ``ApptainerConfig``)."""

    @property
    def image(self) -> str | None: ...

    @property
    def images_dir(self) -> Path: ...

    @property
    def image_map(self) -> Mapping[str, str]: ...


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


def resolve_image(config: SifDir, name: str | None = None) -> Path:
    """The SIF or sandbox directory for image ``name`` (default: ``config.image``).

    A path (absolute, or starting with ``.``) is taken as is; otherwise ``config.image_map``
    is asked first, then the images directory under the names of ``candidate_names``.
    """
    name = name or config.image
    if not name:
        raise ImageError(
            "no apptainer image given: set the sandbox config's image (or $RAAS_APPTAINER_IMAGE)"
            f" to a SIF, a sandbox directory, or a name of one in {config.images_dir}"
        )
    mapped = config.image_map.get(name)
    if mapped is not None:
        path = Path(mapped) if os.path.isabs(mapped) else config.images_dir / mapped
        if path.exists():
            return path
        raise ImageError(
            f"apptainer image {name!r} is mapped to {path}, which does not exist: build it"
            " (raas images build ROOTFS_DIR OUT) or pull it (apptainer pull) there"
        )
    if os.path.isabs(name) or name.startswith("."):
        if Path(name).exists():
            return Path(name)
        raise ImageError(f"apptainer image {name} does not exist")
    tried = candidate_names(name)
    for candidate in tried:
        path = config.images_dir / candidate
        if path.exists():
            return path
    raise ImageError(
        f"no apptainer image for {name!r} in {config.images_dir} (looked for"
        f" {', '.join(tried)}): put a SIF or sandbox directory there under one of those names"
        " (apptainer pull / apptainer build on a machine with a registry, or raas images build"
        " ROOTFS_DIR OUT from a root filesystem), or map the name in image_map"
    )
