"""Reading an image's manifest and config out of an OCI blob directory (image-spec v1)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
REF_NAME = "org.opencontainers.image.ref.name"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class ManifestError(Exception):
    """A manifest or config the store cannot read."""


@dataclass(frozen=True)
class Layer:
    digest: str  # of the blob as stored (compressed or not)
    media_type: str
    diff_id: str  # of the uncompressed tar, from the config

    @property
    def key(self) -> str:
        """The layer's directory name: its diff_id, so one content is unpacked once."""
        return self.diff_id.replace(":", "-")


@dataclass(frozen=True)
class Image:
    """A manifest with what its config says."""

    digest: str
    config_digest: str
    layers: tuple[Layer, ...]
    env: tuple[str, ...] = ()
    workdir: str = "/"
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()  # Entrypoint then Cmd: what a container of it would run

    @property
    def blobs(self) -> tuple[str, ...]:
        return (self.digest, self.config_digest, *(layer.digest for layer in self.layers))


def blob_path(blob_dir: Path, digest: str) -> Path:
    if not _DIGEST.match(digest):
        raise ManifestError(f"not a sha256 digest: {digest!r}")
    return blob_dir / "sha256" / digest.removeprefix("sha256:")


def read_json(blob_dir: Path, digest: str) -> dict[str, Any]:
    path = blob_path(blob_dir, digest)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError as e:
        raise ManifestError(f"blob {digest} is missing from the store") from e
    except ValueError as e:
        raise ManifestError(f"blob {digest} is not JSON") from e
    if not isinstance(data, dict):
        raise ManifestError(f"blob {digest} is not a JSON object")
    return data


def read_image(blob_dir: Path, digest: str) -> Image:
    """The image whose manifest is blob ``digest``."""
    manifest = read_json(blob_dir, digest)
    media_type = manifest.get("mediaType", MANIFEST)
    if media_type not in (MANIFEST, DOCKER_MANIFEST):
        raise ManifestError(f"manifest {digest} is a {media_type}, not an image manifest")
    try:
        config_digest = manifest["config"]["digest"]
        descriptors = manifest.get("layers") or []
        config = read_json(blob_dir, config_digest)
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if len(diff_ids) != len(descriptors):
            raise ManifestError(
                f"manifest {digest} has {len(descriptors)} layers, its config {len(diff_ids)}"
            )
        layers = tuple(
            Layer(digest=str(d["digest"]), media_type=str(d.get("mediaType", "")), diff_id=str(i))
            for d, i in zip(descriptors, diff_ids, strict=True)
        )
        for layer in layers:
            blob_path(blob_dir, layer.diff_id)  # a sha256 digest, or the key would be unsafe
        run = config.get("config") or {}
        return Image(
            digest=digest,
            config_digest=config_digest,
            layers=layers,
            env=tuple(str(e) for e in run.get("Env") or ()),
            workdir=str(run.get("WorkingDir") or "/"),
            user=str(run.get("User") or ""),
            labels={str(k): str(v) for k, v in (run.get("Labels") or {}).items()},
            command=tuple(
                str(a) for a in [*(run.get("Entrypoint") or ()), *(run.get("Cmd") or ())]
            ),
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise ManifestError(f"manifest {digest} or its config is malformed ({e})") from e


def index_manifests(layout: Path) -> list[dict[str, Any]]:
    """The manifest descriptors an OCI layout's index.json lists."""
    try:
        index = json.loads((layout / "index.json").read_text())
    except FileNotFoundError:
        return []
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise ManifestError(f"{layout}/index.json has no manifests list")
    return [m for m in manifests if isinstance(m, dict)]
