"""Plain values as tagged JSON: what crosses from a candidate's process to the judge's.

A candidate's return value is rebuilt on the judge's side from tags alone, as a builtin value
(bool, int, float, str, bytes, None, and lists, tuples, dicts, sets of them): an object whose
``__eq__`` says yes to anything, a subclass of ``int`` or a proxy cannot cross, because only
its tagged data does. Standard library only, Python 3.8 or newer: it runs in the sandbox too.
"""

from __future__ import annotations

import base64
from typing import Any

MAX_DEPTH = 100


class Unsupported(ValueError):
    """A value of a kind that does not cross (a function, a generator, a class instance)."""


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as tagged JSON; exact types only (a subclass of a builtin is refused)."""
    if depth > MAX_DEPTH:
        raise Unsupported(f"nested more than {MAX_DEPTH} deep")
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", repr(value.real), repr(value.imag)]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["B", base64.b64encode(value).decode()]
    if kind is list:
        return ["l", [encode(v, depth + 1) for v in value]]
    if kind is tuple:
        return ["t", [encode(v, depth + 1) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    if kind is set:
        return ["S", [encode(v, depth + 1) for v in value]]
    if kind is frozenset:
        return ["F", [encode(v, depth + 1) for v in value]]
    raise Unsupported(f"a value of type {kind.__name__}")


def decode(data: Any, depth: int = 0) -> Any:
    """The builtin value that ``data`` tags; anything malformed is ``Unsupported``."""
    if depth > MAX_DEPTH or not isinstance(data, list) or not data:
        raise Unsupported("not a tagged value")
    tag, rest = data[0], data[1:]
    try:
        if tag == "N":
            return None
        if tag == "b" and type(rest[0]) is bool:
            return bool(rest[0])
        if tag == "i":
            return int(str(rest[0]))
        if tag == "f":
            return float(str(rest[0]))
        if tag == "c":
            return complex(float(str(rest[0])), float(str(rest[1])))
        if tag == "s" and type(rest[0]) is str:
            return str(rest[0])
        if tag == "B":
            return base64.b64decode(str(rest[0]))
        if tag in ("l", "t", "S", "F"):
            items = [decode(v, depth + 1) for v in rest[0]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d":
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in rest[0]}
    except (IndexError, TypeError, ValueError) as e:
        raise Unsupported(f"malformed {tag!r} value: {e}") from None
    raise Unsupported(f"unknown tag {tag!r}")
