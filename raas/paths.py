"""Where raas keeps things on this host, the sandboxes' image, and how big an image may
unpack: the settings that the libraries (``raas.llm``, ``raas.sandbox``) read too, below the
server's ``raas.settings``.

``HostPaths`` and ``ImageCaps`` are the one declaration of these fields and their defaults;
``ServeSettings`` holds them as its ``paths`` and ``images`` groups (so ``raas serve`` takes them
from its file, the environment or its flags), and a library reads them with ``host_paths()``
and ``image_caps()``: those a server ``installed``, else the same ``RAAS_<FIELD>`` variables
(``RAAS_CACHE_DIR``, ``RAAS_IMAGE_STORE``, ``RAAS_LAYER_MAX_BYTES``, ...). Nothing else in raas
reads these variables.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.config import JsonDict

ENV_PREFIX = "RAAS_"
# A path setting that names a directory, made when needed (so no DirectoryPath): its flag
# takes a directory.
DIRECTORY: JsonDict = {"directory": True}


def _home_cache() -> Path:
    return Path.home() / ".cache" / "raas"


class HostPaths(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cache_dir: Path = Field(
        default_factory=_home_cache,
        json_schema_extra=DIRECTORY,
        description="raas's cache: converted models, and (unless set apart) the image store"
        " (oci) and apptainer images (images).  [default: ~/.cache/raas]",
    )
    image_store: Path | None = Field(
        default=None,
        json_schema_extra=DIRECTORY,
        description="The OCI image store's directory, one per node, shared by its servers"
        " (raas images).  [default: oci in --cache-dir]",
    )
    image_store_group: str | None = Field(
        default=None,
        description="A group (name or gid) that may read the image store: its root 0750, its"
        " layers readable by the group, so servers of several users on a node can share one.",
    )
    apptainer_images: Path | None = Field(
        default=None,
        json_schema_extra=DIRECTORY,
        description="The directory of apptainer images (SIFs and sandbox directories) that"
        " --sandbox apptainer looks names up in.  [default: images in --cache-dir]",
    )
    apptainer_image: str | None = Field(
        default=None,
        description="The image --sandbox apptainer runs: a name in --apptainer-images, or a path.",
    )
    sandbox_dir: Path | None = Field(
        default=None,
        json_schema_extra=DIRECTORY,
        description="The directory the sandboxes' runtime root (raas-UID) is made in; put it on"
        " disk where $XDG_RUNTIME_DIR is a small tmpfs.  [default: $XDG_RUNTIME_DIR (not as"
        " root), else the temporary directory]",
    )

    def store_dir(self) -> Path:
        """The image store: ``image_store``, else ``oci`` in the cache."""
        return (self.image_store or self.cache_dir / "oci").expanduser()

    def images_dir(self) -> Path:
        """Apptainer's images: ``apptainer_images``, else ``images`` in the cache."""
        return (self.apptainer_images or self.cache_dir / "images").expanduser()

    def models_dir(self) -> Path:
        """Where converted models live: the cache itself."""
        return self.cache_dir.expanduser()


def env_name(field: str) -> str:
    """The environment variable of a settings field: ``RAAS_<FIELD>``."""
    return ENV_PREFIX + field.upper()


GiB = 1 << 30
_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)


class ImageCaps(BaseModel):
    """What a layer, and an image's layers together, may unpack to when the image store takes
    an image in: the tar stream's bytes (its files' data and headers; a sparse file counts its
    whole size) and its entries. Generous defaults: the largest images run in RL (CUDA's)
    unpack to about 20 GiB and 500,000 entries."""

    model_config = ConfigDict(extra="forbid")

    layer_max_bytes: int = Field(
        default=16 * GiB, gt=0, description="Bytes one layer may unpack to (16G, 512M, or bytes)."
    )
    layer_max_entries: int = Field(
        default=1_000_000, gt=0, description="Entries (files, directories, links) of one layer."
    )
    image_max_bytes: int = Field(
        default=64 * GiB, gt=0, description="Bytes an image's layers together may unpack to."
    )
    image_max_entries: int = Field(
        default=4_000_000, gt=0, description="Entries of an image's layers together."
    )

    @field_validator("layer_max_bytes", "image_max_bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        """``16G``, ``512M``, ``4KiB`` (binary units) or a number of bytes."""
        found = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
        if found is None:
            return value
        shift = 10 * ("KMGT".find(found[2].upper()) + 1) if found[2] else 0
        return int(found[1]) << shift


Group = TypeVar("Group", HostPaths, ImageCaps)
_installed: dict[type[BaseModel], BaseModel] = {}


@contextlib.contextmanager
def installed(*groups: HostPaths | ImageCaps) -> Iterator[None]:
    """Make these this process's while it lasts, as ``host_paths()`` and ``image_caps()``
    answer: ``raas serve`` installs its settings' (from its flags, file or environment), so
    that every library in its process (the model cache, the image store, the sandboxes' runtime
    root) reads those."""
    before = dict(_installed)
    _installed.update({type(group): group for group in groups})
    try:
        yield
    finally:
        _installed.clear()
        _installed.update(before)


def _read(model: type[Group], environ: Mapping[str, str] | None) -> Group:
    """``model``'s installed value, else from the environment (an empty variable is unset),
    else its defaults; a ValueError names the variable that is wrong."""
    installed = _installed.get(model) if environ is None else None
    if isinstance(installed, model):
        return installed
    environ = os.environ if environ is None else environ
    given = {name: environ.get(env_name(name), "").strip() for name in model.model_fields}
    given = {k: v for k, v in given.items() if v}
    try:
        return model.model_validate(given)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        raise ValueError(f"{env_name(name)}={given.get(name)!r}: {err['msg']}") from None


def host_paths(environ: Mapping[str, str] | None = None) -> HostPaths:
    """This process's paths (``installed``, else ``RAAS_*``, else the defaults)."""
    return _read(HostPaths, environ)


def image_caps(environ: Mapping[str, str] | None = None) -> ImageCaps:
    """This process's image caps (``installed``, else ``RAAS_*``, else the defaults)."""
    return _read(ImageCaps, environ)
