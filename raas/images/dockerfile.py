"""A Dockerfile build context read without building: the images it builds on, and its digest.

Pure functions on the standard library, so that ``raas.images.buildah`` can name a build by
what goes into it (``context_digest``) and find its base images in the store before buildah
runs (``base_refs``), and so that both are tested without buildah.

``base_refs``: the images of ``FROM`` lines and of ``COPY --from=IMAGE`` (``RUN
--mount=...,from=IMAGE`` too), less ``scratch`` and earlier stages named by ``AS`` or by number.
``ARG``s declared before the first ``FROM`` with a default are substituted (``FROM
python:${PY}``); one without a default is refused, since its value would come from a build
argument this build does not take.

``context_digest``: sha256 over every entry of the context, sorted by relative path (POSIX,
by bytes): for a directory ``d PATH``, a file ``f PATH MODE SHA256`` (MODE ``x`` when any
execute bit is set, else ``-``: what a COPY keeps that can change a build), a symlink ``l PATH
TARGET``; then the Dockerfile's own content (it may lie outside the context). Anything else
(a FIFO, a socket, a device), and a symlink that leads out of the context, is refused with
``ContextError`` naming it. ``.dockerignore`` is not applied: an ignored file that changes
makes a new image, never a wrong one.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_FROM_FLAG = re.compile(r"--from=(\S+)", re.IGNORECASE)
_MOUNT_FROM = re.compile(r"--mount=\S*?\bfrom=([^,\s]+)", re.IGNORECASE)


class ContextError(ValueError):
    """A build context or Dockerfile this build refuses: one line naming the path or line."""


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line of its first physical line
    keyword: str  # upper case: FROM, ARG, COPY...
    args: str


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions: comments and blank lines dropped, continued lines (``\\``
    at the end) joined. The ``# escape=`` directive is honoured only as its default (``\\``)."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending:
            if not line or line.startswith("#"):
                if re.match(r"#\s*escape\s*=\s*`", line) and not out:
                    raise ContextError(f"line {number}: the escape=` directive is not supported")
                continue
            start = number
        elif line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(part.strip() for part in pending).strip()
        pending = []
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    if pending:
        raise ContextError(f"line {start}: the Dockerfile ends inside a continued instruction")
    return out


def base_refs(text: str) -> list[str]:
    """The images the Dockerfile builds on, in order of first use, once each, as written
    (``FROM`` and ``COPY --from``/``RUN --mount=from=`` images that are not earlier stages)."""
    global_args: dict[str, str | None] = {}
    stages: list[str] = []  # lower-case stage names, "" for an unnamed stage
    found: dict[str, None] = {}

    def external(ref: str, line: int, what: str) -> None:
        ref = _substitute(ref, global_args, line, what)
        if ref.lower() in stages or (ref.isdigit() and int(ref) < len(stages)):
            return
        if ref.lower() == "scratch":
            return
        found.setdefault(ref, None)

    for ins in instructions(text):
        if ins.keyword == "ARG" and not stages:
            for word in ins.args.split():
                name, eq, value = word.partition("=")
                global_args[name] = _unquote(value) if eq else None
        elif ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            if not words:
                raise ContextError(f"line {ins.line}: FROM names no image")
            external(words[0], ins.line, "FROM")
            named = len(words) >= 3 and words[1].upper() == "AS"
            stages.append(words[2].lower() if named else "")
        elif ins.keyword in ("COPY", "RUN"):
            if not stages:
                raise ContextError(f"line {ins.line}: {ins.keyword} before the first FROM")
            flag = _FROM_FLAG if ins.keyword == "COPY" else _MOUNT_FROM
            for match in flag.finditer(ins.args):
                external(match[1], ins.line, f"{ins.keyword} --from")
    if not stages:
        raise ContextError("the Dockerfile has no FROM")
    return list(found)


def _substitute(ref: str, args: dict[str, str | None], line: int, what: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = m[1] or m[2]
        got = args.get(name)
        if got is None:
            why = "has no default" if name in args else "is not declared before the first FROM"
            raise ContextError(
                f"line {line}: {what} {ref}: ARG {name} {why}; build arguments are not taken"
            )
        return got

    return _VAR.sub(value, ref)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def context_digest(context: Path, dockerfile: Path) -> str:
    """``sha256:HEX`` of the context's entries and the Dockerfile (see the module docstring)."""
    root = context.resolve()
    if not root.is_dir():
        raise ContextError(f"{context} is not a directory (a build context)")
    h = hashlib.sha256(b"raas-context-v1\0")
    for rel, path in _entries(root):
        h.update(_entry_line(root, rel, path))
    h.update(b"dockerfile\0" + _file_sha256(dockerfile).encode() + b"\n")
    return "sha256:" + h.hexdigest()


def _entries(root: Path) -> list[tuple[bytes, Path]]:
    """Every entry under ``root`` (itself excluded) as (relative path as bytes, path), sorted."""
    found: list[tuple[bytes, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            found.append((os.fsencode(path.relative_to(root).as_posix()), path))
    return sorted(found)


def _entry_line(root: Path, rel: bytes, path: Path) -> bytes:
    st = path.lstat()
    if stat.S_ISDIR(st.st_mode):
        return b"d\0" + rel + b"\n"
    if stat.S_ISREG(st.st_mode):
        mode = b"x" if st.st_mode & 0o111 else b"-"
        return b"f\0" + rel + b"\0" + mode + b"\0" + _file_sha256(path).encode() + b"\n"
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        _inside(root, path, target)
        return b"l\0" + rel + b"\0" + os.fsencode(target) + b"\n"
    raise ContextError(
        f"{path}: not a regular file, directory or symlink: refused in a build context"
    )


def _inside(root: Path, link: Path, target: str) -> None:
    """Refuse a symlink whose target, followed as a build would, leaves the context."""
    where = Path(os.path.normpath(link.parent / target)) if not os.path.isabs(target) else None
    resolved = link.resolve()  # follows chains; a dangling link resolves as far as it goes
    for candidate in (where, resolved):
        if candidate is not None and not candidate.is_relative_to(root):
            raise ContextError(
                f"{link}: a symlink to {target}, outside the build context {root}: refused"
            )
    if where is None:
        raise ContextError(f"{link}: an absolute symlink ({target}) in a build context: refused")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError as e:
        raise ContextError(f"{path}: cannot read it ({e.strerror or e})") from e
    return h.hexdigest()


def qualified(text: str, names: dict[str, str]) -> str:
    """``text`` with each base image of its ``FROM`` and ``COPY --from`` lines written as
    ``names`` gives it (as written -> its full name): buildah in a user namespace finds a
    stored base by its full name only. Lines, comments and layout stay; a base image named
    through an ``ARG``, or on a continued ``FROM`` line, is left as written."""
    out = []
    for line in text.splitlines(keepends=True):
        words = line.split()
        if words and words[0].upper() == "FROM":
            image = next((w for w in words[1:] if not w.startswith("--")), None)
            if image is not None and image in names:
                head, sep, tail = line.partition(image)
                line = head + names[image] + tail if sep else line
        elif words and words[0].upper() == "COPY":
            line = _FROM_FLAG.sub(
                lambda m: f"--from={names.get(m[1], m[1])}" if m[1] in names else m[0], line
            )
        out.append(line)
    return "".join(out)
