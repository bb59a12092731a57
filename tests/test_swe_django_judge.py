"""The image rows' judge (raas.judge.swe_image) on a Django row: Django's own tests/runtests.py
run in-process by inside/swe_django.py, graded by SWE-bench's Django parser and rules, checked
against the runner's record.

The sandbox is bwrap over the image tier's Debian root filesystem (python3 3.11, git), with the
Django tree of tests/swe_django_rows.py as a git repository at its base commit in
/workspace/testbed and Django's two dependencies on PYTHONPATH (the image's environment). The
row is in SWE-bench's Django format, its names without Python 3.11's spelling, and no
eval_script: its command and labels come from its version and test patch, as SWE-bench's. The
gold patch scores 1; no patch, edited tests and forged "ok" lines score 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.judge.code import Verdict
from raas.judge.swe_image import judge_swe_image
from raas.judge.swe_specs import DJANGO
from raas.sandbox import BwrapConfig, Sandbox, create_sandbox
from raas.tasks.swe import SweInstance
from tests import tiers
from tests.swe_django_rows import (
    FAIL_TO_PASS,
    PASS_TO_PASS,
    SOURCE,
    TESTS,
    django_patch,
    fetched,
    gold_patch,
    row,
    runtests,
    unfixed,
    write_deps,
    write_tree,
)
from tests.swe_image_rows import ROOTFS, base_image

REPO = "/workspace/testbed"
DEPS = "/workspace/deps"


def needs_tree(test: Any) -> Any:
    """A test that needs the base root filesystem and the fetched Django: skipped where they
    are missing, unless the images tier was asked for (then it fails)."""
    ready = (ROOTFS / ".raas-complete").exists() and fetched()
    why = "scripts/images/make-base-rootfs.sh and scripts/images/fetch-test-sources.sh make them"
    skip = pytest.mark.skipif(not ready and not tiers.selected("images"), reason=why)
    return pytest.mark.images(skip(test))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The Django tree at its base commit (made once: Django is some 900 files), its sha."""
    root = tmp_path_factory.mktemp("django")
    write_deps(root / "deps")
    return root, write_tree(root / "testbed")


@pytest.fixture
async def sandbox(tree: tuple[Path, str]) -> AsyncIterator[Sandbox]:
    box = create_sandbox(BwrapConfig(), base_image())
    await box.start()
    try:
        await box.upload(tree[0] / "testbed", "/workspace")
        await box.upload(tree[0] / "deps", "/workspace")
        yield box
    finally:
        await box.close()


async def judged(sandbox: Sandbox, base: str, patch: str) -> Verdict:
    instance = SweInstance.model_validate(row(base))
    found = instance.plan()
    assert found.runner == DJANGO
    env = {**found.env, "PYTHONPATH": DEPS}
    return await judge_swe_image(
        sandbox,
        patch=patch,
        fail_to_pass=list(instance.FAIL_TO_PASS),
        pass_to_pass=list(instance.PASS_TO_PASS),
        plan=type(found)(found.args, found.path0, env, found.log_parser, found.eval_type, DJANGO),
        test_patch=instance.test_patch,
        base_commit=base,
        repo=REPO,
    )


@needs_tree
async def test_the_gold_patch_resolves_a_django_row(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    verdict = await judged(sandbox, tree[1], gold_patch())
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": FAIL_TO_PASS, "failure": []}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": PASS_TO_PASS, "failure": []}
    assert "untrusted" not in verdict.metrics


@needs_tree
async def test_no_patch_leaves_the_django_test_failing(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    verdict = await judged(sandbox, tree[1], "")
    assert not verdict.passed
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": [], "failure": FAIL_TO_PASS}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": PASS_TO_PASS, "failure": []}
    assert "untrusted" not in verdict.metrics  # an honest failure: log and record agree


@needs_tree
async def test_edited_tests_and_runner_are_put_back(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    # The test module made to expect the bug, and runtests.py made to exit 0 at once.
    edited = {
        TESTS: "from django.test import SimpleTestCase\n",
        "tests/runtests.py": "import sys\n\nsys.exit(0)\n" + runtests(),
    }
    verdict = await judged(sandbox, tree[1], django_patch(edited))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == ["tests/runtests.py", TESTS]
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == FAIL_TO_PASS


FORGED_OK = """

import unittest as _unittest
import unittest.runner as _runner

_add_error = _runner.TextTestResult.addError


def _forged(self, test, err):
    if "test_empty" not in str(test):
        return _add_error(self, test, err)
    _unittest.TestResult.addError(self, test, err)
    self.stream.writeln("ok")


_runner.TextTestResult.addError = _forged
"""


@needs_tree
async def test_a_forged_ok_line_disagrees_with_the_record(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    # The unfixed module rewrites unittest's verbose output for the failing test: its line ends
    # in "ok", so SWE-bench's parser reads the log as resolved; the record says what ran.
    verdict = await judged(sandbox, tree[1], django_patch({SOURCE: unfixed() + FORGED_OK}))
    assert not verdict.passed
    untrusted = " ".join(verdict.metrics["untrusted"])
    assert f"the log and the record disagree on {FAIL_TO_PASS[0]}" in untrusted
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"  # what the log claimed


ALWAYS_PASS = """

import unittest as _unittest

_run = _unittest.TestCase.run


def _passing(self, result=None):
    result.addSuccess(self)


_unittest.TestCase.run = _passing
"""


@needs_tree
async def test_a_runner_made_to_pass_everything_is_caught_by_the_canaries(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    # Log and record agree here (every test reports a success): the must-fail canaries pass.
    verdict = await judged(sandbox, tree[1], django_patch({SOURCE: unfixed() + ALWAYS_PASS}))
    assert not verdict.passed
    assert any("a canary that must fail" in u for u in verdict.metrics["untrusted"])
