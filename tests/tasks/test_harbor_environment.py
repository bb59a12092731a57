"""``raas.tasks.harbor.environment``: a Harbor task's image, and what a user reads when its base
is missing (no buildah runs: the base is looked for in the store first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raas.images.errors import ImageNotStored
from raas.sandbox import BwrapConfig
from raas.tasks.datasets import harbor_tasks
from raas.tasks.harbor.environment import IMPORT_BASE, task_image
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.services import TaskServices


async def _missing(tmp_path: Path, instance: dict[str, object]) -> str:
    config = BwrapConfig(image_store=tmp_path / "store", runtime_dir=tmp_path / "run")
    services = TaskServices(llm=None, sandbox_config=config)  # type: ignore[arg-type]
    with pytest.raises(ImageNotStored) as caught:
        await task_image(services, HarborInstance.model_validate(instance))
    return str(caught.value)


async def test_a_missing_shipped_base_says_first_how_to_get_it(tmp_path: Path) -> None:
    (shipped,) = [t for t in harbor_tasks() if t["name"] == "create-file"]
    said = await _missing(tmp_path, shipped)
    # the way in comes first: a long error line is cut at its end where it is shown
    assert said.startswith(f"Harbor task 'create-file': run {IMPORT_BASE} (as root, once)"), said
    assert "raas/harbor-base:bookworm is not in the image store" in said


async def test_control_another_missing_base_names_the_command_that_pulls_it(
    tmp_path: Path,
) -> None:
    (shipped,) = [t for t in harbor_tasks() if t["name"] == "create-file"]
    files = dict(shipped["files"])  # type: ignore[call-overload]
    files["environment/Dockerfile"] = "FROM debian:bookworm\nWORKDIR /app\n"
    said = await _missing(tmp_path, {**shipped, "files": files})
    assert "environment/Dockerfile: base image debian:bookworm is not in the image store" in said
    assert "raas images pull debian:bookworm" in said and IMPORT_BASE not in said
