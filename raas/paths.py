"""Where raas keeps things on this host, and the sandboxes' image: the settings that the
libraries (``raas.llm``, ``raas.sandbox``) read too, below the server's ``raas.settings``.

``HostPaths`` is the one declaration of these fields and their defaults; ``ServeSettings``
holds it as its ``paths`` group (so ``raas serve`` takes them from its file, the environment or
its flags), and a library used on its own reads them with ``host_paths()``: from the same
``RAAS_<FIELD>`` variables (``RAAS_CACHE_DIR``, ``RAAS_IMAGE_STORE``, ...), the only place
outside the settings that reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
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


_installed: HostPaths | None = None


def install(paths: HostPaths) -> None:
    """Make ``paths`` this process's, as ``host_paths()`` answers: ``raas serve`` installs its
    settings' (from its flags, file or environment), so that every library in its process
    (the model cache, the image store, the sandboxes' runtime root) reads those."""
    global _installed
    _installed = paths


def host_paths(environ: Mapping[str, str] | None = None) -> HostPaths:
    """This process's paths: those ``install``ed, else from the environment (an empty variable
    is unset), else their defaults."""
    if environ is None and _installed is not None:
        return _installed
    environ = os.environ if environ is None else environ
    given = {name: environ.get(env_name(name), "") for name in HostPaths.model_fields}
    return HostPaths.model_validate({k: v for k, v in given.items() if v})
