"""Importing an Apptainer/Singularity ``.sif``: not done yet (a SIF is one squashfs partition,
which would be one layer, unpacked with ``unsquashfs``)."""

from __future__ import annotations

from pathlib import Path


class SifError(Exception):
    pass


def import_sif(path: Path, blob_dir: Path, layer_dir: Path, lock_dir: Path) -> dict[str, object]:
    """The manifest descriptor of the image made from ``path`` (not yet supported)."""
    raise SifError(
        "importing a .sif is not supported yet: convert it to a docker save archive or an OCI"
        " layout, or run it with the apptainer provider (raas images build/resolve)"
    )
