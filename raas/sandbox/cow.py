"""A sealed sandbox's files, held for copy-on-write forks (``BwrapSandbox.seal``).

A sealed sandbox has no process left: raas killed its PID namespace's init and saw the
namespace empty, so nothing of the sandbox's (no process, no fd it opened for writing, no
mapping) can write its files again. Its tmpfs mounts live on in its mount namespace, which the
holder (``raas/sandbox/holder.py``, a program of its own) joined before the kill and keeps. For
each fork the holder makes a detached, read-only copy of each mount; the fork's init moves
them into its own mount namespace and mounts an overlay on each: that copy the lower layer,
a tmpfs of the fork's own size the upper. What the fork writes lands in its upper (its cap
holds it); what it deletes is a whiteout there; the lower never changes, since no one is left
who could write it.

The holder joins the namespace from the host's side (``setns``), so raas needs no code of the
sandbox's to run. The kernel decides whether it works (Linux 6.18 lets a fork's init move a
detached mount made in another user namespace's mount namespace into its own, then use it as
an overlay's lower layer; overlayfs refuses a lower reached through an fd of a mount still in
another namespace, EINVAL, and a detached one used directly, EPERM): ``hold`` raises
``HoldRefused`` where the holder cannot join or copy, and ``BwrapSandbox.seal`` tries one fork
before the first seal kills anything; either way the sandbox then stays live and its forks
copy.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from raas.sandbox.base import launch_env
from raas.sandbox.client import SandboxError

HOLDER = Path(__file__).with_name("holder.py")
ANSWER_TIMEOUT_S = 10.0
MAX_ANSWER = 4096


class HoldRefused(SandboxError):
    """The kernel (or this host) refused to hold a sandbox's files for copy-on-write."""


class Held:
    """A holder process (started by ``hold``) and the control socket raas speaks to it on;
    ``dirs``: the sandbox paths it copies, in that order."""

    def __init__(self, process: subprocess.Popen[bytes], control: socket.socket, dirs: list[str]):
        self.process = process
        self.control = control
        self.dirs = dirs
        self._lock = threading.Lock()  # one request at a time: forks run in threads at once

    def copies(self) -> dict[str, int]:
        """Blocking: a detached read-only copy of each held directory (path: fd), the caller's
        to pass on and close."""
        fds = array.array("i")
        space = socket.CMSG_SPACE(len(self.dirs) * fds.itemsize)
        try:
            with self._lock:
                self.control.settimeout(ANSWER_TIMEOUT_S)
                self.control.send(b"c")
                message, ancillary, _, _ = self.control.recvmsg(MAX_ANSWER, space)
        except (OSError, TimeoutError) as e:
            raise SandboxError(f"the sealed sandbox's holder: {e}") from None
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if message != b"ok" or len(fds) != len(self.dirs):
            for fd in fds:
                os.close(fd)
            why = message.decode(errors="replace") or "it exited"
            raise SandboxError(f"the sealed sandbox's holder: {why}")
        return dict(zip(self.dirs, fds, strict=True))

    def close(self) -> None:
        """Blocking: the holder ends (EOF on its socket), and with it its hold on the files:
        forks' overlays keep what they use until they close."""
        with contextlib.suppress(OSError):
            self.control.close()
        try:
            self.process.wait(timeout=ANSWER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def hold(init: int, dirs: Sequence[str]) -> Held:
    """Blocking: the mount namespace of ``init`` (a sandbox's init, host PID) joined and held by
    a holder, which can copy each of ``dirs`` (mounts in it). HoldRefused where it cannot."""
    try:
        mnt = os.open(f"/proc/{init}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise HoldRefused(f"seal: the sandbox's mount namespace: {e}") from None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        argv = [sys.executable, "-I", "-S", str(HOLDER), str(mnt), str(theirs.fileno()), *dirs]
        process = subprocess.Popen(
            argv,
            env=launch_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # it prints nothing (holder.py says why)
            pass_fds=[mnt, theirs.fileno()],
            start_new_session=True,
            cwd="/",
        )
    except OSError as e:
        ours.close()
        raise HoldRefused(f"seal: cannot start the holder: {e}") from None
    finally:
        theirs.close()
        os.close(mnt)
    held = Held(process, ours, list(dirs))
    ours.settimeout(ANSWER_TIMEOUT_S)
    try:
        ready = ours.recv(MAX_ANSWER)
    except (OSError, TimeoutError) as e:
        ready = f"error: {e}".encode()
    if ready != b"ready":
        held.close()
        raise HoldRefused(f"seal: {ready.decode(errors='replace') or 'the holder exited'}")
    return held
