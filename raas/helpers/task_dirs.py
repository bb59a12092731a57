"""Harbor task directories read into the instance the ``harbor`` task takes (its files inline).

A task directory holds ``task.toml``; a dataset is a directory of task directories. The client
reads them (``raas run DIR``, ``raas submit DIR``) and the server's bundled set does too, so this
is stdlib only. What the files mean is the server's to check (``raas.tasks.harbor``): here they
are only read, whole, with their executable bits, and refused where they could not travel
(a special file, a link out of the task, a name that is not UTF-8, too much in all).
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path
from typing import Any

TASK_FILE = "task.toml"
# What one task may carry inline: the server refuses more (raas.tasks.harbor.instance).
MAX_TASK_BYTES = 32 * 1024 * 1024
MAX_TASK_FILES = 4096


class TaskDirError(ValueError):
    pass


def is_task_dir(path: Path) -> bool:
    return (path / TASK_FILE).is_file()


def task_dirs(path: Path) -> list[Path]:
    """``path`` itself if it is a task directory, else its subdirectories that are (sorted by
    name: a dataset); a directory with neither is an error saying what was looked for."""
    if not path.is_dir():
        raise TaskDirError(f"{path} is not a directory")
    if is_task_dir(path):
        return [path]
    found = sorted(p for p in path.iterdir() if p.is_dir() and is_task_dir(p))
    if not found:
        raise TaskDirError(
            f"{path} holds no Harbor task: a task directory has {TASK_FILE}, a dataset is a"
            " directory of them"
        )
    return found


def read_task_dir(path: Path) -> dict[str, Any]:
    """The ``harbor`` instance of the task at ``path``: its name (the directory's), its text
    files (``files``), any file that is not UTF-8 text in base64 (``binary_files``), and the
    paths of its executable files (``executable``), every path relative and with ``/``."""
    files: dict[str, str] = {}
    binary: dict[str, str] = {}
    executable: list[str] = []
    total = 0
    for rel, full in _walk(path):
        data = full.read_bytes()
        total += len(data)
        if total > MAX_TASK_BYTES or len(files) + len(binary) >= MAX_TASK_FILES:
            raise TaskDirError(
                f"{path}: over {MAX_TASK_BYTES >> 20} MiB or {MAX_TASK_FILES} files; put large"
                " environment files in a prebuilt image (task.toml's docker_image)"
            )
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary[rel] = base64.b64encode(data).decode("ascii")
        if full.stat().st_mode & stat.S_IXUSR:
            executable.append(rel)
    instance: dict[str, Any] = {"data_source": "harbor", "name": path.resolve().name}
    instance["files"] = files
    if binary:
        instance["binary_files"] = binary
    if executable:
        instance["executable"] = sorted(executable)
    return instance


def _walk(root: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``root`` (links followed only within it), sorted."""
    top = root.resolve()
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames.sort()
        for name in [*sorted(filenames), *[d for d in dirnames if Path(dirpath, d).is_symlink()]]:
            full = Path(dirpath, name)
            rel = full.relative_to(top).as_posix()
            target = full.resolve()
            if top != target and top not in target.parents:
                raise TaskDirError(f"{root}: {rel} links outside the task ({target})")
            if target.is_dir():
                raise TaskDirError(f"{root}: {rel} links to a directory; copy it instead")
            if not target.is_file():
                raise TaskDirError(f"{root}: {rel} is not a regular file")
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise TaskDirError(f"{root}: a file name is not UTF-8 ({rel!r})") from None
            out.append((rel, target))
    return out
