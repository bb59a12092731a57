"""Suggestions for a mistyped name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the choice closest to a mistyped ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""
