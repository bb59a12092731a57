"""Where the engine may load weights from: the directories it was given, and nothing else.

A path is resolved with every symbolic link followed before it is compared, so a link inside
an allowed directory that points outside is refused like the path it points to; so is every
file a checkpoint names (a sharded index may name ``../../anything``). A refused path gets the
same answer whether or not it exists, so the engine tells nobody what lies outside.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REFUSED = "the engine loads weights only from its weight directories (raas engine --weights-dir)"


class PathRefused(Exception):
    """A path outside the allowed directories (its message names no path)."""

    def __init__(self) -> None:
        super().__init__(REFUSED)


@dataclass(frozen=True)
class WeightDirs:
    roots: tuple[Path, ...]

    @classmethod
    def of(cls, dirs: Iterable[str | Path]) -> WeightDirs:
        return cls(tuple(Path(d).expanduser().resolve() for d in dirs))

    def check(self, path: str | Path) -> Path:
        """``path`` with its links followed, if it lies inside an allowed directory; else
        :class:`PathRefused`."""
        try:
            real = Path(path).expanduser().resolve()
        except (OSError, RuntimeError) as e:  # a loop of links (RuntimeError before 3.13)
            raise PathRefused from e
        if any(real.is_relative_to(root) for root in self.roots):
            return real
        raise PathRefused
