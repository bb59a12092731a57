"""Which image a SWE-bench, SWE-Gym or R2E-Gym row runs in.

A row names its image as its dataset does: ``image_name`` (SWE-bench's own rows of swebench 5,
mini-swe-agent's convention), ``docker_image`` (R2E-Gym), or ``image`` (the field swebench 5's
task repositories write). A row that names none is a SWE-Gym row: SWE-Gym's images are the ones
OpenHands built, ``xingyaoww/sweb.eval.x86_64.<instance_id>`` with ``__`` written ``_s_``
(Docker refuses a double underscore in a name), lower case, as OpenHands' ``run_infer.py``
derives them. SWE-bench's own images are named ``swebench/sweb.eval.x86_64.<instance_id with
_1776_ for __>:latest`` (``swebench.task.checks.expected_image``); a SWE-bench row without an
image field gets them by naming one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IMAGE_FIELDS = ("image_name", "docker_image", "image")
SWE_GYM_PREFIX = "xingyaoww/sweb.eval.x86_64."


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
