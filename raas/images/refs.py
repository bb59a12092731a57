"""Image references: how Docker spells a name out, and which image a SWE row names.

Pure functions on the standard library, kept here once because three layers that may not import
each other need them: the sandbox's image store keys images by ``normalize``'s spelling, the swe
task finds a row's image with ``image_of``, and the trainer's client sends a job to a server whose
node holds ``normalize(image_of(instance))`` (its placement).

``normalize``: ``ubuntu`` is ``docker.io/library/ubuntu:latest``, so a task naming ``ubuntu`` finds
the image pulled as ``docker.io/library/ubuntu:latest`` and the other way round.

``image_of``: a row names its image as its dataset does: ``image_name`` (SWE-bench's own rows of
swebench 5, mini-swe-agent's convention), ``docker_image`` (R2E-Gym), or ``image`` (the field
swebench 5's task repositories write). A row that names none is a SWE-Gym row: SWE-Gym's images
are the ones OpenHands built, ``xingyaoww/sweb.eval.x86_64.<instance_id>`` with ``__`` written
``_s_`` (Docker refuses a double underscore in a name), lower case, as OpenHands' ``run_infer.py``
derives them. SWE-bench's own images are named ``swebench/sweb.eval.x86_64.<instance_id with
_1776_ for __>:latest`` (``swebench.task.checks.expected_image``); a SWE-bench row without an
image field gets them by naming one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

IMAGE_FIELDS = ("image_name", "docker_image", "image")
SWE_GYM_PREFIX = "xingyaoww/sweb.eval.x86_64."

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


def swe_gym_image(instance_id: str) -> str:
    """SWE-Gym's image of an instance (``getmoto__moto-5752`` ->
    ``xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752``)."""
    return (SWE_GYM_PREFIX + instance_id.replace("__", "_s_")).lower()


def image_of(row: Mapping[str, Any]) -> str | None:
    """The image ``row`` names, SWE-Gym's for its ``instance_id`` if it names none, or None
    for a row that is neither (no image, no id)."""
    for key in IMAGE_FIELDS:
        value = row.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    instance_id = row.get("instance_id")
    if isinstance(instance_id, str) and instance_id:
        return swe_gym_image(instance_id)
    return None


def stored_name_of(row: Mapping[str, Any]) -> str | None:
    """The name an image store keys ``row``'s image by (``normalize(image_of(row))``); None for
    a row that names no image or one that is not a reference."""
    image = image_of(row)
    if image is None:
        return None
    try:
        return normalize(image)
    except ValueError:
        return None
