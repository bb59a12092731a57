"""inside/swe_django.py, the image judge's runner for Django's tests, on its own: a stand-in
``tests/runtests.py`` that runs two unittest classes the way Django's runner does (a
TextTestRunner of verbosity 2, exit status 1 on a failure), under this Python and, where
pyenv has one, the Python 3.6 of SWE-bench's Django 3.x images. The Django tree itself runs in
the images tier (tests/judge/test_swe_tree_judge.py).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

INSIDE = Path(__file__).parents[2] / "raas" / "judge" / "inside"
OLD_PYTHON = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python3.6"
PYTHONS = [sys.executable] + ([str(OLD_PYTHON)] if OLD_PYTHON.exists() else [])

RUNTESTS = '''import sys
import unittest


class A(unittest.TestCase):
    def test_ok(self):
        pass

    def test_bad(self):
        """Doc line."""
        self.assertEqual(1, 2)


class B(unittest.TestCase):
    def test_skip(self):
        self.skipTest("no")

    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)


loader = unittest.TestLoader()
suite = unittest.TestSuite([loader.loadTestsFromTestCase(A), loader.loadTestsFromTestCase(B)])
result = unittest.TextTestRunner(verbosity=2).run(suite)
sys.exit(bool(result.failures or result.errors))
'''
CANARIES = [
    {"name": "test_c0", "passes": True, "a": 1, "b": 1},
    {"name": "test_c1", "passes": False, "a": "v1", "b": "v2"},
]


def ran(python: str, root: Path) -> tuple[dict[str, Any], str]:
    (root / "tests").mkdir()
    (root / "tests" / "runtests.py").write_text(RUNTESTS)
    request = {"mark": "m", "args": ["--verbosity", "2"], "canaries": CANARIES, "seed": 7}
    done = subprocess.run(
        [python, "-I", str(INSIDE / "swe_django.py"), "run"],
        input=json.dumps(request),
        cwd=root,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout), done.stderr


def spelled(method: str, where: str, python: str) -> str:
    """``str(test)`` as ``python`` writes it (3.11 adds the method after the class)."""
    modern = python == sys.executable and sys.version_info >= (3, 11)
    return f"{method} ({where}.{method})" if modern else f"{method} ({where})"


@pytest.mark.parametrize("python", PYTHONS)
def test_each_outcome_is_recorded_by_the_name_unittest_shows(python: str, tmp_path: Path) -> None:
    record, log = ran(python, tmp_path)
    assert record["mark"] == "m" and record["exit_code"] == 1  # sys.exit(True)
    outcomes = {name: category for name, _, category in record["outcomes"]}
    assert outcomes[spelled("test_ok", "__main__.A", python)] == "ok"
    assert outcomes["Doc line."] == "FAIL"  # a docstring's line, as the log shows it
    assert outcomes[spelled("test_skip", "__main__.B", python)] == "skipped"
    assert outcomes[spelled("test_sub", "__main__.B", python) + " (i=1)"] == "FAIL"
    assert spelled("test_sub", "__main__.B", python) not in outcomes  # failed, not a success
    assert log.index(">>>>> Start Test Output") < log.index("Doc line. ... FAIL")
    assert log.rstrip().endswith(">>>>> End Test Output")


@pytest.mark.parametrize("python", PYTHONS)
def test_canaries_run_between_classes_with_their_outcomes(python: str, tmp_path: Path) -> None:
    record, _ = ran(python, tmp_path)
    outcomes = {name: category for name, _, category in record["outcomes"]}
    placed = record["canaries"]
    assert outcomes[placed["test_c0"]] == "ok" and outcomes[placed["test_c1"]] == "FAIL"
    order = [name for name, _, _ in record["outcomes"]]
    a_tests = [i for i, n in enumerate(order) if "__main__.A" in n or n == "Doc line."]
    canaries = [order.index(placed[c]) for c in placed]
    assert not any(min(a_tests) < i < max(a_tests) for i in canaries)  # never inside a class


@pytest.mark.parametrize("program", ["probe.py", "results.py", "swe_django.py", "swe_sympy.py"])
def test_the_programs_of_old_images_read_as_python_35(program: str) -> None:
    ast.parse((INSIDE / program).read_text(), feature_version=(3, 5))
