"""``raas datasets check DIR``: a dataset checked before training on it (the images tier)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.cli.data import datasets
from raas.sandbox import BwrapConfig
from raas.tasks.datasets import HARBOR_DIR
from raas.tasks.services import TaskServices
from tests.tasks.test_harbor_verifier import services  # noqa: F401 - the fixture

pytestmark = pytest.mark.images


def test_a_dataset_check_reports_gold_that_fails_and_no_ops_that_pass(
    services: TaskServices,  # noqa: F811
    tmp_path: Path,
) -> None:
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    shutil.copytree(HARBOR_DIR / "shell-pipeline", dataset / "good")
    shutil.copytree(HARBOR_DIR / "shell-pipeline", dataset / "wrong-gold")
    (dataset / "wrong-gold/solution/solve.sh").write_text("echo '10.0.0.1 1' > /app/answer.txt\n")
    shutil.copytree(HARBOR_DIR / "shell-pipeline", dataset / "free-reward")
    (dataset / "free-reward/tests/test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\n"
    )
    config = services.sandbox_config
    assert isinstance(config, BwrapConfig)
    store = str(config.image_store)
    result = CliRunner().invoke(datasets, ["check", str(dataset), "--store", store])
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    assert result.exit_code == 1, result.output
    assert lines["good"].endswith("ok") and " 1 " in lines["good"], result.output
    assert lines["wrong-gold"].endswith("gold fails"), result.output
    assert lines["free-reward"].endswith("no-op passes"), result.output
    assert "1 of 3 tasks ok" in result.output


def test_a_directory_without_tasks_is_one_line_saying_what_was_looked_for(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(datasets, ["check", str(tmp_path)])
    assert result.exit_code == 2 and "holds no Harbor task" in result.output
