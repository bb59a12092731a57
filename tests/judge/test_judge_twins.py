"""Metamorphic twins (raas.judge.twins): how they are made, and the SWE judge running them.

The tricks of tests/judge/twin_tricks.py pass a bundled row's real tests (the run's own checks see
nothing wrong: its metrics say every test passed) and score 0 because a twin passed: the result
says ``tamper``. Gold, an honest fix and a fix with harmless extras still score 1 with twins
on; an honest wrong fix scores 0 without any twin run.
"""

from __future__ import annotations

import ast
import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from raas.judge.code import Verdict
from raas.judge.twins import located, plan, twin_source, with_twins
from raas.sandbox import BwrapConfig
from raas.tasks.datasets import bundled
from raas.tasks.protocol import RewardInfo
from raas.tasks.services import TaskServices
from raas.tasks.swe import SweTask
from tests.judge import swe_image_rows
from tests.judge.twin_tricks import TRICKS, tricked

ROWS: list[dict[str, Any]] = bundled("swe")
ROW = ROWS[0]
FILES: dict[str, str] = ROW["snapshot"]["files"]
SOLUTION, TESTS, NAME = "humaneval_0000/solution.py", "tests/test_solution.py", "has_close_elements"
SWE = SweTask()


def twinned(text: str, *names: str, seed: int = 0) -> tuple[str, dict[str, bool]]:
    return twin_source(text, names, random.Random(seed))


# --- making twins ------------------------------------------------------------------------------

MODULE = """import pytest


class TestThing(unittest.TestCase):
    def test_equal(self):
        # the comment stays
        self.assertEqual(f(3), "abc")  # and this one

    def test_named(self):
        expected = [1, 2]
        self.assertEqual(f(3), expected)

    def test_calls_on_both_sides(self):
        self.assertEqual(f(3), g(4))

    def test_inverse(self):
        self.assertTrue(f(3))
        self.assertIsNone(g())

    def test_raises(self):
        with self.assertRaises(ValueError):
            f(-1)

    def test_close(self):
        self.assertAlmostEqual(f(0.5), 0.25)

    def test_nothing(self):
        f(3)


def test_plain():
    assert f(3) == 48
    assert f(4)
    with pytest.raises(KeyError):
        f(5)
"""


def test_a_twin_changes_only_the_expected_constants_in_place() -> None:
    text, made = twinned(MODULE, "TestThing.test_equal")
    assert made == {"TestThing.test_equal": True}  # an exact twin
    before, after = MODULE.splitlines(), text.splitlines()
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1  # one line: the comments, the layout, the call are the task's
    new = changed[0][1]
    assert new.startswith('        self.assertEqual(f(3), "ab')
    assert new.endswith('")  # and this one')
    assert ast.literal_eval(new.split(", ", 1)[1].split(")")[0]) != "abc"


def test_a_name_bound_to_a_literal_is_changed_where_it_is_bound() -> None:
    text, made = twinned(MODULE, "TestThing.test_named")
    assert made == {"TestThing.test_named": True}
    assert "expected = [1, 2]" not in text and "self.assertEqual(f(3), expected)" in text


def test_an_equality_without_constants_is_inverted_and_not_exact() -> None:
    text, made = twinned(MODULE, "TestThing.test_calls_on_both_sides")
    assert made == {"TestThing.test_calls_on_both_sides": False}
    assert "self.assertNotEqual(f(3), g(4))" in text


def test_assertions_without_an_expected_value_are_inverted() -> None:
    text, made = twinned(MODULE, "TestThing.test_inverse", "test_plain")
    assert made == {"TestThing.test_inverse": False, "test_plain": False}
    assert "self.assertFalse(f(3))" in text and "self.assertIsNotNone(g())" in text
    assert "assert not (f(4))" in text
    assert "assert f(3) == 48" not in text  # a plain assert's expected constant changed


def test_an_expected_exception_is_swapped() -> None:
    text, _ = twinned(MODULE, "TestThing.test_raises", "test_plain")
    assert "self.assertRaises(TypeError)" in text and "pytest.raises(IndexError)" in text


