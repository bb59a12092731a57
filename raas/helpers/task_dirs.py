"""Harbor task directories read into the instance the ``harbor`` task takes (its files inline).

A task directory holds ``task.toml``; a dataset is a directory of task directories. The client
reads them (``raas run DIR``, ``raas submit DIR``), the server's bundled set does too, and so
does a server that a submission names a task to by its path (``read_task_under``: beneath the
directories its admin named, ``--harbor-roots``); one reader serves all three, so this is
stdlib only. What the files mean is the server's to check (``raas.tasks.harbor``): here they
are only read, whole, with their executable bits, and refused where they could not travel.

The reader takes the directory's content as hostile (another user may write under a shared
dataset's root): every name is opened from its parent's descriptor with ``O_NOFOLLOW``, so
nothing swapped in between a check and an open is followed; a link is followed only where its
text names a file inside the task (never a directory), checked as text before anything is
opened; a FIFO, socket or device is refused from its ``lstat``, never opened (and a file is
opened ``O_NONBLOCK``, its type checked again on the open descriptor); a file is read from its
descriptor until its end, never further than the bytes left of the task's cap, whatever its
size said; a file with other hard links is read only if every user may read it (a link made to
another user's private file is not that user's to give); entries, depth, links and time are
capped, so a directory of 100,000 entries is refused after a few thousand.
"""

from __future__ import annotations

import base64
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TASK_FILE = "task.toml"
# What one task may carry inline: the server refuses more (raas.tasks.harbor.instance).
MAX_TASK_BYTES = 32 * 1024 * 1024
MAX_TASK_FILES = 4096
# What a read looks at, at most: entries of every kind (directories and what is refused
# included), directories deep, links followed while resolving one name (Linux's own limit).
MAX_ENTRIES = 2 * MAX_TASK_FILES
MAX_DEPTH = 32
MAX_LINKS = 40
CHUNK = 1 << 20
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class TaskDirError(ValueError):
    pass


class NotATaskUnderRoots(TaskDirError):
    """A path that names no task directory beneath the roots: one text whatever the reason
    (outside them, missing, not a directory, no task.toml, unreadable, a link out), so that an
    answer never says what exists outside the roots."""

    def __init__(self, roots: Sequence[Path]) -> None:
        listed = ", ".join(str(r) for r in roots)
        super().__init__(
            f"no Harbor task directory at this path beneath the server's Harbor roots ({listed}):"
            f" name a directory that holds {TASK_FILE}, by its absolute path, with no . or .."
        )


class _Outside(Exception):
    """A name that leaves the directory it is resolved beneath (or follows too many links)."""


class _Special(OSError):
    """A FIFO, socket or device: refused from its lstat, never opened."""


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


def named(instance: dict[str, Any]) -> dict[str, Any]:
    """A Harbor task read from its directory with its name (the directory's) as its
    ``instance_id`` (unless it has one): tables and results then say ``create-file``."""
    if instance.get("instance_id") is None and isinstance(instance.get("name"), str):
        return {**instance, "instance_id": instance["name"]}
    return instance


