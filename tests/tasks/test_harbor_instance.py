"""The harbor task's instance: task.toml read strictly, the files checked, what raas cannot
run refused in one line naming the task; a task directory read into it; rewards parsed."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

import pytest

from raas.helpers.task_dirs import TaskDirError, read_task_dir, task_dirs
from raas.judge.harbor import RewardFileError, parse_reward_json, parse_reward_text
from raas.sandbox import BwrapConfig, ForkCarry
from raas.tasks.harbor.config import HarborConfig
from raas.tasks.harbor.instance import (
    PATH_PATTERN,
    TASK_TOML_PATTERN,
    HarborInstance,
    _clean_path,
)
from raas.tasks.harbor.task import HarborTask
from raas.tasks.protocol import InvalidInstance, TaskJob
from raas.tasks.services import narrowed

TOML = """schema_version = "1.1"
[task]
name = "raas/hello"
[verifier]
timeout_sec = 30.0
env = { MODE = "strict" }
[environment]
docker_image = "raas/harbor-base:bookworm"
cpus = 1
memory_mb = 512
storage_mb = 256
allow_internet = false
"""


def instance(toml: str = TOML, **files: str) -> dict[str, Any]:
    base = {
        "task.toml": toml,
        "instruction.md": "Write hello to /app/hello.txt.\n",
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    }
    return {"data_source": "harbor", "name": "hello", "files": {**base, **files}}


def refusal(inst: dict[str, Any]) -> InvalidInstance:
    with pytest.raises(InvalidInstance) as caught:
        HarborTask().validate(TaskJob(job_id="j", instance=inst, sampling_params={}))
    return caught.value


def test_a_task_is_read_with_its_caps_and_its_verifier() -> None:
    parsed = HarborInstance.model_validate(instance())
    config = parsed.config
    assert config.verifier.timeout_sec == 30.0 and config.verifier.env == {"MODE": "strict"}
    assert parsed.config.limits_update() == {
        "cpus": 1.0,
        "sandbox_memory_bytes": 512 << 20,
        "disk_bytes": 256 << 20,
    }
    assert parsed.under("tests") == {"test.sh": (parsed.files["tests/test.sh"].encode(), False)}
    HarborTask().validate(TaskJob(job_id="j", instance=instance(), sampling_params={}))  # accepted


def test_schema_1_0_spells_the_version_and_sizes_its_own_way() -> None:
    old = 'version = "1.0"\n[environment]\ndocker_image = "x:1"\nmemory = "2G"\nstorage = "512M"\n'
    config = HarborInstance.model_validate(instance(old)).config
    assert config.schema_version == "1.0"
    assert (config.environment.memory_mb, config.environment.storage_mb) == (2048, 512)


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        (TOML.replace("timeout_sec = 30.0", "timeout = 30.0"), "verifier.timeout: Extra inputs"),
        (TOML + 'schema_version_typo = "1"\n', "environment.schema_version_typo"),
        (TOML.replace('"1.1"', '"2.0"'), "schema_version"),
        (TOML.replace("cpus = 1", "cpus = 1\ngpus = 1"), "no GPU"),
        (TOML.replace('"strict"', '"${AWS_SECRET_ACCESS_KEY}"'), "host's environment"),
        (TOML.replace("allow_internet = false", "allow_internet = true"), "network"),
        (TOML.replace("cpus = 1", 'cpus = 1\nnetwork_mode = "public"'), "network"),
        (TOML + "[agent]\nuser = 'alice'\n", "its own unprivileged user"),
        ("[verifier\n", "task.toml"),
        ('version = "1.0"\nschema_version = "1.1"\n', "not both"),
    ],
)
def test_task_toml_is_read_strictly(toml: str, said: str) -> None:
    error = refusal(instance(toml))
    assert error.loc == ("instance", "files", "task.toml")
    assert said in error.message and "'hello'" in error.message


@pytest.mark.parametrize(
    ("files", "loc", "said"),
    [
        ({"environment/docker-compose.yaml": "services: {}\n"}, "files", "docker-compose"),
        ({"../escape": "x"}, "files", "relative path inside the task"),
        ({"/etc/passwd": "x"}, "files", "relative path inside the task"),
        ({"tests/./x": "x"}, "files", "relative path inside the task"),
        ({"notes/x.md": "x"}, "files", "a Harbor task holds"),
    ],
)
def test_files_that_cannot_be_a_task_are_refused(
    files: dict[str, str], loc: str, said: str
) -> None:
    error = refusal(instance() | {"files": {**instance()["files"], **files}})
    assert error.loc[:2] == ("instance", loc) and said in error.message


def test_a_task_needs_its_verifier_and_an_environment() -> None:
    inst = instance()
    del inst["files"]["tests/test.sh"]
    assert "needs tests/test.sh" in refusal(inst).message
    no_env = instance(TOML.replace('docker_image = "raas/harbor-base:bookworm"\n', ""))
    assert "needs environment/Dockerfile" in refusal(no_env).message
    with_dockerfile = instance(
        TOML.replace('docker_image = "raas/harbor-base:bookworm"\n', ""),
        **{"environment/Dockerfile": "FROM raas/harbor-base:bookworm\n"},
    )
    HarborTask().validate(TaskJob(job_id="j", instance=with_dockerfile, sampling_params={}))


def test_binary_files_are_base64_and_executables_are_among_the_files() -> None:
    bad = instance() | {"binary_files": {"environment/blob": "not base64!"}}
    assert refusal(bad).loc[:2] == ("instance", "binary_files")
    # An executable bit for no file is nothing to keep (the document cannot say it is wrong).
    stray = HarborInstance.model_validate(instance() | {"executable": ["tests/run.sh"]})
    assert stray.under("tests") == {"test.sh": (stray.files["tests/test.sh"].encode(), False)}


def test_a_task_directory_is_read_with_its_modes_and_binaries(tmp_path: Path) -> None:
    task = tmp_path / "hello"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    for path, text in instance()["files"].items():
        (task / path).write_text(text)
    os.chmod(task / "tests/test.sh", 0o755)
    (task / "environment/blob.bin").write_bytes(b"\xff\xfe\x00")
    read = read_task_dir(task)
    assert read["name"] == "hello" and read["executable"] == ["tests/test.sh"]
    assert base64.b64decode(read["binary_files"]["environment/blob.bin"]) == b"\xff\xfe\x00"
    environment = HarborInstance.model_validate(read).under("environment")
    assert environment["blob.bin"] == (b"\xff\xfe\x00", False)
    assert task_dirs(tmp_path) == [task] and task_dirs(task) == [task]
    (task / "environment/leak").symlink_to("/etc/passwd")
    with pytest.raises(TaskDirError, match="links outside the task"):
        read_task_dir(task)
    with pytest.raises(TaskDirError, match="holds no Harbor task"):
        task_dirs(task / "tests")


def test_rewards_are_finite_numbers() -> None:
    assert parse_reward_text(b"1\n") == 1.0 and parse_reward_text(b" 0.25 ") == 0.25
    for bad in (b"", b"yes", b"nan", b"inf", b"\xff"):
        with pytest.raises(RewardFileError):
            parse_reward_text(bad)
    assert parse_reward_json(b'{"reward": 1, "style": 0.5, "ok": true}', "reward") == {
        "reward": 1.0,
        "style": 0.5,
        "ok": 1.0,
    }
    assert parse_reward_json(b'{"reward": 0, "pass": 1}', "pass")["pass"] == 1.0
    for bad_json in (b"[1]", b'{"reward": "1"}', b'{"reward": NaN}', b'{"style": 1}', b"{"):
        with pytest.raises(RewardFileError):
            parse_reward_json(bad_json, "reward")


def test_a_task_narrows_the_servers_caps_and_never_widens_them() -> None:
    config = BwrapConfig()
    wide = narrowed(config, {"disk_bytes": 1 << 50, "sandbox_memory_bytes": 1 << 50})
    assert wide.limits == config.limits
    narrow = narrowed(config, {"disk_bytes": 1 << 20, "cpus": 1.0})
    assert narrow.limits.disk_bytes == 1 << 20 and narrow.limits.cpus == 1.0


def test_a_fork_names_only_entries_of_the_root() -> None:
    for bad in ("usr lib", "../etc", "*", ""):
        with pytest.raises(ValueError, match="not an entry of the root"):
            ForkCarry(image_kept=(bad,))
    with pytest.raises(ValueError, match="tmpfs_dirs"):
        BwrapConfig(tmpfs_dirs=("/etc",))
    assert BwrapConfig(tmpfs_dirs=("/tests",)).tmpfs_dirs == ("/tests",)


@pytest.mark.parametrize(
    "text",
    [
        "",
        '# a task\n\nschema_version = "1.1"\n',
        'version = "1.0"\n[metadata]\n# c\ndifficulty = "easy"\n',
        "[metadata]\nn = -3\n\n",
        "[verifier]\ntimeout_sec = 1\n",
        "a = 1\n",
        "[metadata]\na = 1\na = 2\n",
        "[metadata]\nn = 01\n",
        "#\x01\n",
        '[metadata]\nx = "a\x01"\n',
    ],
)
def test_the_documents_task_toml_is_one_the_server_reads(text: str) -> None:
    """The fuzz tier sends what the document admits: every task.toml it admits must be read
    (the document may admit less than the server reads, never more)."""
    if re.match(TASK_TOML_PATTERN, text):
        HarborConfig.from_toml(text)


def test_the_documents_paths_are_the_servers() -> None:
    for path in ("task.toml", "tests/test.sh", "tests/.x", "environment/a/..b"):
        assert re.match(PATH_PATTERN, path) and _clean_path(path) == path
    for path in ("tests/.", "tests/..", "tests/a/../b", "tests//a", "x/y", "/etc", "tests"):
        assert not re.match(PATH_PATTERN, path)