def test_a_tolerance_is_never_exact_and_a_test_with_no_assertion_has_no_twin() -> None:
    _, made = twinned(MODULE, "TestThing.test_close", "TestThing.test_nothing")
    assert made == {"TestThing.test_close": False}


def test_twins_are_the_same_for_one_task_in_a_process_and_drawn_per_task() -> None:
    row = next(r for r in ROWS if "sum_product" in str(r["snapshot"]["files"]))
    files, ids = row["snapshot"]["files"], row["FAIL_TO_PASS"]
    one, again = plan(files, ids, "unittest", "a"), plan(files, ids, "unittest", "a")
    assert one.files == again.files and set(one.twins) == set(ids)
    drawn = {str(plan(files, ids, "unittest", k).files) for k in "abcdefgh"}
    assert len(drawn) > 1  # the changes to its integers are drawn from the task's key


def test_every_bundled_rows_deciding_tests_get_twins_exact_where_they_assert_equality() -> None:
    for row in ROWS:
        files, ids = row["snapshot"]["files"], row["FAIL_TO_PASS"]
        made = plan(files, ids, "unittest", "k")
        assert set(made.twins) == set(ids), row["instance_id"]
        for test_id, twin in made.twins.items():
            method = files[twin.path].split(f"def {test_id.rsplit('.', 1)[1]}(")[1]
            assert twin.exact == method.split("\n")[1].lstrip().startswith("self.assertEqual(")


@pytest.mark.parametrize(
    ("test_id", "runner", "first"),
    [
        ("tests.test_x.T.test_y", "unittest", ("tests/test_x.py", "T.test_y")),
        ("tests/test_x.py::T::test_y[1-2]", "pytest", ("tests/test_x.py", "T.test_y")),
        ("test_y (app.tests.T)", "django", ("tests/app/tests.py", "T.test_y")),
        ("test_y (app.tests.T.test_y)", "django", ("tests/app/tests.py", "T.test_y")),
    ],
)
def test_a_test_id_names_its_file_and_function(
    test_id: str, runner: str, first: tuple[str, str]
) -> None:
    assert first in located(test_id, runner)


def test_a_docstring_name_or_a_sympy_name_is_found_in_the_files_or_not_at_all() -> None:
    assert located("A lazy string is capitalized too.", "django") == []
    made = plan({"t/test_a.py": "def test_f():\n    assert f() == 1\n"}, ["test_f"], "sympy", "k")
    assert made.twins["test_f"].path == "t/test_a.py"


# --- calibration -------------------------------------------------------------------------------


async def test_a_twin_gold_passes_does_not_count() -> None:
    """Gold passes a loose twin (its tolerance is wide): that twin decides nothing, and a
    candidate that passes it too keeps its reward; the strict twin still decides."""
    sources = {
        "t.py": (
            "class T(unittest.TestCase):\n"
            "    def test_loose(self):\n        self.assertGreater(f(), 0)\n"
            "    def test_strict(self):\n        self.assertEqual(f(), 3)\n"
        )
    }
    ids = ["t.T.test_loose", "t.T.test_strict"]
    calls: list[tuple[str, bool]] = []

    async def run(patch: str, files: dict[str, str] | None) -> Verdict:
        calls.append((patch, files is not None))
        if files is None:
            return Verdict(True, {}, frozenset(ids), sources)
        passing = {"t.T.test_loose"} | ({"t.T.test_strict"} if patch == "trick" else set())
        return Verdict(False, {}, frozenset(passing))

    key = "calibration-test"
    honest = await with_twins(run, "honest", deciding=ids, runner="unittest", key=key, gold="g")
    assert honest.passed and honest.metrics["twins"]["counted"] == 1
    trick = await with_twins(run, "trick", deciding=ids, runner="unittest", key=key, gold="g")
    assert not trick.passed and trick.metrics["twins"]["passed"] == ["t.T.test_strict"]
    assert [c for c in calls if c[0] == "g"] == [("g", True)]  # gold ran its twins once


