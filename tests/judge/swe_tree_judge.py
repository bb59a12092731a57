"""A project's own tree as the judge's tests take it (tests/judge/test_swe_tree_judge.py): Django's
and SymPy's (tests/judge/swe_django_rows.py, tests/judge/swe_sympy_rows.py), each fetched by
scripts/images/fetch-test-sources.sh, with a bug, a row of SWE-bench's format for it, and the
patches its sabotages are made of.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Project:
    """One tree: how to make it, its row, its patches."""

    name: str
    runner: str  # the plan's runner its row must get
    fetched: Callable[[], bool]
    write_tree: Callable[[Path], str]  # the tree at a path, as a git repository; its sha
    write_deps: Callable[[Path], None]  # its dependencies at a path, for PYTHONPATH
    row: Callable[[str], dict[str, Any]]  # the row at a base commit
    gold_patch: Callable[[], str]
    patch: Callable[[Mapping[str, str | None]], str]  # the patch of edits of its text files
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    # Sabotage: edits of its tests and runner (the paths the judge puts back), the module
    # under test unfixed with code appended that forges the failing test's "ok" line, and with
    # code that makes its runner report every test as passed.
    edited: Mapping[str, str]
    unfixed: Callable[[], str]  # the module under test as the base commit has it
    function: str  # the function under test, in that module
    forged_ok: Callable[[], str]
    always_pass: Callable[[], str]
    source: str  # the module under test
