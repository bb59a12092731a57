"""`raas images`: Apptainer images for the apptainer sandbox provider."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click


@click.group(short_help="Apptainer images for the apptainer sandbox provider.")
def images() -> None:
    """Apptainer images for the `apptainer` sandbox provider (no network needed).

    Sandboxes run SIF files or sandbox directories from one local directory (the provider's
    images_dir: $RAAS_APPTAINER_IMAGES, default ~/.cache/raas/images). Task images keep their
    Docker names (swebench/sweb.eval.x86_64.django__django-11099:latest) and are found there as
    NAME.sif or a directory NAME, with NAME the image name, every character but letters, digits,
    '.', '_' and '-' made '_' (or only its last part, as `apptainer pull` names it), or through
    the provider's image_map. `raas images resolve NAME` shows which file a name finds.
    """


@images.command("build")
@click.argument("rootfs_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--sif/--sandbox-dir",
    default=None,
    help="A SIF file (one compressed file, read-only, what HPC sites copy around) or a sandbox"
    " directory (a plain copy; starts faster).  [default: SIF when OUT ends in .sif, else a"
    " sandbox directory]",
)
@click.option("--binary", help="apptainer or singularity.  [default: the first on PATH]")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--fakeroot", is_flag=True, help="apptainer build --fakeroot (not as root).")
@click.option(
    "--mksquashfs-args",
    help="For a SIF, e.g. '-comp zstd', or '-noI -noD -noF' (no compression: a larger file,"
    " built in seconds instead of minutes).",
)
def images_build(
    rootfs_dir: Path,
    out: Path,
    sif: bool | None,
    binary: str | None,
    force: bool,
    fakeroot: bool,
    mksquashfs_args: str | None,
) -> None:
    """Build an image at OUT from ROOTFS_DIR, a root filesystem directory, offline.

    ROOTFS_DIR is an unpacked root filesystem (from debootstrap, `docker export | tar -x`, a
    SWE-bench environment...); it needs a python3 (3.8+), which runs raas's action server.
    Runs `apptainer build [--sandbox] OUT ROOTFS_DIR`, which reads only the local directory.
    Example: `raas images build ./rootfs ~/.cache/raas/images/my-env.sif`.
    """
    from raas.sandbox.client import SandboxError
    from raas.sandbox.images import build_image

    kind: Literal["sif", "sandbox"] = (
        "sif" if (sif if sif is not None else out.suffix == ".sif") else "sandbox"
    )
    try:
        warnings = build_image(
            rootfs_dir, out, kind, binary, force, fakeroot, mksquashfs_args=mksquashfs_args
        )
    except SandboxError as e:
        raise click.ClickException(str(e)) from e
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"built {'SIF' if kind == 'sif' else 'sandbox directory'} {out}")


@images.command("resolve")
@click.argument("name")
@click.option(
    "--images-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="[default: $RAAS_APPTAINER_IMAGES or ~/.cache/raas/images]",
)
def images_resolve(name: str, images_dir: Path | None) -> None:
    """Print the SIF or sandbox directory that image NAME resolves to."""
    from raas.sandbox import ApptainerConfig, SandboxError, resolve_image

    config = ApptainerConfig()
    if images_dir is not None:
        config = config.model_copy(update={"images_dir": images_dir})
    try:
        click.echo(resolve_image(config, name))
    except SandboxError as e:
        raise click.ClickException(str(e)) from e
