"""The apptainer provider's own parts: image names, clear errors, settings, `raas images build`.

Its behaviour as a sandbox (tools, limits, isolation, cleanup) is tested with bwrap's tests in
test_sandbox.py. Tests marked ``hpc`` need the nested apptainer (``make test-hpc``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import TypeAdapter

from raas.cli import main
from raas.images.errors import ImageError
from raas.images.sif_dir import candidate_names, resolve_image
from raas.sandbox import (
    ApptainerConfig,
    SandboxConfig,
    SandboxError,
    SandboxLimits,
    create_sandbox,
    sandbox_config,
)
from raas.settings import load_settings, validate
from tests.support.hpc import BINARY, IMAGE_ROOTFS, apptainer_config

DJANGO = "swebench/sweb.eval.x86_64.django__django-11099:latest"


def test_image_names_resolve_through_the_map_then_the_images_directory(tmp_path: Path) -> None:
    (tmp_path / "swebench_sweb.eval.x86_64.django__django-11099_latest.sif").touch()
    (tmp_path / "sweb.eval.x86_64.astropy__astropy-12907_latest").mkdir()  # apptainer pull's name
    (tmp_path / "python_3.11.sif").touch()
    (tmp_path / "myenv_latest.sif").touch()
    (tmp_path / "custom.sif").touch()
    config = ApptainerConfig(images_dir=tmp_path, image_map={"corp/env:v2": "custom.sif"})
    assert resolve_image(config, DJANGO).name.startswith("swebench_sweb.eval")
    astropy = "swebench/sweb.eval.x86_64.astropy__astropy-12907:latest"
    assert resolve_image(config, astropy).is_dir()
    assert resolve_image(config, "python:3.11") == tmp_path / "python_3.11.sif"
    assert resolve_image(config, "myenv") == tmp_path / "myenv_latest.sif"  # no tag: latest
    assert resolve_image(config, "corp/env:v2") == tmp_path / "custom.sif"
    absolute = tmp_path / "custom.sif"
    assert resolve_image(config, str(absolute)) == absolute
    config = config.model_copy(update={"image": "python:3.11"})
    assert resolve_image(config) == tmp_path / "python_3.11.sif"  # the config's own image
    assert candidate_names(DJANGO)[:2] == [
        "swebench_sweb.eval.x86_64.django__django-11099_latest",
        "swebench_sweb.eval.x86_64.django__django-11099_latest.sif",
    ]


def test_a_missing_image_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    config = ApptainerConfig(images_dir=tmp_path, image_map={"mapped:1": "gone.sif"})
    with pytest.raises(ImageError) as e:
        resolve_image(config, DJANGO)
    message = str(e.value)
    assert DJANGO in message and str(tmp_path) in message
    assert "swebench_sweb.eval.x86_64.django__django-11099_latest.sif" in message
    assert "raas images build" in message and "image_map" in message
    with pytest.raises(ImageError, match=r"'mapped:1' is mapped to .*gone\.sif"):
        resolve_image(config, "mapped:1")
    with pytest.raises(ImageError, match="no apptainer image given"):
        resolve_image(config.model_copy(update={"image": None}))
    with pytest.raises(ImageError, match=r"/nowhere/x\.sif does not exist"):
        resolve_image(config, "/nowhere/x.sif")


async def test_a_sandbox_with_a_missing_image_fails_to_start_naming_it(tmp_path: Path) -> None:
    # Any executable stands in for apptainer: the image is looked up before it runs.
    config = ApptainerConfig(binary="/bin/true", images_dir=tmp_path, image=DJANGO)
    sb = create_sandbox(config)
    with pytest.raises(ImageError, match="no apptainer image for 'swebench/sweb"):
        await sb.start()
    assert sb.closed and not sb.dir.exists()


async def test_a_missing_binary_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither apptainer nor singularity there
    sb = create_sandbox(ApptainerConfig(images_dir=tmp_path, image="x"))
    with pytest.raises(SandboxError, match=r"apptainer \(or singularity\) is not on PATH"):
        await sb.start()
    assert sb.closed and not sb.dir.exists()
    with pytest.raises(SandboxError, match="/opt/none/apptainer does not exist"):
        await create_sandbox(ApptainerConfig(binary="/opt/none/apptainer", image="x")).start()
    with pytest.raises(SandboxError, match="singularity is not on PATH: install"):
        await create_sandbox(ApptainerConfig(binary="singularity", image="x")).start()


def test_serve_settings_and_config_files_select_apptainer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAAS_APPTAINER_IMAGE", DJANGO)
    monkeypatch.setenv("RAAS_APPTAINER_IMAGES", "/scratch/images")
    settings = load_settings(None, {"sandbox": "apptainer"})
    # As the server makes it (its settings' paths), and as a library user does (the variables).
    for config in (
        sandbox_config(settings.sandboxes.sandbox, paths=settings.paths),
        sandbox_config(validate({"sandbox": "apptainer"}).sandboxes.sandbox),
    ):
        assert isinstance(config, ApptainerConfig)
        assert config.image == DJANGO and config.images_dir == Path("/scratch/images")
    parsed = TypeAdapter(SandboxConfig).validate_python(
        {"type": "apptainer", "image": "x.sif", "network": True, "limits": {"max_processes": 9}}
    )
    assert isinstance(parsed, ApptainerConfig) and parsed.network
    assert parsed.limits == SandboxLimits(max_processes=9)


def test_images_build_explains_itself_and_fails_clearly(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["images", "build", "--help"])
    assert result.exit_code == 0
    for words in ("ROOTFS_DIR OUT", "offline", "--sif / --sandbox-dir", "python3"):
        assert words in result.output
    (tmp_path / "rootfs").mkdir()
    result = runner.invoke(
        main,
        [
            "images",
            "build",
            str(tmp_path / "rootfs"),
            str(tmp_path / "x.sif"),
            "--binary",
            "/opt/none/apptainer",
        ],
    )
    assert result.exit_code != 0 and "/opt/none/apptainer does not exist" in result.output


@pytest.mark.hpc
@pytest.mark.parametrize("kind", ["--sif", "--sandbox-dir"])
async def test_images_build_makes_an_image_that_runs(kind: str, tmp_path: Path) -> None:
    out = tmp_path / ("built.sif" if kind == "--sif" else "built")
    args = ["images", "build", str(IMAGE_ROOTFS), str(out), kind, "--binary", str(BINARY)]
    if kind == "--sif":  # uncompressed: seconds instead of half a minute
        args += ["--mksquashfs-args", "-noI -noD -noF -noX"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert out.is_file() if kind == "--sif" else (out / "usr" / "bin" / "python3").exists()
    async with create_sandbox(apptainer_config(image=str(out))) as sb:
        ran = await sb.bash("python3 -c 'import sys; print(sys.version_info[:2] >= (3, 8))'")
        assert ran.output == "True\n"


@pytest.mark.hpc
async def test_as_root_each_sandbox_runs_as_its_own_unprivileged_uid() -> None:
    if os.geteuid() != 0:
        pytest.skip("as a normal user apptainer runs sandboxes as that user")
    config = apptainer_config()
    async with create_sandbox(config) as a, create_sandbox(config) as b:
        uids = [int((await sb.bash("id -u")).output) for sb in (a, b)]
        assert uids[0] != uids[1] and min(uids) >= config.uid_base
        # Root's powers never enter: not even the sandbox's own root-owned files are writable.
        denied = await a.bash("touch /etc/x")
        assert denied.exit_code != 0 and "Permission denied" in denied.output


@pytest.mark.hpc
async def test_a_missing_image_with_the_real_binary_names_it() -> None:
    sb = create_sandbox(apptainer_config(image=DJANGO))
    with pytest.raises(ImageError, match="django__django-11099"):
        await sb.start()
    assert sb.closed and not sb.dir.exists()
