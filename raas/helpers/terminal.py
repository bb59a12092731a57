"""Text for a terminal: a job's or a server's made safe to print, counts as a person writes them."""

from __future__ import annotations

import re

# What a terminal acts on instead of showing: C0 and C1 controls (ESC starts a sequence that can
# retitle the window, move the cursor, write the clipboard), DEL, and the bidirectional marks
# and overrides that reorder the text around them.
CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(value: object) -> str:
    """Text from a job or a server (an instance id, a data_source, an error message) that is
    safe to print on a terminal: each control character shown as its escape (``\\x1b``)."""
    return CONTROL_CHARACTERS.sub(lambda m: ascii(m.group())[1:-1], str(value))


def counted(n: int, noun: str) -> str:
    """``1 result``, ``2 results``: a count and its noun, as a person writes them."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
