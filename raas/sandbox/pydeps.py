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

import fnmatch
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    if not all(copies.current(Path(host).parent) for host in binds):
        _staged.cache_clear()  # the copy was removed (a /tmp clean-up), or made again since
        binds = dict(_staged(*key))
    return binds


def _stage(
    distribution: str | None,
    dirs_items: tuple[tuple[str, str], ...],
    dest: str,
    bytecode: bool,
    own_files: bool,
) -> tuple[tuple[str, str], ...]:
    dirs = dict(dirs_items)
    closure = _closure(distribution) if distribution is not None else ()
    sources = {f"py/{top}": host for top, host in closure if host.exists()}
    sources |= {f"dir{i}": Path(host) for i, host in enumerate(sorted(dirs))}
    leave_out = () if bytecode else ("__pycache__",)
    root = stage_copy(sources, [dest, bytecode, own_files], leave_out, links=own_files)
    binds = {str(root / "py"): dest} if closure else {}
    for i, source in enumerate(sorted(dirs)):
        binds[str(root / f"dir{i}")] = dirs[source]
    return tuple(binds.items())


def stage_copy(
    sources: dict[str, Path],
    key_parts: list[Any],
    leave_out: Sequence[str] = (),
    links: bool = False,
) -> Path:
    """A world-readable copy of ``sources`` (``{name in the copy: host file or directory}``)
    under ``runtime_root()``, held by this process (``copies.hold``) and named by a digest of
    what it holds: made once, again only when a file changed. ``key_parts`` (with the sources)
    name the set whose older copies the new one replaces; ``leave_out``: glob patterns of
    names not copied, at any depth; ``links``: a link is copied as a link (else followed).
    Files keep their owner's execute bit (a loader must be run). A copy another process made
    is verified against the sources first (``copies.adopt``); one this process made is
    remembered (``copies.remember``): either is bound only after ``copies.verify``. Blocking:
    call it off the loop.
    """
    from raas.sandbox.runtime import name_key, runtime_root

    bytecode = "__pycache__" not in leave_out
    # The user's secret first: no one else can name the copy from what they may stat.
    digest = hashlib.sha256(name_key())
    digest.update(f"bytecode={bytecode} links={links}\n".encode())
    for extra in leave_out:
        if extra != "__pycache__":
            digest.update(f"leave out {extra}\n".encode())
    for name, host in sorted(sources.items()):
        for path in _entries(host, leave_out):
            if links and path.is_symlink():
                digest.update(f"{name}:{path}->{os.readlink(path)}\n".encode())
            elif path.is_file():
                st = path.stat()
                digest.update(f"{name}:{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    key = hashlib.sha256(
        json.dumps([sorted((n, str(h)) for n, h in sources.items()), *key_parts]).encode()
    ).hexdigest()[:16]
    root = runtime_root() / f"{copies.PREFIX}{digest.hexdigest()[:16]}"
    held = os.path.lexists(root) and copies.hold(root)
    for _ in range(3):  # again only if another process removed it between copy and hold
        if held:
            break
        held = _copy(sources, root, leave_out, links, key)
    else:
        raise OSError(f"{root} was removed each time it was made: is something cleaning it?")
    if not copies.current(root):  # another process made it: it must hold what the sources do
        copies.adopt(root, _expected(sources, leave_out, links))
    return root


def _expected(
    sources: dict[str, Path], leave_out: Sequence[str], links: bool
) -> dict[str, copies.Entry]:
    """What ``_copy`` makes of ``sources``, as ``copies.digest`` reads a copy."""
    entries: dict[str, copies.Entry] = {}
    for name, host in sources.items():
        parts = name.split("/")
        for i in range(1, len(parts)):
            entries["/".join(parts[:i])] = ("d", 0o755, "")
        _expect(host, name, leave_out, links, entries, top=True)
    return entries


def _expect(
    host: Path,
    rel: str,
    leave_out: Sequence[str],
    links: bool,
    entries: dict[str, copies.Entry],
    top: bool,
) -> None:
    # As shutil.copytree copies: a link as a link (``links``) or followed, ``leave_out`` by name
    # at every level below the top; then modes as ``_copy`` sets them.
    if links and not top and host.is_symlink():
        entries[rel] = ("l", 0, os.readlink(host))
    elif host.is_dir():
        entries[rel] = ("d", 0o755, "")
        for name in os.listdir(host):
            if not _left_out(name, leave_out):
                _expect(host / name, f"{rel}/{name}", leave_out, links, entries, top=False)
    else:
        run = os.stat(host).st_mode & stat.S_IXUSR
        entries[rel] = ("f", 0o755 if run else 0o644, copies.file_sha256(host))


def _copy(
    sources: dict[str, Path], root: Path, leave_out: Sequence[str], links: bool, key: str
) -> bool:
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
                ignore = shutil.ignore_patterns(*leave_out) if leave_out else None
                shutil.copytree(host, target, ignore=ignore, symlinks=links)
            else:
                shutil.copy2(host, target)
        for path in [staging, *_entries(staging)]:
            if path.is_symlink():  # chmod follows a link: to a host file outside
                continue
            run = path.is_dir() or path.stat().st_mode & stat.S_IXUSR
            path.chmod(0o755 if run else 0o644)
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
    copies.remember(root)
    copies.evict(root.parent, key, keep=root)
    return True


# Once a process for installed packages: the digest walks every file of the closure (thousands
# of stats), and they do not change under a running server.
_staged = functools.cache(_stage)


def _entries(top: Path, leave_out: Sequence[str] = ()) -> list[Path]:
    """Everything below ``top`` (itself, when a file), sorted, but what ``leave_out`` names
    (and what is below it); links are listed, never followed into."""
    if not top.is_dir() or top.is_symlink():
        return [top]
    found: list[Path] = []
    for directory, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if not _left_out(d, leave_out)]
        found += [Path(directory, n) for n in [*dirs, *files] if not _left_out(n, leave_out)]
    return sorted(found)


def _left_out(name: str, leave_out: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in leave_out)
