"""The image rows' judge (raas.judge.swe_image) on a real project in a real sandbox.

The sandbox is bwrap over the image tier's Debian root filesystem (python3, pytest, git), with
the project of tests/judge/swe_image_rows.py as a git repository at its base commit in
/workspace/testbed: the judge takes the repository's directory as a parameter, so the tests need
no image store. The gold patch scores 1; every sabotaged patch scores 0 and says why.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.judge.code import Verdict
from raas.judge.swe_image import _by_row_names, judge_swe_image
from raas.judge.swe_specs import (
    DJANGO,
    NON_TEST_EXTS,
    PATH,
    SYMPY,
    RunPlan,
    UnsupportedTests,
    django_labels,
    plan,
)
from raas.judge.twins import with_twins
from raas.sandbox import BwrapConfig, Sandbox, create_sandbox
from tests.judge.swe_image_rows import (
    FAIL_TO_PASS,
    FILES,
    GOLD_PATCH,
    PASS_TO_PASS,
    ROOTFS,
    SOURCE,
    TEST_PATCH,
    TESTS,
    base_image,
    fixed,
    patch_of,
    write_repo,
)
from tests.judge.twin_tricks import TRICKS
from tests.support import tiers

REPO = "/workspace/testbed"
IDS = FAIL_TO_PASS + PASS_TO_PASS


def rootfs(test: Any) -> Any:
    """Marks a test that needs the base root filesystem: skipped where it is missing, unless
    the images tier was asked for (then it fails, so the tier never passes having run nothing)."""
    missing = not (ROOTFS / ".raas-complete").exists() and not tiers.selected("images")
    why = f"no base root filesystem at {ROOTFS}: scripts/images/make-base-rootfs.sh makes it"
    return pytest.mark.images(pytest.mark.skipif(missing, reason=why)(test))


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    """A fresh sandbox with the project at its base commit at REPO."""
    write_repo(tmp_path / "testbed")
    box = create_sandbox(BwrapConfig(), base_image())
    await box.start()
    try:
        await box.upload(tmp_path / "testbed", "/workspace")
        yield box
    finally:
        await box.close()


async def judged(sandbox: Sandbox, patch: str, **overrides: Any) -> Verdict:
    args: dict[str, Any] = {
        "patch": patch,
        "fail_to_pass": FAIL_TO_PASS,
        "pass_to_pass": PASS_TO_PASS,
        "plan": plan(IDS),
        "test_patch": TEST_PATCH,
        "repo": REPO,
    }
    return await judge_swe_image(sandbox, **{**args, **overrides})


def with_source(tail: str, *, fix: bool = False) -> str:
    """A patch that appends ``tail`` to the module under test (and fixes the bug if ``fix``)."""
    return patch_of({SOURCE: (fixed() if fix else FILES[SOURCE]) + tail})


# --- controls ----------------------------------------------------------------------------------


@rootfs
async def test_the_gold_patch_resolves_it_by_swebench_rules(sandbox: Sandbox) -> None:
    verdict = await judged(sandbox, GOLD_PATCH)
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": FAIL_TO_PASS, "failure": []}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": PASS_TO_PASS, "failure": []}
    assert "untrusted" not in verdict.metrics and "reason" not in verdict.metrics


@rootfs
async def test_no_patch_leaves_the_failing_tests_failing(sandbox: Sandbox) -> None:
    verdict = await judged(sandbox, "")
    assert not verdict.passed
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": [], "failure": FAIL_TO_PASS}
    assert verdict.metrics["PASS_TO_PASS"]["failure"] == []
    assert "untrusted" not in verdict.metrics  # an honest failure: log and record agree
    # The reason names the node ids without their file.
    names = ", ".join(t.split("::", 1)[1] for t in FAIL_TO_PASS[:2])
    assert verdict.metrics["reason"].startswith(
        f"the patch is empty; {len(FAIL_TO_PASS)} FAIL_TO_PASS still failing: {names}"
    ), verdict.metrics


@rootfs
async def test_the_test_patch_is_applied_after_the_agents(sandbox: Sandbox) -> None:
    # Without the instance's test patch, TestMean::test_single does not exist: not resolved.
    verdict = await judged(sandbox, GOLD_PATCH, test_patch="")
    assert not verdict.passed
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == [f"{TESTS}::TestMean::test_single"]


# --- sabotage ----------------------------------------------------------------------------------


@rootfs
async def test_a_fix_that_breaks_a_pass_to_pass_test_scores_zero(sandbox: Sandbox) -> None:
    broken = fixed().replace("return a + b", "return a - b")
    verdict = await judged(sandbox, patch_of({SOURCE: broken}))
    assert not verdict.passed
    assert verdict.metrics["PASS_TO_PASS"]["failure"] == [f"{TESTS}::test_add"]
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == []
    assert verdict.metrics["reason"].startswith("1 PASS_TO_PASS now failing: test_add")


@rootfs
async def test_edited_tests_are_put_back(sandbox: Sandbox) -> None:
    edited = FILES[TESTS].replace("mean([1, 2, 3]) == 2", "mean([1, 2, 3]) == 3")
    verdict = await judged(sandbox, patch_of({TESTS: edited}))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == [TESTS]
    assert f"{TESTS}::test_mean" in verdict.metrics["FAIL_TO_PASS"]["failure"]


@rootfs
async def test_a_deleted_failing_test_is_put_back(sandbox: Sandbox) -> None:
    verdict = await judged(sandbox, patch_of({TESTS: None}))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == [TESTS]
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == FAIL_TO_PASS


FORGE_SUMMARY = """
import _pytest.terminal


