"""A small real SymPy tree with a bug, as a SWE-bench row of ``sympy/sympy``: SymPy 1.12's own
package (from its source distribution, fetched once by scripts/images/fetch-test-sources.sh,
less its own test directories), a ``bin/test`` of our own (the source distribution ships none:
this one passes SWE-bench's options on to ``sympy.test`` as SymPy's script does), one test file,
the gold patch, the instance's test patch and its FAIL_TO_PASS / PASS_TO_PASS names as
SWE-bench's SymPy rows spell them (the test functions' names).

The bug: ``sympy.utilities.iterables.rotate_left`` lost its guard for an empty list
(``rotate_left([], 1)`` divides by zero). The test patch adds ``test_rotate_empty``, which
fails on it; ``test_rotate_left`` passes before and after (``test_rotate_right`` too, but as
the file's last test SWE-bench's parser never reads it, so a row of SWE-bench's does not name
it).
"""

from __future__ import annotations

import tarfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from raas.judge.swe_specs import SYMPY
from tests.judge.swe_django_rows import unpack_wheels
from tests.judge.swe_image_rows import ROOTFS, patch_of, write_repo
from tests.judge.swe_tree_judge import Project

FETCHED = ROOTFS.parent / "sympy"
SOURCE = "sympy/utilities/iterables.py"
TESTS = "sympy/utilities/tests/test_rotate.py"
GUARD = "    if len(x) == 0:\n        return []\n    y = y % len(x)\n    return x[y:] + x[:y]\n"
BIN_TEST = '''#!/usr/bin/env python
"""A stand-in for SymPy's bin/test: the options SWE-bench's command gives it, passed on to
sympy.test as SymPy's own script passes them."""

import os
import sys
from argparse import ArgumentParser

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

parser = ArgumentParser()
parser.add_argument("-v", "--verbose", action="store_true", default=False)
parser.add_argument("-C", "--no-cache", dest="cache", action="store_false", default=True)
parser.add_argument("paths", nargs="*")
options = parser.parse_args()
if not options.cache:
    os.environ["SYMPY_USE_CACHE"] = "no"

import sympy

ok = sympy.test(*options.paths, verbose=options.verbose)
sys.exit(0 if ok else 1)
'''
TEST_FILE = """from sympy.utilities.iterables import rotate_left, rotate_right


def test_rotate_left():
    assert rotate_left([0, 1, 2], 1) == [1, 2, 0]


def test_rotate_right():
    assert rotate_right([0, 1, 2], 1) == [2, 0, 1]
"""
# Not the file's last test: SymPy's reporter ends the last test's line with the file's [OK] or
# [FAIL], and SWE-bench's parser does not read that line (its rows name no such test).
TEST_PATCH_TESTS = TEST_FILE.replace(
    "\n\ndef test_rotate_right",
    "\n\ndef test_rotate_empty():\n    assert rotate_left([], 1) == []\n\n\ndef test_rotate_right",
)
FAIL_TO_PASS = ["test_rotate_empty"]
PASS_TO_PASS = ["test_rotate_left"]


def fetched() -> bool:
    return (FETCHED / ".raas-complete").exists()


@cache
def files() -> dict[str, bytes]:
    """The tree at its base commit: path -> content (the bug planted)."""
    (sdist,) = (FETCHED / "sdist").glob("sympy-*.tar.gz")
    out: dict[str, bytes] = {}
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            name = member.name.split("/", 1)[-1]
            kept = "/tests/" not in name and "/benchmarks/" not in name
            if member.isfile() and name.startswith("sympy/") and kept:
                extracted = archive.extractfile(member)
                assert extracted is not None
                out[name] = extracted.read()
    source = out[SOURCE].decode()
    assert GUARD in source, "the source distribution's rotate_left has changed"
    out[SOURCE] = source.replace(GUARD, GUARD.split("\n", 2)[2], 1).encode()
    out["bin/test"] = BIN_TEST.encode()
    out["sympy/utilities/tests/__init__.py"] = b""
    out[TESTS] = TEST_FILE.encode()
    return out


def unfixed() -> str:
    return files()[SOURCE].decode()


def fixed() -> str:
    return unfixed().replace(GUARD.split("\n", 2)[2], GUARD, 1)


def write_tree(root: Path) -> str:
    """The tree at ``root`` as a git repository of one commit; its sha."""
    for path, content in files().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)
    (root / "bin" / "test").chmod(0o755)
    return write_repo(root, {})


def write_deps(root: Path) -> None:
    """SymPy's dependency (mpmath) unpacked at ``root``, for PYTHONPATH."""
    unpack_wheels(FETCHED, root)


def sympy_patch(changes: Mapping[str, str | None]) -> str:
    text = {SOURCE: unfixed(), TESTS: TEST_FILE, "bin/test": BIN_TEST}
    return patch_of(changes, files=text)


def gold_patch() -> str:
    return sympy_patch({SOURCE: fixed()})


def instance_test_patch() -> str:
    return sympy_patch({TESTS: TEST_PATCH_TESTS})


def row(base_commit: str, **extra: Any) -> dict[str, Any]:
    """The tree as a row of SWE-bench's SymPy format (no eval_script: run as SWE-bench ran its
    SymPy rows)."""
    return {
        "instance_id": "sympy__sympy-99999",
        "repo": "sympy/sympy",
        "base_commit": base_commit,
        "version": "1.12",
        "problem_statement": "rotate_left([], 1) raises ZeroDivisionError instead of [].",
        "patch": gold_patch(),
        "test_patch": instance_test_patch(),
        "FAIL_TO_PASS": FAIL_TO_PASS,
        "PASS_TO_PASS": PASS_TO_PASS,
        **extra,
    }


# The unfixed module makes the reporter write "ok" for the failing test, so SWE-bench's parser
# reads the log as resolved.
FORGED_OK = """

import sympy.testing.runtests as _runtests

_exception = _runtests.PyTestReporter.test_exception


def _forged(self, exc_info):
    if getattr(self._active_f, "__name__", "") != "test_rotate_empty":
        return _exception(self, exc_info)
    self._exceptions.append((self._active_file, self._active_f, exc_info))
    self.write("ok", "Green")


_runtests.PyTestReporter.test_exception = _forged
"""
# Every failure and error reported as a pass (the log and the record agree): the must-fail
# canaries pass.
ALWAYS_PASS = """

import sympy.testing.runtests as _runtests

_runtests.PyTestReporter.test_fail = _runtests.PyTestReporter.test_pass
_runtests.PyTestReporter.test_exception = _runtests.PyTestReporter.test_pass
"""

PROJECT = Project(
    name="sympy",
    runner=SYMPY,
    fetched=fetched,
    write_tree=write_tree,
    write_deps=write_deps,
    row=row,
    gold_patch=gold_patch,
    patch=sympy_patch,
    fail_to_pass=FAIL_TO_PASS,
    pass_to_pass=PASS_TO_PASS,
    edited={TESTS: "def test_rotate_empty():\n    pass\n", "bin/test": "import sys\nsys.exit(0)\n"},
    unfixed=unfixed,
    function="rotate_left",
    forged_ok=lambda: unfixed() + FORGED_OK,
    always_pass=lambda: unfixed() + ALWAYS_PASS,
    source=SOURCE,
)
