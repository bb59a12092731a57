"""The holder of a sealed sandbox's files: run by raas (``raas.sandbox.cow``) as a program of
its own, never imported into raas's process. Standard library (with ctypes) only.

``holder.py MNT_FD CONTROL_FD DIR...``: MNT_FD is the sealed sandbox's mount namespace, which
the holder joins (after the user namespace that owns it, found from it: raas run unprivileged
has the capabilities to mount only there). It thereby keeps that namespace, and the tmpfs
mounts in it, alive after the sandbox's last process is gone. On CONTROL_FD (SOCK_SEQPACKET)
each message from raas is answered with one detached, read-only copy of each DIR's mount
(``open_tree(OPEN_TREE_CLONE)``, then ``mount_setattr``), passed as fds: a fork's init moves
them into its own mount namespace as the lower layers of its overlays. A detached copy can be
attached once only, and only a process in the namespace it came from can copy one again, which
is why this process lives as long as the sealed sandbox. The first message it sends is
``ready`` (or an error, then it exits); at EOF on CONTROL_FD it exits, and its namespaces go
with it once no fork's overlay holds their mounts.

Once it has joined, every path it could read is the sandbox's, so it reads none: its imports
are done before, it touches no file but through the mounts it copies, and it never prints (an
error's traceback would read "source lines", and the codec their first line names, from files
the sandbox planted; stderr is /dev/null as well). The sealed action server's own scratch files
in ``/tmp`` (``.raas-``) are dropped by each fork's init, in the fork's own view.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import os
import socket
import sys

NS_GET_USERNS = 0xB701
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
AT_FDCWD, AT_EMPTY_PATH, AT_RECURSIVE = -100, 0x1000, 0x8000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
SYS_OPEN_TREE, SYS_MOUNT_SETATTR = 428, 442  # the same on x86_64 and aarch64
MAX_ANSWER = 4096

libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def join(mnt_fd: int) -> None:
    """Into the namespace of ``mnt_fd``, by way of the user namespace that owns it."""
    userns = fcntl.ioctl(mnt_fd, NS_GET_USERNS)
    try:
        _check(libc.setns(userns, CLONE_NEWUSER), "setns user")
    finally:
        os.close(userns)
    _check(libc.setns(mnt_fd, CLONE_NEWNS), "setns mnt")
    os.close(mnt_fd)
    os.chdir("/")


def detached_copy(path: str) -> int:
    """A detached, read-only copy of the mount at ``path`` (not of what is mounted below it)."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
    args = [ctypes.c_long(SYS_OPEN_TREE), ctypes.c_long(AT_FDCWD), ctypes.c_char_p(path.encode())]
    fd = _check(libc.syscall(*args, ctypes.c_long(flags)), f"open_tree {path}")
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    try:
        _check(
            libc.syscall(
                ctypes.c_long(SYS_MOUNT_SETATTR),
                ctypes.c_long(fd),
                ctypes.c_char_p(b""),
                ctypes.c_long(AT_EMPTY_PATH | AT_RECURSIVE),
                ctypes.byref(attr),
                ctypes.c_long(ctypes.sizeof(attr)),
            ),
            f"mount_setattr {path}",
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def serve(control: socket.socket, dirs: list[str]) -> None:
    while control.recv(MAX_ANSWER):
        fds: list[int] = []
        try:
            fds = [detached_copy(d) for d in dirs]
            control.sendmsg(
                [b"ok"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            )
        except OSError as e:
            control.send(f"error: {e}".encode()[:MAX_ANSWER])
        finally:
            for fd in fds:
                os.close(fd)


def held(control: socket.socket, mnt_fd: int, dirs: list[str]) -> None:
    try:
        join(mnt_fd)
        for d in dirs:  # a copy can be made of each: said now, not at the first fork
            os.close(detached_copy(d))
    except OSError as e:
        control.send(f"error: {e}".encode()[:MAX_ANSWER])
        return
    control.send(b"ready")
    serve(control, dirs)


def main() -> None:
    mnt_fd, control_fd, *dirs = sys.argv[1:]
    control = socket.socket(fileno=int(control_fd))
    try:
        held(control, int(mnt_fd), dirs)
    except BaseException:
        # Past the join, every path is the sandbox's: a traceback would read "source lines" (and
        # the codec their first line names) from files the sandbox may have planted there, and
        # run them, as raas's user on the host's network. So nothing is printed, ever.
        os._exit(1)


if __name__ == "__main__":
    main()