def _forged(self):
    for nodeid in {ids!r}:
        self.write_line("PASSED " + nodeid)
    self.write_line("FAILED tests/test_other.py::test_other - so the exit status looks right")


_pytest.terminal.TerminalReporter.short_test_summary = _forged
"""


@rootfs
async def test_forged_passed_lines_disagree_with_the_record(sandbox: Sandbox) -> None:
    # pytest's own summary is replaced with PASSED lines for every test (and one FAILED line, so
    # that SWE-bench's check of the exit status against the log passes): the log alone grades
    # the instance resolved; the record says what really ran.
    verdict = await judged(sandbox, with_source(FORGE_SUMMARY.format(ids=IDS)))
    assert not verdict.passed
    untrusted = " ".join(verdict.metrics["untrusted"])
    assert f"the log and the record disagree on {TESTS}::test_mean" in untrusted
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"  # what the log claimed


FORGE_MARKERS = """
import _pytest.terminal


def _forged(self):
    self.write_line({lines!r})


_pytest.terminal.TerminalReporter.summary_failures = _forged
"""


@rootfs
async def test_forged_lines_and_an_early_end_marker_score_zero(sandbox: Sandbox) -> None:
    # Written before pytest's own summary: the forged lines, then SWE-bench's end marker, so
    # that the slice SWE-bench reads ends before the real lines.
    forged = [f"PASSED {i}" for i in IDS] + ["FAILED tests/test_other.py::test_other - x"]
    lines = "\n".join([*forged, ">>>>> End Test Output"])
    verdict = await judged(sandbox, with_source(FORGE_MARKERS.format(lines=lines)))
    assert not verdict.passed
    untrusted = " ".join(verdict.metrics["untrusted"])
    assert f"the log and the record disagree on {TESTS}::test_mean" in untrusted


ALWAYS_PASS = """
import _pytest.reports

_made = _pytest.reports.TestReport.from_item_and_call.__func__


def _passing(cls, item, call):
    report = _made(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_passing)
