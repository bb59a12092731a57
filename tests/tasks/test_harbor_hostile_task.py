"""A hostile tenant's Harbor task files against the server (unmarked: no buildah, no image).

Hole found: a task whose files could never be written as a directory (a file and a directory
of the same name, a name longer than a file system allows) was accepted at submission and
failed at INIT, on the host, with a bare OSError from writing its build context (no refusal
naming the task, after a job slot and a sandbox slot were taken). Each is now refused at
submission, in one line.
Contained: NUL in names, non-finite timeouts and duplicate TOML keys are refused already."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raas.tasks.harbor.environment import write_context
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.harbor.task import HarborTask
from raas.tasks.protocol import InvalidInstance, TaskJob

DOCKERFILE = "FROM raas/harbor-base:bookworm\n"


def instance(toml: str = 'version = "1.0"\n', **files: str) -> dict[str, Any]:
    base = {
        "task.toml": toml,
        "instruction.md": "Do it.\n",
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
        "environment/Dockerfile": DOCKERFILE,
    }
    return {"data_source": "harbor", "name": "hostile", "files": {**base, **files}}


def validate(inst: dict[str, Any]) -> None:
    HarborTask().validate(TaskJob(job_id="j", instance=inst, sampling_params={}))


def test_control_an_ordinary_environment_is_accepted_and_written(tmp_path: Path) -> None:
    inst = instance(**{"environment/app/data.txt": "x", "environment/app/more/y": "y"})
    validate(inst)
    write_context(tmp_path, HarborInstance.model_validate(inst).under("environment"))
    assert (tmp_path / "app" / "more" / "y").read_text() == "y"


@pytest.mark.parametrize(
    "files",
    [
        {"environment/app": "a file", "environment/app/inner": "and a directory"},
        {"tests/x": "a file", "tests/x/y": "and a directory"},
        {"environment/" + "n" * 300: "a name past the file system's 255 bytes"},
    ],
    ids=["file-and-dir", "file-and-dir-in-tests", "long-name"],
)
def test_files_that_cannot_be_written_are_refused_at_submission(
    files: dict[str, str], tmp_path: Path
) -> None:
    """Before: accepted, then INIT's write_context raised NotADirectoryError, FileExistsError
    or ENAMETOOLONG on the host."""
    inst = instance(**files)
    with pytest.raises(InvalidInstance) as caught:
        validate(inst)
    assert caught.value.loc[:2] == ("instance", "files")


@pytest.mark.parametrize(
    ("files", "toml"),
    [
        ({"environment/a\0b": "x"}, None),
        ({"environment/../../etc/x": "x"}, None),
        ({}, 'version = "1.0"\n[environment]\nbuild_timeout_sec = inf\n'),
        ({}, 'version = "1.0"\n[agent]\ntimeout_sec = inf\n'),
        ({}, 'version = "1.0"\n[verifier]\ntimeout_sec = nan\n'),
        ({}, 'version = "1.0"\n[environment]\ncpus = 1\ncpus = 64\n'),
        ({}, 'version = "1.0"\n[environment]\ngpus = 8\n'),
    ],
    ids=["nul", "dotdot", "inf-build", "inf-agent", "nan-verifier", "dup-key", "gpus"],
)
def test_contained_names_and_task_toml_tricks_are_refused(
    files: dict[str, str], toml: str | None
) -> None:
    inst = instance(**({"toml": toml} if toml else {}), **files)
    with pytest.raises(InvalidInstance):
        validate(inst)
