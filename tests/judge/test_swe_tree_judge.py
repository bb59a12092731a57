"""The image rows' judge (raas.judge.swe_image) on Django's and SymPy's own trees: their own
runners (Django's tests/runtests.py, SymPy's bin/test) run in-process by inside/swe_django.py
and inside/swe_sympy.py, graded by SWE-bench's parsers and rules, checked against the runners'
records.

Each tree (tests/judge/swe_tree_judge.py) is a git repository at its base commit in
/workspace/testbed of a bwrap sandbox over the image tier's Debian root filesystem (Python
3.11, git), its dependencies on PYTHONPATH (the image's environment). Its row is in SWE-bench's
format without an eval_script: its command and tests come from its repository, version and test
patch, as SWE-bench's did, and Django's names are spelled without Python 3.11's method suffix.
The gold patch scores 1; no patch, edited tests or runner, a forged "ok" line for the failing
test and a runner made to pass everything score 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from raas.judge.code import Verdict
from raas.judge.swe_image import judge_swe_image
from raas.judge.swe_specs import SYMPY
from raas.judge.twins import with_twins
from raas.sandbox import BwrapConfig, Sandbox, create_sandbox
from raas.tasks.swe import SweInstance
from tests.judge import swe_django_rows, swe_sympy_rows
from tests.judge.swe_image_rows import ROOTFS, base_image
from tests.judge.swe_tree_judge import Project
from tests.judge.twin_tricks import TRICKS, tricked
from tests.support import tiers

REPO = "/workspace/testbed"
DEPS = "/workspace/deps"
PROJECTS = [swe_django_rows.PROJECT, swe_sympy_rows.PROJECT]
READY = (ROOTFS / ".raas-complete").exists() and all(p.fetched() for p in PROJECTS)
pytestmark = [
    pytest.mark.images,
    pytest.mark.skipif(
        not READY and not tiers.selected("images"),
        reason="scripts/images/make-base-rootfs.sh and fetch-test-sources.sh make the trees",
    ),
]


@pytest.fixture(scope="module", params=PROJECTS, ids=[p.name for p in PROJECTS])
def tree(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The project, the directory of its tree and dependencies (made once), its base commit."""
    project: Project = request.param
    root = tmp_path_factory.mktemp(project.name)
    project.write_deps(root / "deps")
    return project, root, project.write_tree(root / "testbed")


@pytest.fixture
async def sandbox(tree: Any) -> AsyncIterator[Sandbox]:
    box = create_sandbox(BwrapConfig(), base_image())
    await box.start()
    try:
        await box.upload(tree[1] / "testbed", "/workspace")
        await box.upload(tree[1] / "deps", "/workspace")
        yield box
    finally:
        await box.close()


async def judged(
    sandbox: Sandbox, tree: Any, patch: str, twins: dict[str, str] | None = None
) -> Verdict:
    """``patch`` on the project's row, with the plan the task makes of it."""
    project, _, base = tree
    instance = SweInstance.model_validate(project.row(base))
    found = instance.plan()
    assert found.runner == project.runner
    return await judge_swe_image(
        sandbox,
        patch=patch,
        fail_to_pass=list(instance.FAIL_TO_PASS),
        pass_to_pass=list(instance.PASS_TO_PASS),
        plan=replace(found, env={**found.env, "PYTHONPATH": DEPS}),
        test_patch=instance.test_patch,
        base_commit=base,
        repo=REPO,
        twins=twins,
    )


async def test_the_gold_patch_resolves_the_row(sandbox: Sandbox, tree: Any) -> None:
    project = tree[0]
    verdict = await judged(sandbox, tree, project.gold_patch())
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": project.fail_to_pass, "failure": []}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": project.pass_to_pass, "failure": []}
    assert "untrusted" not in verdict.metrics


async def test_no_patch_leaves_the_failing_test_failing(sandbox: Sandbox, tree: Any) -> None:
    project = tree[0]
    verdict = await judged(sandbox, tree, "")
    assert not verdict.passed
    assert verdict.metrics["FAIL_TO_PASS"] == {"success": [], "failure": project.fail_to_pass}
    assert verdict.metrics["PASS_TO_PASS"] == {"success": project.pass_to_pass, "failure": []}
    assert "untrusted" not in verdict.metrics  # an honest failure: log and record agree


async def test_edited_tests_and_runner_are_put_back(sandbox: Sandbox, tree: Any) -> None:
    project = tree[0]
    verdict = await judged(sandbox, tree, project.patch(project.edited))
    assert not verdict.passed
    assert verdict.metrics["dropped"] == sorted(project.edited)
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == project.fail_to_pass


async def test_a_forged_ok_line_disagrees_with_the_record(sandbox: Sandbox, tree: Any) -> None:
    project = tree[0]
    verdict = await judged(sandbox, tree, project.patch({project.source: project.forged_ok()}))
    assert not verdict.passed
    untrusted = " ".join(verdict.metrics["untrusted"])
    assert f"the log and the record disagree on {project.fail_to_pass[0]}" in untrusted
    assert verdict.metrics["resolution"] == "RESOLVED_FULL"  # what the log claimed


async def test_a_runner_made_to_pass_everything_is_caught_by_the_canaries(
    sandbox: Sandbox, tree: Any
) -> None:
    project = tree[0]
    verdict = await judged(sandbox, tree, project.patch({project.source: project.always_pass()}))
    assert not verdict.passed
    assert any("a canary that must fail" in u for u in verdict.metrics["untrusted"])


# --- twins: tricks that pass the real tests -----------------------------------------------------


async def judged_with_twins(tree: Any, patch: str) -> Verdict:
    """``patch`` through raas.judge.twins: each run (the real one, gold's twin run, the twin
    run) in a fresh sandbox of its own, as the task's judge runs them."""
    project, root, _ = tree

    async def run(patch: str, twins: dict[str, str] | None) -> Verdict:
        box = create_sandbox(BwrapConfig(), base_image())
        await box.start()
        try:
            await box.upload(root / "testbed", "/workspace")
            await box.upload(root / "deps", "/workspace")
            return await judged(box, tree, patch, twins)
        finally:
            await box.close()

    return await with_twins(
        run,
        patch,
        deciding=project.fail_to_pass,
        runner=project.runner,
        key=f"{project.name}-{root}",
        gold=project.gold_patch(),
    )


async def test_gold_scores_one_with_twins_on(tree: Any) -> None:
    verdict = await judged_with_twins(tree, tree[0].gold_patch())
    assert verdict.passed, verdict.metrics
    assert verdict.metrics["twins"] == {"made": 1, "counted": 1, "passed": []}


@pytest.mark.parametrize("trick", sorted(TRICKS))
async def test_a_trick_that_passes_the_real_tests_scores_zero_because_a_twin_passed(
    tree: Any, trick: str
) -> None:
    project = tree[0]
    if trick == "forged_record" and project.runner == SYMPY:
        pytest.skip("SymPy's runner has no result object of unittest's or pytest's to forge")
    source = tricked(project.unfixed(), trick, project.function)
    verdict = await judged_with_twins(tree, project.patch({project.source: source}))
    assert not verdict.passed
    # The real run: every test passed by SWE-bench's rules and the record agreed.
    assert verdict.metrics["FAIL_TO_PASS"]["failure"] == [], verdict.metrics
    assert "untrusted" not in verdict.metrics, verdict.metrics
    assert verdict.metrics["tamper"].startswith("1 twin(s) passed")
