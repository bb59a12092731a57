"""A sandbox of a config: the one place that maps each provider's config to its sandbox class.

The configs (``raas.sandbox.config``) are plain settings that the providers import; the choice
of a class lives here, above both, so that no provider and its config import each other.
"""

from __future__ import annotations

import shutil
from typing import assert_never

from raas.images.errors import ImageError
from raas.images.image import StoredImage
from raas.sandbox.apptainer import ApptainerSandbox, find_binary
from raas.sandbox.base import Sandbox
from raas.sandbox.bwrap import NO_BWRAP, BwrapSandbox
from raas.sandbox.client import SandboxError
from raas.sandbox.config import ApptainerConfig, BwrapConfig, LocalConfig, SandboxConfig
from raas.sandbox.local import LocalSandbox


def create_sandbox(config: SandboxConfig, image: StoredImage | None = None) -> Sandbox:
    """A sandbox of ``config``'s provider (not started yet); with ``image``, one whose root is
    that image's (bwrap: a copy-on-write overlay of its layers, ``raas.sandbox.rootfs``)."""
    match config:
        case BwrapConfig():
            return BwrapSandbox(config, image)
        case LocalConfig():
            if image is not None:
                raise ImageError(f"image {image.ref}: the local provider cannot run images")
            return LocalSandbox(config)
        case ApptainerConfig():
            return ApptainerSandbox(config, image)
        case _:
            assert_never(config)


def program_missing(provider: str) -> str | None:
    """Why a sandbox of ``provider`` ("bwrap", "apptainer", "local") cannot start on this host
    (its program is not installed), or None: said before a server starts, since every job
    that needs a sandbox would fail."""
    if provider == "bwrap":
        return None if shutil.which("bwrap") else NO_BWRAP
    if provider == "apptainer":
        try:
            find_binary(None)
        except SandboxError as e:
            return str(e)
    return None