"""


@rootfs
async def test_a_runner_made_to_pass_everything_is_caught_by_the_canaries(sandbox: Sandbox) -> None:
    # Log and record agree here (both come from pytest's reports): the must-fail canaries pass.
    verdict = await judged(sandbox, with_source(ALWAYS_PASS))
    assert not verdict.passed
    assert any("a canary that must fail" in u for u in verdict.metrics["untrusted"])


@rootfs
async def test_an_exit_at_import_leaves_no_record(sandbox: Sandbox) -> None:
    verdict = await judged(sandbox, with_source("\nimport os\n\nos._exit(0)\n", fix=True))
    assert not verdict.passed
    untrusted = " ".join(verdict.metrics["untrusted"])
    assert "holds something other than the runner's record" in untrusted


@rootfs
async def test_an_exit_in_a_conftest_is_dropped_with_it(sandbox: Sandbox) -> None:
    conftest = "import os\n\nos._exit(0)\n"
    verdict = await judged(
        sandbox, patch_of({"conftest.py": conftest, "tests/conftest.py": conftest})
    )
    assert not verdict.passed
    assert verdict.metrics["dropped"] == ["conftest.py", "tests/conftest.py"]
    assert "untrusted" not in verdict.metrics  # the tests ran and failed honestly


@rootfs
async def test_a_session_ended_before_any_test_scores_zero(sandbox: Sandbox) -> None:
    # pytest collects, then stops with status 0 before running anything.
    tail = '\nimport pytest\n\npytest.exit("nothing to see", returncode=0)\n'
    verdict = await judged(sandbox, with_source(tail))
    assert not verdict.passed
    assert any("canary" in u for u in verdict.metrics["untrusted"])
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == FAIL_TO_PASS


@rootfs
async def test_a_configuration_that_collects_nothing_is_put_back(sandbox: Sandbox) -> None:
    ini = "[pytest]\npython_files = nothing_*.py\naddopts = -p no:python\n"
    verdict = await judged(sandbox, patch_of({"pytest.ini": ini, "setup.cfg": ini}))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == ["pytest.ini", "setup.cfg"]
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == FAIL_TO_PASS


@rootfs
async def test_a_fix_with_harmless_extras_scores_one(sandbox: Sandbox) -> None:
    # A configuration file (put back), a new test file (removed), a README line and a helper
    # module (kept): the fix still counts.
    extras = {
        SOURCE: fixed(),
        "pytest.ini": "[pytest]\naddopts = -x\n",
        "tests/test_more.py": "def test_more():\n    assert True\n",
        "README.md": FILES["README.md"] + "\nFixed.\n",
        "helpers.py": "X = 1\n",
    }
    verdict = await judged(sandbox, patch_of(extras))
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["dropped"] == ["pytest.ini", "tests/test_more.py"]


@rootfs
@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"pytest.py": "def main(*a, **k):\n    return 0\n"}, "shadow the module pytest"),
        ({"stats.egg-info/entry_points.txt": "[pytest11]\nx = stats\n"}, "package metadata"),
        ({"sitecustomize.py": "import os\n"}, "Python runs at its start"),
        # importlib.metadata matches a metadata directory's name in any case.
        ({"stats.EGG-INFO/entry_points.txt": "[pytest11]\nx = stats\n"}, "package metadata"),
        ({"Stats-1.0.Dist-Info/entry_points.txt": "[pytest11]\nx = stats\n"}, "metadata"),
    ],
)
async def test_patches_that_change_how_tests_run_are_refused(
    sandbox: Sandbox, changes: dict[str, str], why: str
) -> None:
    verdict = await judged(sandbox, patch_of({SOURCE: fixed(), **changes}))
    assert not verdict.passed
    assert why in verdict.metrics["refused"]


@rootfs
async def test_a_link_in_place_of_the_source_is_refused(sandbox: Sandbox) -> None:
    verdict = await judged(sandbox, patch_of({}, symlinks={SOURCE: "/tmp/elsewhere.py"}))
    assert not verdict.passed
    assert "symbolic links" in verdict.metrics["refused"]


# --- the plan: which command, which parser -------------------------------------------------------


EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git apply -v - <<'EOF_114329324912'
EOF_114329324912
: '>>>>> Start Test Output'
{command}
: '>>>>> End Test Output'
git checkout abc tests/test_x.py
"""


