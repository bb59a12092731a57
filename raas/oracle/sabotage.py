"""Wrong answers on purpose: which tasks the oracle sabotages, and how.

Whether a task is sabotaged, and in which way, is a hash of the seed and its instance id: the
same seed gives the same choice in every process, so a test knows in advance which rollouts must
score 0.0. The ways are the mistakes a policy makes and the shortcuts it may find:

- code: ``wrong_value`` (the canonical solution, wrapped so that every result is off: a flipped
  bool, n + 1, a longer list), ``syntax_error``, ``exit_early`` (no solution; the module prints
  the judge's success line and exits 0 before any test runs);
- swe: ``broken_patch`` (the gold patch with a context line changed: it does not apply),
  ``wrong_fix`` (the gold patch, then the function wrapped as above), ``edit_tests`` (the source
  untouched; the failing tests' bodies replaced by ``pass``);
- math: ``wrong_value`` (the computed answer + 1), ``hedge`` (the wrong and the right answer);
- stem: ``wrong_value`` (the next letter, or the number off by five times the tolerance),
  ``hedge``;
- harbor: ``no_op`` (finish at once: the environment as built must score 0).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from fractions import Fraction

SABOTAGES: dict[str, tuple[str, ...]] = {
    "code": ("wrong_value", "syntax_error", "exit_early"),
    "swe": ("broken_patch", "wrong_fix", "edit_tests"),
    "math": ("wrong_value", "hedge"),
    "stem": ("wrong_value", "hedge"),
    "harbor": ("no_op",),
}


def _unit(*parts: object) -> float:
    """A number in [0, 1) that depends only on ``parts``."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def sabotage_of(kind: str, instance_id: str, fraction: float, seed: int) -> str | None:
    """How the task ``instance_id`` is sabotaged (one of ``SABOTAGES[kind]``), or None.

    A task is sabotaged when a hash of (seed, id) falls below ``fraction``: 0 never, 1 always.
    """
    if fraction <= 0 or _unit(seed, instance_id) >= fraction:
        return None
    ways = SABOTAGES[kind]
    return ways[int(_unit(seed, instance_id, "way") * len(ways))]


# The wrapper that makes a function's every result wrong; ``{name}`` is the function.
WRONG_RESULTS = '''

def _oracle_wrong(value):
    """Near the right result, never equal to it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "?"
    if isinstance(value, list):
        return value + [value[0] if value else 0]
    if isinstance(value, tuple):
        return value + (None,)
    if isinstance(value, dict):
        return dict(value, _oracle_wrong=True)
    return [value]


_oracle_right = {name}


def {name}(*args, **kwargs):
    return _oracle_wrong(_oracle_right(*args, **kwargs))
'''

EXIT_EARLY = "    return None\n\n\nprint('ALL TESTS PASSED')\nraise SystemExit(0)\n"


def code_body(way: str | None, canonical: str, name: str) -> str:
    """What the oracle writes after HumanEval's prompt: the canonical body, or a wrong one."""
    if way is None:
        return canonical
    if way == "wrong_value":
        return canonical + WRONG_RESULTS.format(name=name)
    if way == "syntax_error":
        return canonical + "    return ((\n"
    if way == "exit_early":
        return EXIT_EARLY
    raise ValueError(f"no code sabotage {way!r}")


def broken_patch(patch: str) -> str:
    """``patch`` with its first removed line changed, so that its context no longer matches."""
    lines = patch.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("-") and not line.startswith("---"):
            lines[i] = line + "  # not what the file says"
            return "\n".join(lines)
    raise ValueError("the patch removes no line")


def patched_file(patch: str) -> str:
    """The file a one-file patch changes (``+++ b/PATH``)."""
    match = re.search(r"^\+\+\+ b/(\S+)$", patch, re.MULTILINE)
    if match is None:
        raise ValueError("the patch names no file")
    return match.group(1)


def append_command(path: str, text: str) -> str:
    """A one-line bash command that appends ``text`` to ``path`` (no heredoc: one line each)."""
    lines = " ".join(shlex.quote(line) for line in text.split("\n"))
    return f"printf '%s\\n' {lines} >> {shlex.quote(path)}"


def test_method_bodies(source: str, names: list[str]) -> list[tuple[str, str]]:
    """``(old, new)`` edits that replace the body of each test method ``names`` by ``pass``."""
    edits = []
    for name in names:
        match = re.search(
            rf"^(?P<head>(?P<indent>[ \t]+)def {re.escape(name)}\(self\):\n)"
            rf"(?P<body>(?P<inner>(?P=indent)[ \t]+).*\n(?:(?P=indent)[ \t]+.*\n)*)",
            source,
            re.MULTILINE,
        )
        if match is None:
            raise ValueError(f"no test method {name}")
        edits.append((match.group(0), f"{match.group('head')}{match.group('inner')}pass\n"))
    return edits


def wrong_number(value: str) -> str:
    """A math answer (an integer or a fraction) plus one."""
    return str(Fraction(value) + 1)


def wrong_letter(letter: str, letters: list[str]) -> str:
    ordered = sorted(letters)
    return ordered[(ordered.index(letter) + 1) % len(ordered)]


def off_by_tolerance(value: float, rel_tol: float) -> str:
    """A number five tolerances away from ``value`` (1 away from 0)."""
    wrong = value * (1 + 5 * max(rel_tol, 1e-3)) if value else 1.0
    return f"{wrong:.6g}"


def hedge(wrong: str, right: str) -> str:
    return f"{wrong} or {right}"
