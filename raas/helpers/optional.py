"""Reading a model field's annotation: ``X | None`` as ``X``."""

from __future__ import annotations

import types
import typing
from typing import Any


def without_none(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` as ``(X, True)``; anything else as ``(annotation, False)`` (a union of
    several types other than None stays as it is)."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return annotation, False
    args = typing.get_args(annotation)
    rest = [a for a in args if a is not type(None)]
    if len(rest) != 1:
        return annotation, False
    return rest[0], len(rest) < len(args)
