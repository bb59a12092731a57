"""What the image store hands a sandbox: an image's unpacked layers and its run settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class StoredImage:
    """An image in the store, ready to be a sandbox's root.

    ``layers`` are the unpacked layer directories, bottom first (overlayfs takes them top
    first), each shared with every other image that holds the same layer; whiteouts in them are
    overlayfs whiteouts. ``env``, ``workdir`` and ``user`` are the image config's ``Env``,
    ``WorkingDir`` and ``User``; ``command`` its ``Entrypoint`` then ``Cmd`` (what a container
    of it would run: raas starts it only where a task asks, as a Harbor task's service).
    """

    ref: str
    digest: str  # the manifest's digest, sha256:...
    layers: tuple[Path, ...]
    env: tuple[str, ...] = ()
    workdir: str = "/"
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
