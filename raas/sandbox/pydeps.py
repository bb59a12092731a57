"""Host Python packages made importable inside a sandbox, bound read-only (``ro_binds``).

An agent program that raas did not write (the harness tasks' reference agent needs ``openai``)
runs on the sandbox's own python3, which has none of raas's packages. ``package_binds("openai")``
maps each top-level module of that distribution and of every distribution it requires (extras
left out) from the host's site-packages to ``dest`` inside the sandbox; the agent then runs with
``PYTHONPATH=dest``. Only that closure is visible, never the rest of raas's environment.

Compiled extensions (pydantic_core, jiter) only load into the same Python minor version they
were built for: the sandbox's python3 must be ``python_version()`` (the harness checks).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from raas.sandbox import copies

DEST = "/.raas/py"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(requirement: str) -> str | None:
    """The distribution name a requirement line needs, None if only an extra (or another
    platform) needs it.
    """
    try:
        from packaging.requirements import Requirement
    except ImportError:  # no packaging: leave out what an extra needs, keep the rest
        name, _, marker = requirement.partition(";")
        if "extra" in marker:
            return None
        found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip())
        return found.group(0) if found else None
    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return None
    return req.name


@functools.cache
def _closure(distribution: str) -> tuple[tuple[str, Path], ...]:
    seen: set[str] = set()
    todo = [distribution]
    tops: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if _key(name) in seen:
            continue
        seen.add(_key(name))
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            top = file.parts[0]
            if top in {"..", "__pycache__"} or top.endswith(".pth") or top in tops:
                continue
            tops[top] = Path(str(dist.locate_file(top)))
        todo += [w for r in dist.requires or [] if (w := _wanted(r)) is not None]
    return tuple(sorted(tops.items()))


def package_binds(distribution: str, dest: str = DEST) -> dict[str, str]:
    """``{host path: sandbox path}`` for ``distribution`` and what it requires, under ``dest``.

    PackageNotFoundError if one of them is not installed here.
    """
    return {str(host): f"{dest}/{top}" for top, host in _closure(distribution) if host.exists()}


def package_dirs(distribution: str) -> list[str]:
    """The host directories those modules live in (a PYTHONPATH where nothing is bound)."""
    return sorted({str(host.parent) for _, host in _closure(distribution)})


def python_version() -> str:
    """This Python's ``major.minor``: what the sandbox's python3 must be for compiled
    extensions bound from here to load.
    """
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def staged_binds(
    distribution: str | None,
    dirs: dict[str, str] | None = None,
    dest: str = DEST,
    bytecode: bool = False,
    own_files: bool = False,
) -> dict[str, str]:
    """Like ``package_binds``, but from a world-readable copy under ``runtime_root()``.

    As root, raas runs a sandbox as an unprivileged uid, which may not traverse to the host's
    site-packages (a clone under a 0700 directory, a home directory); so the closure (none for
    ``distribution`` None), and each of ``dirs`` (``{host dir: sandbox path}``), is copied once
    into a directory of its own whose name is a digest of what it holds, and bound from there.
    ``bytecode`` keeps the ``__pycache__`` directories: the sandbox cannot write them, and a
    large package (litellm) imports seconds slower without. ``own_files``: ``dirs`` are a
    user's own (an agent's), which may change between jobs and may hold links: they are looked
    at again on every call (copied again only when they changed), and a link is copied as a
    link, so that none brings a host file from outside them in. Blocking: call it off the loop.
    """
    key = (distribution, tuple(sorted((dirs or {}).items())), dest, bytecode, own_files)
    if own_files:
        return dict(_stage(*key))
    binds = dict(_staged(*key))
    if not all(Path(host).exists() for host in binds):  # the copy was removed (a /tmp clean-up)
        _staged.cache_clear()
        binds = dict(_staged(*key))
    return binds


def _stage(
    distribution: str | None,
    dirs_items: tuple[tuple[str, str], ...],
    dest: str,
    bytecode: bool,
    own_files: bool,
) -> tuple[tuple[str, str], ...]:
    from raas.sandbox.runtime import runtime_root

    dirs = dict(dirs_items)
    closure = _closure(distribution) if distribution is not None else ()
    sources = {f"py/{top}": host for top, host in closure if host.exists()}
    sources |= {f"dir{i}": Path(host) for i, host in enumerate(sorted(dirs))}
    digest = hashlib.sha256(f"bytecode={bytecode} links={own_files}\n".encode())
    for name, host in sorted(sources.items()):
        for path in _entries(host):
            if own_files and path.is_symlink():
                digest.update(f"{name}:{path}->{os.readlink(path)}\n".encode())
            elif path.is_file() and (bytecode or "__pycache__" not in path.parts):
                stat = path.stat()
                digest.update(f"{name}:{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    key = hashlib.sha256(
        json.dumps(
            [sorted((n, str(h)) for n, h in sources.items()), dest, bytecode, own_files]
        ).encode()
    ).hexdigest()[:16]
    root = runtime_root() / f"{copies.PREFIX}{digest.hexdigest()[:16]}"
    held = root.is_dir() and copies.hold(root)
    for _ in range(3):  # again only if another process removed it between copy and hold
        if held:
            break
        held = _copy(sources, root, bytecode, own_files, key)
    else:
        raise OSError(f"{root} was removed each time it was made: is something cleaning it?")
    binds = {str(root / "py"): dest} if closure else {}
    for i, source in enumerate(sorted(dirs)):
        binds[str(root / f"dir{i}")] = dirs[source]
    return tuple(binds.items())


def _copy(sources: dict[str, Path], root: Path, bytecode: bool, own_files: bool, key: str) -> bool:
    """Copy ``sources`` into ``root`` (by way of a staging directory renamed into place), hold
    it, and remove what that copy made obsolete (``copies.evict``). False if it is gone again.
    """
    staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=copies.STAGING_PREFIX))
    fd = copies.lock_staging(staging)
    try:
        for name, host in sources.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if host.is_dir():
                ignore = None if bytecode else shutil.ignore_patterns("__pycache__")
                shutil.copytree(host, target, ignore=ignore, symlinks=own_files)
            else:
                shutil.copy2(host, target)
        for path in [staging, *_entries(staging)]:
            if not path.is_symlink():  # chmod follows a link: to a host file outside
                path.chmod(0o755 if path.is_dir() else 0o644)
        copies.write_manifest(staging, key, [str(host) for host in sources.values()])
        staging.rename(root)
    except OSError:
        os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        if not root.is_dir():  # another process staged the same set first: that is fine
            raise
        return copies.hold(root)
    if not copies.hold(root, fd):
        return False
    copies.evict(root.parent, key, keep=root)
    return True


# Once a process for installed packages: the digest walks every file of the closure (thousands
# of stats), and they do not change under a running server.
_staged = functools.cache(_stage)


def _entries(top: Path) -> list[Path]:
    """Everything below ``top`` (itself, when a file), sorted; links are listed, never
    followed into."""
    if not top.is_dir() or top.is_symlink():
        return [top]
    found = [Path(d, n) for d, dirs, files in os.walk(top) for n in [*dirs, *files]]
    return sorted(found)
