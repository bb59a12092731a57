"""A sandbox's workspace and shell written to disk at a turn, and put back into a fresh sandbox
(``Sandbox.checkpoint``, ``Sandbox.restore``): what a job resumes from after a crash.

The workspace is archived as a GNU tar incremental dump (``--listed-incremental``): the first of
a chain holds every file, each later one only what changed since the one before, and the names
each directory held, so that unpacking the chain in order (``--listed-incremental=/dev/null``)
also removes what was deleted. The state file tar keeps between dumps (its ``.snar``) lives
beside the archives, in raas's own directory.

The sandbox's files are hostile: tar never follows a link it archives (a link is stored as one),
and the host reads them as the sandbox's own host uid where raas runs as root (so a race that
swaps a directory for a link to a host file reads only what that uid could read anyway), as the
fork copies do (raas.sandbox.fork). An archive is written where only raas can write (mode 0600,
made new: ``O_EXCL``), counted as it streams and cut off at the cap, hashed (sha256) and synced
before it is reported written, so a caller that records it records only a durable archive. A
restore unpacks as the fresh sandbox's host uid into its own tmpfs (never as root): no member
lands outside the workspace (tar refuses ``..`` and absolute names, and a link in the archive
is made after the files, where it can no longer be followed by them), and the tmpfs's cap holds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raas.sandbox.client import SandboxError
from raas.sandbox.fork import NAME, ShellState
from raas.sandbox.rootfs import TOOLS_PATH

ARCHIVE_TIMEOUT_S = 600.0
CHUNK = 1 << 20


class CheckpointTooLarge(SandboxError):
    """The archive would be larger than its cap: nothing of it is kept."""


@dataclass(frozen=True)
class Checkpointed:
    """What ``Sandbox.checkpoint`` wrote: the archive (its bytes and sha256; None where the
    workspace had not changed since the checkpoint whose ``signature`` was given), the shell's
    directory and exported variables (data, never code), what it could not keep (its running
    processes, parts of the shell's state) in words, and the workspace's ``signature`` now."""

    archive: Path | None
    size: int
    sha256: str | None
    shell: ShellState | None
    lost: tuple[str, ...] = ()
    signature: str | None = None


@dataclass(frozen=True)
class Restored:
    """What ``Sandbox.restore`` could not put back, in words."""

    lost: tuple[str, ...] = field(default_factory=tuple)


def shell_data(state: ShellState | None) -> dict[str, object] | None:
    """``state`` as JSON data."""
    if state is None:
        return None
    env = None if state.env is None else [list(pair) for pair in state.env]
    return {"cwd": state.cwd, "env": env, "dropped": list(state.dropped)}


def shell_of(data: object) -> ShellState | None:
    """The ShellState of ``shell_data``'s output, checked again as the parse checks it (a name
    that is no identifier, a relative directory: not kept); None for anything else."""
    if not isinstance(data, dict):
        return None
    cwd = data.get("cwd")
    cwd = cwd if isinstance(cwd, str) and cwd.startswith("/") else None
    env_data = data.get("env")
    env: tuple[tuple[str, str], ...] | None = None
    if isinstance(env_data, list):
        env = tuple(
            (pair[0], pair[1])
            for pair in env_data
            if isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], str)
            and NAME.fullmatch(pair[0])
        )
    dropped = data.get("dropped")
    kept = tuple(d for d in dropped if isinstance(d, str)) if isinstance(dropped, list) else ()
    return ShellState(cwd, env, kept)


def _as_uid(uid: int | None) -> list[str]:
    if uid is None:
        return []
    setpriv = shutil.which("setpriv", path=TOOLS_PATH) or "setpriv"
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def archive_tree(
    source: Path, snar: Path, dest: Path, max_bytes: int, uid: int | None
) -> tuple[int, str]:
    """Archive directory ``source`` (a sandbox's workspace through its /proc/PID/root) into the
    new file ``dest``: everything when ``snar`` does not exist yet, else what changed since the
    dump that wrote it (which it then replaces). Read as ``uid`` (None: as this process); tar
    gets the state file as an open descriptor (``/dev/fd/N``), so that it needs no way into
    raas's directory. Returns (bytes, sha256); CheckpointTooLarge past ``max_bytes``, with
    ``dest`` removed and ``snar`` as it was. Runs in a thread."""
    work = snar.with_name(snar.name + ".new")
    work.unlink(missing_ok=True)
    state = os.open(work, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if snar.exists():
            with open(snar, "rb") as old:
                os.write(state, old.read())
        if uid is not None:  # tar runs as the sandbox's uid: it may write this file, no other
            os.fchown(state, uid, uid)
        size, sha = _archive(source, state, dest, max_bytes, uid)
        os.fsync(state)
    except BaseException:
        work.unlink(missing_ok=True)
        raise
    finally:
        os.close(state)
    os.replace(work, snar)
    return size, sha


def _archive(
    source: Path, state: int, dest: Path, max_bytes: int, uid: int | None
) -> tuple[int, str]:
    pack = [
        *_as_uid(uid),
        "tar",
        "-C",
        str(source),
        f"--listed-incremental=/dev/fd/{state}",
        "--no-check-device",
        "--sparse",
        "--xattrs",
        "-cf",
        "-",
        ".",
    ]
    digest = hashlib.sha256()
    size = 0
    out_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with (
            open(out_fd, "wb", closefd=True) as out,
            subprocess.Popen(
                pack, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(state,)
            ) as tar,
        ):
            assert tar.stdout is not None and tar.stderr is not None
            while chunk := tar.stdout.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    tar.kill()
                    raise CheckpointTooLarge(
                        f"the workspace's archive is over its cap of {max_bytes} bytes"
                    )
                digest.update(chunk)
                out.write(chunk)
            error = tar.stderr.read()
            tar.wait(timeout=ARCHIVE_TIMEOUT_S)
            out.flush()
            os.fsync(out.fileno())
        # 1: "some files differ" (changed as they were read): the archive is still whole.
        if tar.returncode not in (0, 1):
            why = error.decode(errors="replace").strip()[-1000:]
            raise SandboxError(f"archiving the workspace failed: {why}")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


def unpack_chain(archives: Sequence[Path], target: Path, uid: int | None) -> None:
    """Unpack ``archives`` (a chain of ``archive_tree``'s, oldest first) into directory
    ``target`` (a fresh sandbox's workspace through its /proc/PID/root) as ``uid``: each one
    adds and changes files and removes what its dump no longer listed. Runs in a thread."""
    unpack = [
        *_as_uid(uid),
        "tar",
        "-C",
        str(target),
        "--listed-incremental=/dev/null",
        "--xattrs",
        "--no-same-owner",
        "-xpf",
        "-",
    ]
    for archive in archives:
        with open(archive, "rb") as data:
            try:
                done = subprocess.run(
                    unpack, stdin=data, capture_output=True, timeout=ARCHIVE_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SandboxError(f"restoring the workspace failed: {e}") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()[-1000:]
            raise SandboxError(f"restoring the workspace failed: {why}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# Past this many entries a workspace's signature is not taken (each checkpoint archives then).
SIGNATURE_ENTRIES = 100_000


def tree_signature(source: Path, max_entries: int = SIGNATURE_ENTRIES) -> str | None:
    """A digest of what every entry of directory ``source`` is (its path, inode, type and
    mode, size, and modification and change times in ns), walked without following a link and
    reading no file: equal digests mean nothing was written, made, removed or renamed between
    them (a change time cannot be set back by the sandbox's user). None where the tree holds
    more than ``max_entries``, or changes under the walk. Runs in a thread."""
    digest = hashlib.sha256()
    count = 0
    stack = [(source, "")]
    try:
        while stack:
            folder, prefix = stack.pop()
            with os.scandir(folder) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    count += 1
                    if count > max_entries:
                        return None
                    st = entry.stat(follow_symlinks=False)
                    rel = f"{prefix}/{entry.name}"
                    digest.update(
                        f"{rel!r} {st.st_ino} {st.st_mode} {st.st_size}"
                        f" {st.st_mtime_ns} {st.st_ctime_ns}\n".encode()
                    )
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((Path(entry.path), rel))
    except OSError:
        return None
    return digest.hexdigest()
