"""The swe task on image rows (SWE-Gym / SWE-bench / R2E-Gym format): which image, INIT's check
of the base commit, the artifact taken from the agent's tree against the image's own commit, and
the judge, end to end through the task.

No registry is needed: the services' image store here is a stand-in that answers every name
with a two-layer image, the base root filesystem and a layer holding the project of
tests/judge/swe_image_rows.py at /testbed, and records which images were asked for; the sandboxes
are the real image sandboxes (an overlay root over those layers).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from raas.images.errors import ImageError
from raas.images.image import StoredImage
from raas.images.refs import image_of, swe_gym_image
from raas.sandbox import BwrapConfig, SandboxError
from raas.tasks.protocol import InvalidInstance, TaskJob, error_kind, parse_instance
from raas.tasks.services import TaskServices
from raas.tasks.swe import SweInstance, SweTask
from tests.judge.swe_image_rows import (
    GOLD_PATCH,
    PASS_TO_PASS,
    ROOTFS,
    SOURCE,
    row,
    write_repo,
)
from tests.judge.test_swe_image_judge import EVAL_SCRIPT, rootfs

TESTBED = SweTask.testbed


class Images:
    """An image store that holds one image under every name: the base root filesystem and the
    project at /testbed."""

    def __init__(self, layer: Path) -> None:
        self.layer = layer
        self.images: list[str] = []

    def resolve(self, ref: str) -> StoredImage:
        self.images.append(ref)
        return StoredImage(ref, "sha256:" + "1" * 64, (ROOTFS, self.layer))

    def in_use(self, image: StoredImage) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


# --- the row -----------------------------------------------------------------------------------


def test_a_swe_gym_row_runs_in_swe_gyms_image_for_its_id() -> None:
    instance = parse_instance(SweInstance, row())
    assert instance.image_ref == "xingyaoww/sweb.eval.x86_64.raas-tests_s_stats-1"
    assert swe_gym_image("getmoto__moto-5752") == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    assert instance.FAIL_TO_PASS[0] == "tests/test_stats.py::test_mean"  # JSON text read


def test_an_image_the_row_names_comes_first() -> None:
    assert image_of(row(image_name="swebench/sweb.eval.x86_64.a_1776_b-1:latest")) == (
        "swebench/sweb.eval.x86_64.a_1776_b-1:latest"
    )
    assert image_of(row(docker_image="namanjain12/pandas_final:abc")) == (
        "namanjain12/pandas_final:abc"
    )
    assert parse_instance(SweInstance, {**row(), "snapshot": {"files": {}}}).image_ref is None


def test_a_row_whose_tests_no_runner_records_is_refused_at_submission() -> None:
    script = EVAL_SCRIPT.format(command="tox -e py")
    with pytest.raises(InvalidInstance) as raised:
        parse_instance(SweInstance, row(eval_script=script))
    assert "eval_script" in str(raised.value) and "not pytest" in str(raised.value)


def test_a_django_row_runs_djangos_runner_and_is_told_so() -> None:
    django = row(
        repo="django/django",
        version=4.2,  # a number, as some exports write it
        test_patch="diff --git a/tests/a/tests.py b/tests/a/tests.py\n",
        FAIL_TO_PASS=["test_x (a.tests.T)"],
        PASS_TO_PASS=[],
    )
    found = parse_instance(SweInstance, django).plan()
    assert found.args[-1] == "a.tests" and found.log_parser == "parse_log_django"
    _, user = SweTask().messages(django)
    assert "`./tests/runtests.py --settings=test_sqlite --parallel 1`" in user["content"]


def test_a_sympy_row_runs_bin_test_and_is_told_so() -> None:
    sympy = row(repo="sympy/sympy", version="1.12", FAIL_TO_PASS=["test_x"], PASS_TO_PASS=[])
    sympy["test_patch"] = "diff --git a/sympy/a/tests/test_b.py b/sympy/a/tests/test_b.py\n"
    found = parse_instance(SweInstance, sympy).plan()
    assert found.args[-1] == "sympy/a/tests/test_b.py" and found.log_parser == "parse_log_sympy"
    _, user = SweTask().messages(sympy)
    assert "`bin/test -C --verbose`" in user["content"]


def test_an_image_row_is_told_where_its_repository_is() -> None:
    system, user = SweTask().messages(row())
    assert "/testbed" in system["content"] and "/workspace/repo" not in system["content"]
    assert "`python3 -m pytest`" in user["content"]


async def test_without_image_sandboxes_init_fails_as_infra_naming_the_image() -> None:
    services = TaskServices(llm=None, sandbox_config=BwrapConfig())  # type: ignore[arg-type]
    image = r"xingyaoww/sweb\.eval\.x86_64\.raas-tests_s_stats-1"
    with pytest.raises(ImageError, match=image) as e:
        await SweTask().init(TaskJob("j", row(), {}, services))
    assert error_kind(e.value) == "infra"
    await services.close()


# --- through the task, on the base root filesystem -----------------------------------------------


@pytest.fixture
async def services(tmp_path: Path) -> Any:
    write_repo(tmp_path / "layer" / "testbed")
    images = Images(tmp_path / "layer")
    made = TaskServices(llm=None, sandbox_config=BwrapConfig(), image_store=images)  # type: ignore[arg-type]
    yield made
    await made.close()


async def rolled(services: TaskServices, instance: dict[str, Any], *commands: str) -> Any:
    """INIT, the agent's shell running ``commands`` in the repository, the artifact, EVAL."""
    task = SweTask()
    ctx = await task.init(TaskJob("j", instance, {}, services))
    try:
        assert ctx.sandbox is not None
        for command in commands:
            done = await ctx.sandbox.bash(f"cd {TESTBED} && {command}")
            assert done.exit_code == 0, done
        info = await task.eval(ctx, ctx.trajectory)
    finally:
        await task.cleanup(ctx)
    return info


@rootfs
async def test_the_gold_fix_made_in_the_shell_scores_one(services: TaskServices) -> None:
    info = await rolled(services, row(), f"git apply <<'RAAS_EOF'\n{GOLD_PATCH}RAAS_EOF")
    assert info.reward == 1.0, info.metrics
    assert info.metrics["PASS_TO_PASS"]["success"] == PASS_TO_PASS
    assert "+    return sum(xs) / len(xs)" in info.metrics["artifact"]["patch"]
    # INIT, the artifact's diff, the judge's real run and its twin run (and gold's twin run,
    # once per task in a process): each a sandbox of the row's image.
    assert info.metrics["twins"]["passed"] == [] and info.metrics["twins"]["made"] == 2
    asked = services.image_store.images  # type: ignore[union-attr]
    assert set(asked) == {swe_gym_image(row()["instance_id"])} and len(asked) in (4, 5)


@rootfs
async def test_the_artifact_does_not_trust_the_agents_git(services: TaskServices) -> None:
    # The fix committed: the agent's own git shows no change left, the patch against the
    # image's commit (in a fresh sandbox) still holds the fix.
    fix = "sed -i 's|(len(xs) - 1)|len(xs)|' " + SOURCE
    commit = 'git -c user.name=a -c user.email=a@a commit -qam fix && test -z "$(git diff HEAD)"'
    info = await rolled(services, row(), fix, commit)
    assert info.reward == 1.0, info.metrics
    assert "+    return sum(xs) / len(xs)" in info.metrics["artifact"]["patch"]


@rootfs
async def test_an_image_at_another_commit_fails_init(services: TaskServices) -> None:
    with pytest.raises(SandboxError, match="not at the row's base_commit 0123abc"):
        await SweTask().init(TaskJob("j", row(base_commit="0123abc"), {}, services))