def read_task_dir(path: Path, deadline: float | None = None) -> dict[str, Any]:
    """The ``harbor`` instance of the task at ``path`` (the caller's own: a link to it is
    followed): its name (the directory's), its text files (``files``), any file that is not
    UTF-8 text in base64 (``binary_files``), and the paths of its executable files
    (``executable``), every path relative and with ``/``. ``deadline``: a ``time.monotonic()``
    past which the read stops with an error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise TaskDirError(f"{path}: cannot read the directory: {e.strerror}") from None
    try:
        real = os.path.realpath(path)
        spellings = [os.path.abspath(path), real]
        return _Reader(str(path), deadline, fd, spellings).instance(Path(real).name)
    finally:
        os.close(fd)


def read_task_under(
    path: str, roots: Sequence[tuple[Path, Path]], deadline: float | None = None
) -> dict[str, Any]:
    """What ``read_task_dir`` makes of the task directory at ``path``, which must lie beneath
    one of ``roots`` (each a pair: the root as its admin spelt it, absolute, and the directory
    it resolved to when the server started) after every link is followed.

    ``path`` is matched as text first: absolute, no empty, ``.`` or ``..`` name, under a root's
    spelling (either); nothing outside the roots is ever looked at. It is then opened name by
    name from the root's descriptor, a link followed only where its text stays beneath that root.
    Anything that is not a task directory there is ``NotATaskUnderRoots``, one text whatever the
    reason; a task directory whose content cannot travel is a ``TaskDirError`` saying why (what
    lies beneath a root is every tenant's to name).
    """
    nowhere = NotATaskUnderRoots([given for given, _ in roots])
    found = _beneath_roots(path, roots)
    if found is None:
        raise nowhere
    (given, real), parts = found
    try:
        top = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise nowhere from None
    try:
        try:
            fd, names = _open_beneath(top, [str(given), str(real)], parts)
        except (OSError, ValueError, _Outside):
            raise nowhere from None
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode) or not _has_task_file(fd):
                raise nowhere
            resolved = os.path.join(str(real), *names)
            spellings = [path.rstrip("/") or "/", resolved]
            name = names[-1] if names else real.name
            return _Reader(path, deadline, fd, spellings).instance(name)
        finally:
            os.close(fd)
    finally:
        os.close(top)


def beneath_roots(path: str, roots: Sequence[tuple[Path, Path]]) -> bool:
    """Whether ``path`` may name something beneath ``roots`` as text (``read_task_under``'s
    first check, which looks at no file: a caller may make it before it schedules a read)."""
    return _beneath_roots(path, roots) is not None


def _has_task_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.stat(TASK_FILE, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _beneath_roots(
    path: str, roots: Sequence[tuple[Path, Path]]
) -> tuple[tuple[Path, Path], list[str]] | None:
    """The root ``path`` lies under as text, and its names below the root; None if none."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return None
    try:
        path.encode("utf-8")  # a lone surrogate (JSON may carry one) names no file
    except UnicodeEncodeError:
        return None
    parts = path.split("/")[1:]
    if parts and parts[-1] == "":  # one trailing slash
        parts.pop()
    if any(p in ("", ".", "..") for p in parts):
        return None
    for root in roots:
        for spelling in root:
            names = list(spelling.parts[1:])
            if parts[: len(names)] == names:
                return root, parts[len(names) :]
    return None


def _under(target: str, spellings: Sequence[str]) -> list[str] | None:
    """The names of absolute ``target`` below one of ``spellings`` (as text), else None."""
    for spelling in spellings:
        base = spelling.rstrip("/")
        if target == base or target.startswith(base + "/"):
            return target[len(base) :].split("/")
    return None


def _open_beneath(
    top: int, spellings: Sequence[str], parts: Sequence[str]
) -> tuple[int, list[str]]:
    """Open the entry at ``parts`` (names below the directory ``top`` holds) without leaving
    that directory: each name opened with O_NOFOLLOW from its parent's descriptor; a link
    followed only where its text names a path beneath the directory (relative to the link's
    own directory, or absolute under one of ``spellings``), MAX_LINKS at most. A FIFO, socket
    or device is never opened. Returns the descriptor (a directory, or a regular file opened
    O_NONBLOCK: the caller checks which with fstat) and the names it was found at. Raises
    _Outside, or OSError (a missing name, a file where a directory must be, a special file)."""
    todo = [p for p in reversed(parts) if p not in ("", ".")]
    held: list[int] = []  # the descriptors of the directories on the way, top's excluded
    names: list[str] = []
    links = 0
    try:
        while todo:
            name = todo.pop()
            here = held[-1] if held else top
            if name == "..":
                if not names:
                    raise _Outside
                os.close(held.pop())
                names.pop()
                continue
            st = os.stat(name, dir_fd=here, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise _Outside
                target = os.readlink(name, dir_fd=here)
                if target.startswith("/"):
                    below = _under(target, spellings)
                    if below is None:
                        raise _Outside
                    while held:  # from the top again
                        os.close(held.pop())
                    names.clear()
                    target = "/".join(below)
                todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                continue
            last = not todo
            if stat.S_ISDIR(st.st_mode):
                fd = os.open(name, _OPEN | os.O_DIRECTORY, dir_fd=here)
            elif not last:
                raise NotADirectoryError(name)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, _OPEN, dir_fd=here)
            else:
                raise _Special(name)
            if last:
                return fd, [*names, name]
            held.append(fd)
            names.append(name)
        # Every name walked back up (``a/..``): the directory reached.
        return os.dup(held[-1] if held else top), names
    finally:
        for fd in held:
            os.close(fd)


class _Reader:
    """One task read from its directory's descriptor ``top`` (``spellings``: the absolute paths
    that name it, for its links' absolute targets), with its caps and deadline; ``label`` names
    it in errors."""

    def __init__(
        self, label: str, deadline: float | None, top: int, spellings: Sequence[str]
    ) -> None:
        self.label = label
        self.deadline = deadline
        self.top = top
        self.spellings = spellings
        self.files: dict[str, str] = {}
        self.binary: dict[str, str] = {}
        self.executable: list[str] = []
        self.total = 0
        self.entries = 0

    def instance(self, name: str) -> dict[str, Any]:
        self._walk(self.top, [], 0)
        instance: dict[str, Any] = {"data_source": "harbor", "name": name, "files": self.files}
        if self.binary:
            instance["binary_files"] = self.binary
        if self.executable:
            instance["executable"] = sorted(self.executable)
        return instance

    def _error(self, what: str) -> TaskDirError:
        return TaskDirError(f"{self.label}: {what}")

    def _too_much(self) -> TaskDirError:
        return self._error(
            f"over {MAX_TASK_BYTES >> 20} MiB or {MAX_TASK_FILES} files; put large environment"
            " files in a prebuilt image (task.toml's docker_image)"
        )

    def _in_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise self._error("not read in time (a slow file system, or too much to read)")

    def _names(self, fd: int) -> list[str]:
        """The names in the directory ``fd`` holds, sorted; at most MAX_ENTRIES in the task."""
        names = []
        with os.scandir(fd) as entries:
            for entry in entries:
                self.entries += 1
                if self.entries > MAX_ENTRIES:
                    raise self._error(f"over {MAX_ENTRIES} entries (files and directories)")
                names.append(entry.name)
        return sorted(names)

    def _walk(self, fd: int, where: list[str], depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self._error(f"{'/'.join(where)}: directories over {MAX_DEPTH} deep")
        os.lseek(fd, 0, os.SEEK_SET)  # scandir reads from the descriptor's offset
        for name in self._names(fd):
            self._in_time()
            rel = "/".join([*where, name])
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise self._error(f"a file name is not UTF-8 ({rel!r})") from None
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    child = os.open(name, _OPEN | os.O_DIRECTORY, dir_fd=fd)
                    try:
                        self._walk(child, [*where, name], depth + 1)
                    finally:
                        os.close(child)
                    continue
                if stat.S_ISLNK(st.st_mode):
                    opened = self._follow(rel)
                elif stat.S_ISREG(st.st_mode):
                    opened = os.open(name, _OPEN, dir_fd=fd)
                else:
                    raise _Special(name)
            except _Special:
                raise self._error(
                    f"{rel} is not a regular file (a FIFO, a socket or a device)"
                ) from None
            except OSError as e:
                raise self._error(f"{rel}: cannot be read ({e.strerror or e})") from None
            try:
                self._read(opened, rel)
            finally:
                os.close(opened)

    def _follow(self, rel: str) -> int:
        """The file a link at ``rel`` names, opened: a regular file inside the task, else an
        error; the link's text is checked before anything it names is looked at."""
        parts = rel.split("/")
        try:
            fd, _ = _open_beneath(self.top, self.spellings, parts)
        except _Outside:
            raise self._error(f"{rel} links outside the task") from None
        except FileNotFoundError:
            raise self._error(f"{rel} links to nothing in the task") from None
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._error(f"{rel} links to a directory; copy it instead")
        return fd

    def _read(self, fd: int, rel: str) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for something else since its lstat
            raise self._error(f"{rel} is not a regular file (a FIFO, a socket or a device)")
        if st.st_nlink > 1 and not st.st_mode & stat.S_IROTH:
            raise self._error(
                f"{rel} has other hard links and not every user may read it: copy it (a link"
                " to another user's private file is not the task's to carry)"
            )
        if len(self.files) + len(self.binary) >= MAX_TASK_FILES:
            raise self._too_much()
        left = MAX_TASK_BYTES - self.total
        chunks: list[bytes] = []
        size = 0
        while True:  # to the end as it is now, never past what is left of the cap
            chunk = _read_chunk(fd, min(CHUNK, left - size + 1))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > left:
                raise self._too_much()
            self._in_time()
        self.total += size
        data = b"".join(chunks)
        try:
            self.files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            self.binary[rel] = base64.b64encode(data).decode("ascii")
        if st.st_mode & stat.S_IXUSR:
            self.executable.append(rel)


def _read_chunk(fd: int, n: int) -> bytes:
    return os.read(fd, n)