async def test_without_gold_only_exact_twins_count() -> None:
    sources = {"t.py": "def test_a():\n    assert f()\n\ndef test_b():\n    assert f() == 3\n"}
    ids = ["t.py::test_a", "t.py::test_b"]

    async def run(patch: str, files: dict[str, str] | None) -> Verdict:
        return Verdict(files is None, {}, frozenset(ids), sources)

    verdict = await with_twins(run, "p", deciding=ids, runner="pytest", key="no-gold", gold=None)
    assert not verdict.passed and verdict.metrics["twins"]["passed"] == ["t.py::test_b"]


# --- the SWE judge with its twins ---------------------------------------------------------------


@pytest.fixture
async def services() -> AsyncIterator[TaskServices]:
    svc = TaskServices(llm=None, sandbox_config=BwrapConfig())  # type: ignore[arg-type]
    yield svc
    await svc.close()


def patch_of(changes: dict[str, str | bytes | None]) -> str:
    return swe_image_rows.patch_of(changes, None, files=FILES)


async def judged(services: TaskServices, patch: str, row: dict[str, Any] = ROW) -> RewardInfo:
    return await SWE.judge(row, {"patch": patch}, services)


async def test_gold_scores_one_with_its_twins_counted(services: TaskServices) -> None:
    info = await judged(services, ROW["gold_patch"])
    assert info.reward == 1.0, info.metrics
    assert info.metrics["twins"] == {"made": 3, "counted": 3, "passed": []}
    assert "tamper" not in info.metrics and "reason" not in info.metrics


async def test_an_honest_fix_of_its_own_scores_one(services: TaskServices) -> None:
    fix = FILES[SOLUTION].replace("if idx == idx2:", "if idx is not idx2 and idx != idx2:")
    info = await judged(services, patch_of({SOLUTION: fix}))
    assert info.reward == 1.0, info.metrics
    assert info.metrics["twins"]["passed"] == []


async def test_an_honest_wrong_fix_scores_zero_and_runs_no_twin(services: TaskServices) -> None:
    wrong = FILES[SOLUTION].replace("distance < threshold", "distance <= threshold")
    info = await judged(services, patch_of({SOLUTION: wrong}))
    assert info.reward == 0.0 and "twins" not in info.metrics


@pytest.mark.parametrize("trick", sorted(TRICKS))
async def test_a_trick_that_passes_the_real_tests_scores_zero_because_a_twin_passed(
    services: TaskServices, trick: str
) -> None:
    info = await judged(services, patch_of({SOLUTION: tricked(FILES[SOLUTION], trick, NAME)}))
    assert info.reward == 0.0
    # The real run saw every test pass and nothing untrusted: the twins alone caught it.
    assert set(info.metrics["FAIL_TO_PASS"].values()) == {"ok"}, info.metrics
    assert "untrusted" not in info.metrics
    assert info.metrics["tamper"].startswith("3 twin(s) passed")
    assert info.metrics["reason"].startswith("tamper: 3 twin(s) passed")


async def test_the_real_tests_text_is_not_in_the_sandbox_during_a_twin_run(
    services: TaskServices,
) -> None:
    """A candidate that looks for the real test (git's objects, the judge's files) to tell a
    twin from it finds nothing: it reports what it saw through the test's outcome."""
    probe = (
        FILES[SOLUTION]
        + "\nimport os as _os\n"
        + "_real_has_close_elements = has_close_elements\n"
        + "def has_close_elements(numbers, threshold):\n"
        + "    if _os.path.exists('.git') or _os.path.exists('/workspace/repo/.git'):\n"
        + "        raise RuntimeError('git history is there')\n"
        + "    return _real_has_close_elements(numbers, threshold)\n"
    )
    fixed = probe.replace("if idx == idx2:", "if idx != idx2:")
    info = await judged(services, patch_of({SOLUTION: fixed}))
    assert info.reward == 1.0, info.metrics


