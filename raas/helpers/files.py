"""Files: atomic writes and a run's own directory."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in one rename: a reader sees the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_run_dir(parent: Path, label: str = "") -> Path:
    """A directory of its own for one run under ``parent`` (made here): ``YYYYmmdd-HHMMSS``,
    then ``-LABEL``, then ``-2``, ``-3``... if a run of the same second holds that name, so a
    run never writes over another's results."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(label).name)  # a model's directory: its name
    stamp = time.strftime("%Y%m%d-%H%M%S") + (f"-{label}" if label else "")
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{parent}: no free name for {stamp}")
