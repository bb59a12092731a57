"""Image references as Docker spells them out: ``ubuntu`` is ``docker.io/library/ubuntu:latest``.

The store keys images by the normalised reference, so a task naming ``ubuntu`` finds the image
pulled as ``docker.io/library/ubuntu:latest`` and the other way round.
"""

from __future__ import annotations

import re

_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@+]*$")


def normalize(ref: str) -> str:
    """``NAME[:TAG][@DIGEST]`` with the registry, ``library/`` and ``:latest`` made explicit."""
    ref = ref.strip().removeprefix("docker://")
    if not _VALID.match(ref) or "//" in ref:
        raise ValueError(f"not an image reference: {ref!r}")
    name, at, digest = ref.partition("@")
    first, slash, rest = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = "docker.io", name
        if "/" not in rest:
            rest = "library/" + rest
    last = rest.rsplit("/", 1)[-1]
    if ":" not in last and not at:
        rest += ":latest"
    return f"{first}/{rest}{at}{digest}"