def test_a_rows_pytest_command_is_read_from_its_eval_script() -> None:
    script = EVAL_SCRIPT.format(
        command="PYTHONWARNINGS=ignore pytest --no-header -rA tests/test_x.py"
    )
    found = plan(["tests/test_x.py::test_a"], script, "parse_log_pytest_v2", "pass_and_fail")
    assert found == RunPlan(
        ["--no-header", "-rA", "tests/test_x.py"],
        path0=False,
        env={"PATH": PATH, "PYTHONWARNINGS": "ignore"},
        log_parser="parse_log_pytest_v2",
    )
    found = plan([], EVAL_SCRIPT.format(command="python -m pytest tests/test_x.py"))
    assert found.args == ["-rA", "tests/test_x.py"] and found.path0


def test_a_row_without_a_script_runs_its_tests_files() -> None:
    assert plan(IDS).args == ["-rA", TESTS]


@pytest.mark.parametrize(
    "command",
    ["tox -e py", "make test", "python3 setup.py test"],
)
def test_a_command_that_no_runner_records_is_not_judged_here(command: str) -> None:
    with pytest.raises(UnsupportedTests, match=r"not pytest, Django's runtests\.py or SymPy's"):
        plan(["x"], EVAL_SCRIPT.format(command=command))


DJANGO_SCRIPT = EVAL_SCRIPT.replace(
    "cd /testbed\n",
    "cd /testbed\nexport LANG=en_US.UTF-8\nexport LANGUAGE='en_US:en'\nexport PATH=/evil\n",
)


def test_a_django_rows_command_is_read_from_its_eval_script() -> None:
    command = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 a.tests"
    found = plan(["test_x (a.tests.T)"], DJANGO_SCRIPT.format(command=command))
    assert found == RunPlan(
        ["--verbosity", "2", "--settings=test_sqlite", "--parallel", "1", "a.tests"],
        path0=False,
        env={"PATH": PATH, "LANG": "en_US.UTF-8", "LANGUAGE": "en_US:en"},  # never its PATH
        log_parser="parse_log_django",
        runner=DJANGO,
    )
    found = plan(["x"], EVAL_SCRIPT.format(command="python3 tests/runtests.py b.tests"))
    assert (found.runner, found.args) == (DJANGO, ["b.tests"])


DJANGO_TEST_PATCH = "".join(
    f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
    for path in ["tests/a/tests.py", "tests/a/models.py", "tests/b/test_c.py", "docs/x.txt"]
)


def test_a_django_row_without_a_script_runs_as_swebench_ran_its_version() -> None:
    # swebench 4's MAP_REPO_VERSION_TO_SPECS and get_test_directives: a test app's models are
    # not a label, nor are the docs.
    assert django_labels(DJANGO_TEST_PATCH) == ["a.tests", "b.test_c"]
    found = plan([], repo="django/django", version="3.1", test_patch=DJANGO_TEST_PATCH)
    assert found.runner == DJANGO and found.log_parser == "parse_log_django"
    assert found.args == [
        *("--verbosity", "2", "--settings=test_sqlite", "--parallel", "1"),
        *("a.tests", "b.test_c"),
    ]
    assert found.env["LANG"] == "en_US.UTF-8"
    old = plan([], repo="django/django", version="1.9", test_patch=DJANGO_TEST_PATCH)
    assert old.args == ["--verbosity", "2", "a.tests", "b.test_c"]
    with pytest.raises(UnsupportedTests, match=r"no test command for Django '0\.96'"):
        plan([], repo="django/django", version="0.96", test_patch=DJANGO_TEST_PATCH)


def test_a_sympy_row_runs_bin_test_as_swebench_ran_it() -> None:
    # swebench 4's TEST_SYMPY on the test patch's files as they are; an eval_script's command.
    patch = DJANGO_TEST_PATCH.replace("tests/a/tests.py", "sympy/core/tests/test_a.py")
    found = plan(["test_a"], repo="sympy/sympy", version="1.1", test_patch=patch)
    assert (found.runner, found.log_parser) == (SYMPY, "parse_log_sympy")
    assert found.args[:2] == ["-C", "--verbose"]
    assert found.args[2:] == [
        "sympy/core/tests/test_a.py",
        "tests/a/models.py",
        "tests/b/test_c.py",
    ]
    assert found.env["PYTHONWARNINGS"] == "ignore::UserWarning,ignore::SyntaxWarning"
    command = "PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose sympy/x/tests/test_y.py"
    found = plan(["test_y"], EVAL_SCRIPT.format(command=command))
    assert found.runner == SYMPY and found.args == ["-C", "--verbose", "sympy/x/tests/test_y.py"]
    assert found.env["PYTHONWARNINGS"] == "ignore::UserWarning"


