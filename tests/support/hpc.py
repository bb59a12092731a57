"""The nested Apptainer that scripts/hpc/make-apptainer-env.sh builds, for ``-m hpc`` tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from raas.sandbox import ApptainerConfig

HPC_DIR = Path(os.environ.get("RAAS_CACHE_DIR") or Path.home() / ".cache" / "raas") / "hpc"
BINARY = HPC_DIR / "bin" / "apptainer"
IMAGES = HPC_DIR / "images"
IMAGE_ROOTFS = HPC_DIR / "image-rootfs"


def apptainer_config(**overrides: Any) -> ApptainerConfig:
    """A config for the nested apptainer; fails (not skips) when it has not been built."""
    if not BINARY.exists() or not (IMAGES / "raas-test.sif").exists():
        pytest.fail(
            f"no nested apptainer in {HPC_DIR}: run scripts/hpc/make-apptainer-env.sh"
            " (make test-hpc does)"
        )
    return ApptainerConfig(
        **{"binary": str(BINARY), "images_dir": IMAGES, "image": "raas-test", **overrides}
    )