async def test_a_candidate_that_kills_the_sandbox_is_a_policy_zero_not_infra(
    services: TaskServices,
) -> None:
    killer = FILES[SOLUTION] + "\nimport os, signal\nos.kill(-1, signal.SIGKILL)\n"
    info = await judged(services, patch_of({SOLUTION: killer}))
    assert info.reward == 0.0
    assert "sandbox ended while the candidate's code ran" in info.metrics["policy_failure"]


def test_none_and_empty_displays_are_expectations_too() -> None:
    source = (
        "def test_a():\n    assert f() == []\n\n"
        "def test_b():\n    self.assertEqual(f(), None)\n\n"
        "def test_c():\n    assert f() == {}\n"
    )
    text, made = twinned(source, "test_a", "test_b", "test_c")
    assert made == {"test_a": True, "test_b": True, "test_c": True}
    lines = text.splitlines()
    assert lines[1].startswith("    assert f() == [") and lines[1] != "    assert f() == []"
    assert lines[4] == "    self.assertEqual(f(), 0)"
    assert ast.literal_eval(lines[7].split("== ")[1]) != {}


async def test_a_calibration_that_fails_is_made_again_by_an_eval_that_waited_for_it() -> None:
    sources = {"t.py": "def test_b():\n    assert f() == 3\n"}
    ids = ["t.py::test_b"]
    started, gold_runs = asyncio.Event(), []
    release = asyncio.Event()

    async def run(patch: str, files: dict[str, str] | None) -> Verdict:
        if files is None:
            return Verdict(True, {}, frozenset(ids), sources)
        if patch == "gold":
            gold_runs.append(1)
            if len(gold_runs) == 1:  # the first calibration breaks (an infra error)
                started.set()
                await release.wait()
                raise RuntimeError("the sandbox failed")
        return Verdict(False, {}, frozenset())

    def judge() -> Any:
        return with_twins(run, "p", deciding=ids, runner="pytest", key="retry", gold="gold")

    first = asyncio.create_task(judge())
    await started.wait()
    second = asyncio.create_task(judge())  # waits for the first's calibration
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(RuntimeError):
        await first
    verdict = await second
    assert verdict.passed and verdict.metrics["twins"]["counted"] == 1
    assert len(gold_runs) == 2


# --- tricks that try to tell the twin run from the real one (a red team's finds) ---------------

READS_EXPECTED = """

import ast as _ast
import linecache as _linecache
import os as _os
import sys as _sys


def {name}(*args, **kwargs):
    frame = _sys._getframe(1)
    if _twin_run(frame):
        raise RuntimeError("a twin")
    line = _linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return _ast.literal_eval(_ast.parse(line).body[0].value.args[1])
"""

DETECTORS = {
    # The twin file was written after the patch was applied; the real test file before it.
    "test_file_newer_than_the_patch": """
def _twin_run(frame):
    return _os.stat(frame.f_code.co_filename).st_mtime_ns > _os.stat(__file__).st_mtime_ns
""",
    # A twin run's request named the FAIL_TO_PASS tests only (the file defines 7 tests).
    "fewer_ids_in_the_request": """
def _twin_run(frame):
    while frame is not None and not isinstance(frame.f_locals.get("request"), dict):
        frame = frame.f_back
    return frame is not None and len(frame.f_locals["request"]["ids"]) < 7
""",
    # The repository's history: present in one run and not in the other.
    "git_history_present": """
def _twin_run(frame):
    return not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "..", ".git"))
""",
}


@pytest.mark.parametrize("detector", sorted(DETECTORS))
async def test_a_trick_that_tries_to_tell_the_twin_run_apart_still_scores_zero(
    services: TaskServices, detector: str
) -> None:
    code = FILES[SOLUTION] + DETECTORS[detector] + READS_EXPECTED.format(name=NAME)
    info = await judged(services, patch_of({SOLUTION: code}))
    assert info.reward == 0.0, info.metrics
    # The detector saw the same in both runs: the real tests and the twins passed (tamper), or
    # it took the real run for a twin and failed it.
    real_passed = set(info.metrics["FAIL_TO_PASS"].values()) == {"ok"}
    assert real_passed == ("tamper" in info.metrics), info.metrics
