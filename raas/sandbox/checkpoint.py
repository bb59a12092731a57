"""A sandbox's workspace and shell written to disk at a turn, and put back into a fresh sandbox
(``Sandbox.checkpoint``, ``Sandbox.restore``): what a job resumes from after a crash.

The workspace is archived as a GNU tar incremental dump (``--listed-incremental``): the first of
a chain holds every file, each later one only what changed since the one before, and the names
each directory held, so that unpacking the chain in order (``--listed-incremental=/dev/null``)
also removes what was deleted. The state file tar keeps between dumps (its ``.snar``) lives
beside the archives, in raas's own directory.

The sandbox's files are hostile, and so is their shape while tar reads them: the sandbox's
processes run on, and one can swap a directory for a link between the moment tar lists it and
the moment tar opens it by its path (GNU tar's incremental dump opens each directory by its
whole path, and follows a link in any but the last part of it). So tar never runs in the host's
root: both ways it runs as the sandbox's own user, in the sandbox's user namespace and chrooted
into the sandbox's root (``in_sandbox``), so that whatever link it follows resolves there, to
files the sandbox holds anyway (the host's uid alone would still read every file of the host a
stranger may read, and rootless every file of raas's). It stays in the host's PID namespace,
out of the sandbox's sight. The dump's state file is opened where tar starts, a directory of
its own beside the archives: the one name tar looks up outside the sandbox's root (every
member is named from the workspace's absolute path). Its output is counted as it streams and cut
off at the cap, its errors read as they come (a tar blocked on a full error pipe would never
end its output), and the whole is held to ARCHIVE_TIMEOUT_S. An archive is written where only
raas can write (mode 0600, made new: ``O_EXCL``), hashed (sha256) and synced before it is
reported written, so a caller that records it records only a durable archive. Its members are
named by the workspace's path (``workspace/...``).

A restore unpacks the chain the same way into the fresh sandbox: as its user, in its root
(never as root, never in the host's root). tar drops ``..`` and a leading ``/`` from names and
makes a link whose target is absolute or climbs only once it has unpacked the rest; but a
chain can still lead it through a link (a directory dumped as a link when a race made it one,
its files after; a directory renamed into what an earlier archive made a link), and then it
writes in the fresh sandbox's own mounts (its workspace, ``/tmp``, ``/dev/shm``: tmpfs, each
capped), which the agent is about to be given anyway.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from raas.sandbox.client import SandboxError
from raas.sandbox.fork import (
    MAX_PATH_BYTES,
    MAX_VARIABLES,
    NAME,
    NOT_CARRIED,
    NOT_CARRIED_PREFIXES,
    VALUE_BYTES,
    ShellState,
)
from raas.sandbox.rootfs import TOOLS_PATH

ARCHIVE_TIMEOUT_S = 600.0
CHUNK = 1 << 20
ERROR_TAIL = 64 << 10  # what is kept of tar's complaints (the rest is read, and dropped)
STATE = "state.snar"  # tar's state file, in the directory of its own it runs in
# tar's whole environment: nothing of raas's (TAR_OPTIONS, secrets); names are bytes.
TAR_ENV = {"PATH": TOOLS_PATH, "LC_ALL": "C"}


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
    """The ShellState of ``shell_data``'s output, checked again as ``ShellState.parse`` checks
    the shell's output (a row is data the job's sandbox shaped, read back from the store, and
    ``restore_command`` quotes values and the path but trusts the names, and that no variable
    kept is one the shell reads as code): a variable whose name is no identifier or is
    NOT_CARRIED (BASH_ENV, PROMPT_COMMAND, SHELLOPTS...), whose value is over VALUE_BYTES or
    holds what no shell output does (NUL, what is not UTF-8), or past MAX_VARIABLES is not
    kept; nor a directory that is not absolute or is over MAX_PATH_BYTES. None for anything
    that is no such data."""
    if not isinstance(data, dict):
        return None
    cwd = data.get("cwd")
    cwd = cwd if isinstance(cwd, str) and _text(cwd, MAX_PATH_BYTES) and cwd[:1] == "/" else None
    env_data = data.get("env")
    env: tuple[tuple[str, str], ...] | None = None
    if isinstance(env_data, list):
        pairs = [pair for pair in env_data if isinstance(pair, list) and len(pair) == 2]
        kept = {name: value for name, value in pairs if _carried(name, value)}
        env = tuple(kept.items())[:MAX_VARIABLES]
    dropped = data.get("dropped")
    told = tuple(d for d in dropped if isinstance(d, str)) if isinstance(dropped, list) else ()
    return ShellState(cwd, env, told)


def _carried(name: object, value: object) -> bool:
    return (
        isinstance(name, str)
        and NAME.fullmatch(name) is not None
        and name not in NOT_CARRIED
        and not name.startswith(NOT_CARRIED_PREFIXES)
        and isinstance(value, str)
        and _text(value, VALUE_BYTES)
    )


def _text(text: str, limit: int) -> bool:
    """Whether ``text`` is what the shell's output (UTF-8, NUL-separated) could have held, in
    at most ``limit`` bytes."""
    try:
        return "\0" not in text and len(text.encode()) <= limit
    except UnicodeEncodeError:  # a lone surrogate, from JSON's \ud800
        return False


def _as_uid(uid: int | None) -> list[str]:
    if uid is None:
        return []
    setpriv = shutil.which("setpriv", path=TOOLS_PATH) or "setpriv"
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def in_sandbox(init: int, uid: int | None, wd: str) -> list[str]:
    """The command prefix that runs a program as the sandbox's own user in the sandbox's root:
    as ``uid`` (its host uid where raas is root; None: as raas), then, by nsenter, in the user
    namespace of the sandbox whose init is host PID ``init`` (that uid owns it: the rights to
    chroot there, lost at the exec), chrooted into that init's root, in directory ``wd`` (a
    host path, opened before the chroot). A link the sandbox planted, or swapped in while the
    program walks its files, resolves in the sandbox's own root, never in the host's; ``..``
    stops at it. The program stays in the host's PID namespace: the sandbox cannot see it to
    signal or trace it. It must come from the sandbox's /usr (the host's, read-only: only
    sandboxes without an image checkpoint)."""
    nsenter = shutil.which("nsenter", path=TOOLS_PATH) or "nsenter"
    enter = [f"--target={init}", "--user", "--preserve-credentials", "--root", f"--wd={wd}"]
    return [*_as_uid(uid), nsenter, *enter, "--"]


def archive_tree(
    init: int, workdir: str, snar: Path, dest: Path, max_bytes: int, uid: int | None
) -> tuple[int, str]:
    """Archive directory ``workdir`` of the sandbox whose init is host PID ``init`` into the
    new file ``dest``: everything when ``snar`` does not exist yet, else what changed since the
    dump that wrote it (which it then replaces). tar runs as ``uid`` in the sandbox's root
    (``in_sandbox``), working in a directory of its own beside ``snar`` that holds its state
    file alone. Returns (bytes, sha256); CheckpointTooLarge past ``max_bytes``, SandboxError
    past ARCHIVE_TIMEOUT_S, with ``dest`` removed and ``snar`` as it was. Runs in a thread."""
    work = snar.with_name(snar.name + ".d")
    shutil.rmtree(work, ignore_errors=True)  # a crash's
    work.mkdir(mode=0o700)
    try:
        state = work / STATE
        fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as new:  # empty: a first dump (level 0)
            if snar.exists():
                with open(os.open(snar, os.O_RDONLY | os.O_NOFOLLOW), "rb") as old:
                    shutil.copyfileobj(old, new)
        if uid is not None:  # tar runs as the sandbox's uid: it may write here, nowhere else
            os.chown(work, uid, uid)
            os.chown(state, uid, uid)
        wd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            pack = [
                *in_sandbox(init, uid, f"/proc/self/fd/{wd}"),
                "tar",
                # The one name tar looks up outside the sandbox's root: where it starts (its
                # own directory; above it, raas's 0700 one, which the sandbox's uid may not
                # enter where raas is root).
                f"--listed-incremental={STATE}",
                "--no-check-device",
                "--numeric-owner",
                "--sparse",
                "--xattrs",
                "-cf",
                "-",
                # Absolute, so that every member is looked up from the sandbox's root; and no
                # -C, so that tar asks for no working directory's path (getcwd), which outside
                # its root it could not get. Members are named without the /: workspace/...
                workdir,
            ]
            size, sha = _archive(pack, wd, dest, max_bytes)
        finally:
            os.close(wd)
        _fsync(state)  # and a file still, no link (O_NOFOLLOW), before it becomes the chain's
        os.replace(state, snar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return size, sha


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _archive(pack: list[str], wd: int, dest: Path, max_bytes: int) -> tuple[int, str]:
    """Run ``pack`` and write what it prints into the new file ``dest``: (bytes, sha256)."""
    out_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with open(out_fd, "wb", closefd=True) as out:
            size, sha, code, error = _stream(pack, out, max_bytes, (wd,))
            out.flush()
            os.fsync(out.fileno())
        # 1: "some files differ" (changed as they were read): the archive is still whole.
        if code not in (0, 1):
            why = error.decode(errors="replace").strip()[-1000:]
            raise SandboxError(f"archiving the workspace failed: {why}")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return size, sha


def _stream(
    command: list[str], out: BinaryIO, max_bytes: int, pass_fds: tuple[int, ...]
) -> tuple[int, str, int, bytes]:
    """Run ``command``, its output into ``out`` (counted and hashed): (bytes, sha256, exit
    status, the end of its errors). Both pipes are read as they fill (tar stopped on a full
    error pipe would never end its output), and the whole is held to ARCHIVE_TIMEOUT_S:
    killed past it (SandboxError) or past ``max_bytes`` (CheckpointTooLarge)."""
    deadline = time.monotonic() + ARCHIVE_TIMEOUT_S
    too_long = f"archiving the workspace took over {ARCHIVE_TIMEOUT_S:g} s"
    digest = hashlib.sha256()
    size = 0
    error = b""
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=pass_fds,
        env=TAR_ENV,
    ) as tar:
        assert tar.stdout is not None and tar.stderr is not None
        try:
            with selectors.DefaultSelector() as pipes:
                pipes.register(tar.stdout, selectors.EVENT_READ)
                pipes.register(tar.stderr, selectors.EVENT_READ)
                while pipes.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SandboxError(too_long)
                    for key, _ in pipes.select(left):
                        chunk = os.read(key.fd, CHUNK)
                        if not chunk:
                            pipes.unregister(key.fileobj)
                        elif key.fileobj is tar.stderr:
                            error = (error + chunk)[-ERROR_TAIL:]
                        else:
                            size += len(chunk)
                            if size > max_bytes:
                                raise CheckpointTooLarge(
                                    f"the workspace's archive is over its cap of {max_bytes} bytes"
                                )
                            digest.update(chunk)
                            out.write(chunk)
            try:
                code = tar.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:  # its output ended, but not tar
                raise SandboxError(too_long) from None
        except BaseException:
            tar.kill()
            raise
    return size, digest.hexdigest(), code, error


def unpack_chain(archives: Sequence[Path], init: int, uid: int | None) -> None:
    """Unpack ``archives`` (a chain of ``archive_tree``'s, oldest first: their members are
    named by the workspace's path) into the fresh sandbox whose init is host PID ``init``, as
    ``uid`` in that sandbox's root (``in_sandbox``): each one adds and changes files and
    removes what its dump no longer listed. Whatever link the chain makes tar follow, it
    writes nowhere but in that sandbox's own (capped) mounts. Runs in a thread."""
    unpack = [
        *in_sandbox(init, uid, f"/proc/{init}/root"),
        "tar",
        "-C",
        "/",  # the sandbox's root: the members are named workspace/...
        "--listed-incremental=/dev/null",
        "--xattrs",
        "--no-same-owner",
        "--numeric-owner",
        "-xpf",
        "-",
    ]
    for archive in archives:
        with open(archive, "rb") as data:
            try:
                done = subprocess.run(
                    unpack,
                    stdin=data,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    env=TAR_ENV,
                    timeout=ARCHIVE_TIMEOUT_S,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SandboxError(f"restoring the workspace failed: {e}") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()[-1000:]
            raise SandboxError(f"restoring the workspace failed: {why}")


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