def test_the_test_file_extensions_are_swebenchs() -> None:
    constants = pytest.importorskip("swebench.harness.constants")
    assert list(NON_TEST_EXTS) == constants.NON_TEST_EXTS


def test_unittest_names_are_matched_in_either_spelling() -> None:
    # Python 3.11 writes the method again after the class; SWE-bench's rows from older images
    # do not. A docstring's line is one name either way.
    statuses = {"test_x (a.tests.T.test_x)": "PASSED", "Doc line.": "FAILED", "other": "PASSED"}
    names = ["test_x (a.tests.T)", "Doc line."]
    assert _by_row_names(statuses, names) == {
        "test_x (a.tests.T)": "PASSED",
        "Doc line.": "FAILED",
        "other": "PASSED",
    }
    assert _by_row_names({"test_y (a.T)": "ERROR"}, ["test_y (a.T.test_y)"]) == {
        "test_y (a.T.test_y)": "ERROR"
    }


@rootfs
@pytest.mark.parametrize("patch", ["not a patch\n", GOLD_PATCH.replace("(len(xs) - 1)", "(n - 1)")])
async def test_a_patch_that_does_not_apply_scores_zero(sandbox: Sandbox, patch: str) -> None:
    verdict = await judged(sandbox, patch)
    assert not verdict.passed and verdict.metrics["patch_applied"] is False
    assert verdict.metrics["apply_output"]


# --- twins: tricks that pass the real tests -----------------------------------------------------


async def judged_with_twins(tmp_path: Path, patch: str) -> Verdict:
    """``patch`` through raas.judge.twins: each run (the real one, gold's twin run, the twin
    run) in a fresh sandbox of its own, as the task's judge runs them."""
    write_repo(tmp_path / "testbed")

    async def run(patch: str, twins: dict[str, str] | None) -> Verdict:
        box = create_sandbox(BwrapConfig(), base_image())
        await box.start()
        try:
            await box.upload(tmp_path / "testbed", "/workspace")
            return await judged(box, patch, twins=twins)
        finally:
            await box.close()

    key = f"image-pytest-row-{tmp_path}"
    return await with_twins(
        run, patch, deciding=FAIL_TO_PASS, runner="pytest", key=key, gold=GOLD_PATCH
    )


@rootfs
async def test_gold_scores_one_with_twins_on(tmp_path: Path) -> None:
    verdict = await judged_with_twins(tmp_path, GOLD_PATCH)
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["twins"] == {"made": 2, "counted": 2, "passed": []}


@rootfs
@pytest.mark.parametrize("trick", sorted(TRICKS))
async def test_a_trick_that_passes_the_real_tests_scores_zero_because_a_twin_passed(
    tmp_path: Path, trick: str
) -> None:
    verdict = await judged_with_twins(tmp_path, with_source(TRICKS[trick].format(name="mean")))
    assert not verdict.passed
    # The real run: every test passed by SWE-bench's rules and the record agreed.
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": FAIL_TO_PASS, "failure": []}
    assert "untrusted" not in verdict.metrics, verdict.metrics
    assert verdict.metrics["tamper"].startswith("2 twin(s) passed")


@rootfs
@pytest.mark.parametrize("name", ["pytest.toml", ".pytest.toml", "sub/pytest.ini"])
async def test_pytest_configuration_in_any_of_its_names_is_put_back(
    sandbox: Sandbox, name: str
) -> None:
    """pytest 9 reads pytest.toml and .pytest.toml: a configuration that deselects the failing
    tests beside the unfixed code is put back (removed), and the tests fail."""
    config = '[pytest]\naddopts = ["-k", "not mean"]\n'
    verdict = await judged(sandbox, patch_of({name: config}))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == [name]
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == FAIL_TO_PASS
