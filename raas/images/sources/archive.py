"""What an image file on disk is, and how skopeo reads it: a ``docker save`` archive
(``docker-archive:``), an OCI image layout as a directory (``oci:``) or a tar
(``oci-archive:``), or an Apptainer/Singularity ``.sif``."""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raas.images.manifests import REF_NAME, ManifestError, index_manifests


class ArchiveError(Exception):
    pass


@dataclass(frozen=True)
class Source:
    ref: str  # the name the image gets in the store
    skopeo_src: str  # "" for a .sif
    sif: Path | None = None


def identify(path: Path, ref: str | None) -> Source:
    """How to read ``path``; ``ref`` picks an image from a file of several and names it."""
    if not path.exists():
        raise ArchiveError("no such file or directory")
    if path.is_dir():
        return _oci_dir(path, ref)
    if path.suffix == ".sif" or _is_sif(path):
        return Source(ref=ref or path.stem, skopeo_src="", sif=path)
    if not tarfile.is_tarfile(path):
        raise ArchiveError("not a docker save archive, an OCI layout (dir or tar) or a .sif")
    with tarfile.open(path) as tar:
        names = {m.name.removeprefix("./") for m in tar.getmembers()}
        if "manifest.json" in names:
            return _docker_archive(path, tar, ref)
        if "oci-layout" in names:
            index = tar.extractfile(_member(tar, "index.json"))
            descriptors = json.load(index)["manifests"] if index else []
            name = _pick(descriptors, ref, path)
            return Source(ref=ref or name, skopeo_src=f"oci-archive:{path}:{name}")
    raise ArchiveError("a tar, but neither a docker save archive nor an OCI layout")


def _is_sif(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(41)[32:41] == b"SIF_MAGIC"


def _member(tar: tarfile.TarFile, name: str) -> tarfile.TarInfo:
    for candidate in (name, "./" + name):
        try:
            return tar.getmember(candidate)
        except KeyError:
            continue
    raise ArchiveError(f"no {name} in the archive")


def _docker_archive(path: Path, tar: tarfile.TarFile, ref: str | None) -> Source:
    f = tar.extractfile(_member(tar, "manifest.json"))
    entries: list[dict[str, Any]] = json.load(f) if f else []
    tags = [str(t) for e in entries for t in (e.get("RepoTags") or [])]
    if len(entries) == 1:
        name = ref or (tags[0] if tags else None)
        if name is None:
            raise ArchiveError("the archive names no image (no RepoTags): give --ref NAME")
        return Source(ref=name, skopeo_src=f"docker-archive:{path}")
    if ref is not None and ref in tags:
        return Source(ref=ref, skopeo_src=f"docker-archive:{path}:{ref}")
    raise ArchiveError(
        f"the archive holds {len(entries)} images: pick one with --ref ({', '.join(tags)})"
    )


def _oci_dir(path: Path, ref: str | None) -> Source:
    if not (path / "oci-layout").is_file():
        raise ArchiveError("a directory, but not an OCI image layout (no oci-layout file)")
    try:
        descriptors = index_manifests(path)
    except ManifestError as e:
        raise ArchiveError(str(e)) from e
    name = _pick(descriptors, ref, path)
    return Source(ref=ref or name, skopeo_src=f"oci:{path}:{name}" if name else f"oci:{path}")


def _pick(descriptors: list[dict[str, Any]], ref: str | None, path: Path) -> str:
    """The ref.name of the one image in an OCI index (or of the one ``ref`` names)."""
    names = [str((d.get("annotations") or {}).get(REF_NAME, "")) for d in descriptors]
    if not descriptors:
        raise ArchiveError("the OCI layout holds no image")
    if len(descriptors) == 1:
        if not names[0] and ref is None:
            raise ArchiveError("the OCI layout's image has no name: give --ref NAME")
        return names[0]
    if ref is not None and ref in names:
        return ref
    raise ArchiveError(
        f"the OCI layout holds {len(descriptors)} images: pick one with --ref ({', '.join(names)})"
    )
