"""The HumanEval judge's candidate process (raas/judge/inside/humaneval.py ``Candidate``), run
on the host: why a solution failed is read even when its process ended before the first call
was written (the race that made a syntax error read as "the process ended" under load)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

INSIDE = Path(__file__).resolve().parents[2] / "raas" / "judge" / "inside"


@pytest.fixture
def humaneval() -> Iterator[ModuleType]:
    sys.path.insert(0, str(INSIDE))
    try:
        import humaneval as module

        yield module
    finally:
        sys.path.remove(str(INSIDE))


def test_a_solution_that_does_not_load_says_why_after_its_process_ended(
    humaneval: ModuleType, tmp_path: Path
) -> None:
    solution = tmp_path / "solution.py"
    solution.write_text("def f(x)\n    return x\n")
    candidate = humaneval.Candidate(str(solution), "f")
    try:
        candidate.process.wait(timeout=60)  # ended before any call was written: the race's side
        with pytest.raises(humaneval.CandidateFailed, match="SyntaxError"):
            candidate(1)
    finally:
        candidate.close()


def test_a_solution_that_loads_answers(humaneval: ModuleType, tmp_path: Path) -> None:
    solution = tmp_path / "solution.py"
    solution.write_text("def f(x):\n    return x + 1\n")
    candidate = humaneval.Candidate(str(solution), "f")
    try:
        assert candidate(1) == 2
    finally:
        candidate.close()
