"""The image rows' judge (raas.judge.swe_image) on a SymPy row: SymPy's bin/test run in-process
by inside/swe_sympy.py, graded by SWE-bench's SymPy parser and rules, checked against the
runner's record.

As tests/test_swe_django_judge.py, on the SymPy tree of tests/swe_sympy_rows.py (mpmath on
PYTHONPATH), a row in SWE-bench's SymPy format without an eval_script (its command and test
files from its test patch, as SWE-bench's). The gold patch scores 1; no patch, an edited test
file or bin/test, a forged ``ok`` line and a runner made to pass everything score 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.judge.code import Verdict
from raas.judge.swe_image import judge_swe_image
from raas.judge.swe_specs import SYMPY
from raas.sandbox import BwrapConfig, Sandbox, create_sandbox
from raas.tasks.swe import SweInstance
from tests import tiers
from tests.swe_image_rows import ROOTFS, base_image
from tests.swe_sympy_rows import (
    FAIL_TO_PASS,
    PASS_TO_PASS,
    SOURCE,
    TESTS,
    fetched,
    gold_patch,
    row,
    sympy_patch,
    unfixed,
    write_deps,
    write_tree,
)

REPO = "/workspace/testbed"
DEPS = "/workspace/deps"


def needs_tree(test: Any) -> Any:
    """A test that needs the base root filesystem and the fetched SymPy: skipped where they
    are missing, unless the images tier was asked for (then it fails)."""
    ready = (ROOTFS / ".raas-complete").exists() and fetched()
    why = "scripts/images/make-base-rootfs.sh and scripts/images/fetch-test-sources.sh make them"
    skip = pytest.mark.skipif(not ready and not tiers.selected("images"), reason=why)
    return pytest.mark.images(skip(test))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("sympy")
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
    assert found.runner == SYMPY
    env = {**found.env, "PYTHONPATH": DEPS}
    return await judge_swe_image(
        sandbox,
        patch=patch,
        fail_to_pass=list(instance.FAIL_TO_PASS),
        pass_to_pass=list(instance.PASS_TO_PASS),
        plan=type(found)(found.args, found.path0, env, found.log_parser, found.eval_type, SYMPY),
        test_patch=instance.test_patch,
        base_commit=base,
        repo=REPO,
    )


@needs_tree
async def test_the_gold_patch_resolves_a_sympy_row(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    verdict = await judged(sandbox, tree[1], gold_patch())
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": FAIL_TO_PASS, "failure": []}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": PASS_TO_PASS, "failure": []}
    assert "untrusted" not in verdict.metrics


@needs_tree
async def test_no_patch_leaves_the_sympy_test_failing(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    verdict = await judged(sandbox, tree[1], "")
    assert not verdict.passed
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": [], "failure": FAIL_TO_PASS}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": PASS_TO_PASS, "failure": []}
    assert "untrusted" not in verdict.metrics


@needs_tree
async def test_edited_tests_and_bin_test_are_put_back(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    edited = {
        TESTS: "def test_rotate_empty():\n    pass\n",
        "bin/test": "import sys\nsys.exit(0)\n",
    }
    verdict = await judged(sandbox, tree[1], sympy_patch(edited))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == ["bin/test", TESTS]
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == FAIL_TO_PASS


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


@needs_tree
async def test_a_forged_ok_line_disagrees_with_the_record(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    # The unfixed module makes the reporter write "ok" for the failing test: SWE-bench's parser
    # reads the log as resolved; the record says what ran.
    verdict = await judged(sandbox, tree[1], sympy_patch({SOURCE: unfixed() + FORGED_OK}))
    assert not verdict.passed, verdict.metrics
    untrusted = " ".join(verdict.metrics["untrusted"])
    assert f"the log and the record disagree on {FAIL_TO_PASS[0]}" in untrusted
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"  # what the log claimed


ALWAYS_PASS = """

import sympy.testing.runtests as _runtests

_runtests.PyTestReporter.test_fail = _runtests.PyTestReporter.test_pass
_runtests.PyTestReporter.test_exception = _runtests.PyTestReporter.test_pass
"""


@needs_tree
async def test_a_runner_made_to_pass_everything_is_caught_by_the_canaries(
    sandbox: Sandbox, tree: tuple[Path, str]
) -> None:
    verdict = await judged(sandbox, tree[1], sympy_patch({SOURCE: unfixed() + ALWAYS_PASS}))
    assert not verdict.passed
    assert any("a canary that must fail" in u for u in verdict.metrics["untrusted"])
