"""Where the image store lives (the store itself is being built: ``ImageStore(root)``).

A stand-in of the module the image store goes into, holding only what the sandbox side needs to
name the store's directory; the store's own module replaces this file.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_store_dir() -> Path:
    """``$RAAS_IMAGE_STORE``, else ``oci`` in raas's cache (``$RAAS_CACHE_DIR``, else
    ``~/.cache/raas``)."""
    if os.environ.get("RAAS_IMAGE_STORE"):
        return Path(os.environ["RAAS_IMAGE_STORE"])
    cache = os.environ.get("RAAS_CACHE_DIR") or Path.home() / ".cache" / "raas"
    return Path(cache) / "oci"
