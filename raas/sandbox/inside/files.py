"""Whole files and trees in and out of the sandbox (base64 in the JSON messages)."""

from __future__ import annotations

import base64
import io
import os
from typing import TYPE_CHECKING, Any

from editor import ToolError

if TYPE_CHECKING:
    import tarfile


def read_file(path: str, max_bytes: int) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ToolError(f"{path} is not a file")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ToolError(f"{path} has {size} bytes, more than the limit of {max_bytes}")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return {"content": data.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"content": base64.b64encode(data).decode(), "encoding": "base64"}


def write_file(
    path: str, content: str, encoding: str = "utf-8", mode: int = 0o644
) -> dict[str, Any]:
    data = base64.b64decode(content) if encoding == "base64" else content.encode("utf-8")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return {"bytes": len(data)}


def _safe_members(tar: tarfile.TarFile, dest: str) -> list[tarfile.TarInfo]:
    """Refuse members that would land outside ``dest`` (absolute, '..', links out)."""
    root = os.path.realpath(dest)
    members = []
    for m in tar.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        if target != root and not target.startswith(root + os.sep):
            raise ToolError(f"archive member {m.name!r} would land outside {dest}")
        if m.islnk() or m.issym():
            link = os.path.realpath(os.path.join(os.path.dirname(target), m.linkname))
            if m.islnk():
                link = os.path.realpath(os.path.join(root, m.linkname))
            if link != root and not link.startswith(root + os.sep):
                raise ToolError(f"archive link {m.name!r} points outside {dest}")
        if m.isdev():
            raise ToolError(f"archive member {m.name!r} is a device")
        members.append(m)
    return members


def upload(dest: str, tar_b64: str) -> dict[str, Any]:
    import tarfile  # here: a third of the server's imports, and only trees moving need it

    os.makedirs(dest, exist_ok=True)
    data = base64.b64decode(tar_b64)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = _safe_members(tar, dest)
        if hasattr(tarfile, "data_filter"):  # 3.12+, and backported security releases
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)  # members checked above
    return {"files": len(members), "bytes": len(data)}


def download(
    path: str, skip: list[str] | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    """``path`` as a gzipped tar (base64). Entries whose name matches a pattern of ``skip``
    (``.git``, ``*.pyc``) are left out, a directory with all it holds; more than ``max_bytes``
    of files is refused before any is sent (a tree's git history is most of its bytes, and an
    agent may leave gigabytes where only its edits are wanted)."""
    if not os.path.exists(path):
        raise ToolError(f"{path} does not exist")
    import fnmatch  # here, as tarfile: only trees moving need them
    import tarfile

    patterns = skip or []
    total = 0

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal total
        name = os.path.basename(info.name)
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return None
        if info.isfile():
            total += info.size
            if max_bytes is not None and total > max_bytes:
                raise ToolError(f"{path} holds more than {max_bytes} bytes of files")
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".", filter=keep)
    return {"tar_b64": base64.b64encode(buf.getvalue()).decode()}
