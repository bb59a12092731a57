"""Run a command as root of a user namespace whose ids are unprivileged ids of the host.

Run by raas as root (``python -I -S userns.py OUTER COUNT net|nonet [--cgroup PROCS]... --
ARGV...``), first moved into each ``cgroup.procs`` file given (the build's caps), then a child
unshares a user, a mount and a PID namespace (and a network one with ``net``), the parent
(still root of the host) maps the child's ids 0..COUNT-1 to the host's OUTER..OUTER+COUNT-1,
and the child becomes root of its namespace and runs ARGV as the first process of the PID
namespace, on a /proc of its own: a RUN step sees no process of the host's, and what it leaves
running is killed when ARGV ends. Its exit status is this process's.

Why: buildah's RUN steps run as root, and a Dockerfile is a task's (hostile). Outside a user
namespace that root is the host's, and ``--isolation chroot`` is no jail for it (a chroot
escape reaches the host's files with all of root's rights). Inside one, root is an unprivileged
host id: it owns nothing of the host, and what it could reach it reaches as that id.
``util-linux``'s ``unshare --map-users`` would need ``newuidmap`` and a line of ``/etc/subuid``
for root; the kernel lets root write the map itself, which this does.

Standard library only: this file is run alone by the host's Python (``raas.images.buildah``).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000


USAGE = "usage: userns.py OUTER COUNT net|nonet [--cgroup PROCS]... -- ARGV...\n"


def main(argv: list[str]) -> int:
    if len(argv) < 5 or "--" not in argv[3:]:
        sys.stderr.write(USAGE)
        return 2
    end = argv.index("--", 3)
    outer, count, net, command = int(argv[0]), int(argv[1]), argv[2] == "net", argv[end + 1 :]
    options = argv[3:end]
    if len(options) % 2 or any(flag != "--cgroup" for flag in options[::2]) or not command:
        sys.stderr.write(USAGE)
        return 2
    # Into the build's cgroup (each of its cgroup.procs files) before anything is forked: every
    # process of the command, its RUN steps', is held to the cgroup's caps.
    for procs in options[1::2]:
        try:
            with open(procs, "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as e:
            sys.stderr.write(f"joining the build's cgroup {procs}: {e.strerror}\n")
            return 125
    # Found now: once an unprivileged id, this Python may no longer read its own modules.
    program = shutil.which(command[0]) or command[0]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: into the namespaces, wait for its map, then run the command
        os.close(ready_r)
        os.close(go_w)
        flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if net else 0)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(flags) != 0:
            sys.stderr.write(f"unshare: {os.strerror(ctypes.get_errno())}\n")
            os._exit(125)
        os.write(ready_w, b"1")
        os.close(ready_w)
        if os.read(go_r, 1) != b"1":
            os._exit(125)  # the parent could not map it: run nothing
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        # The command is the first process of a PID namespace of its own: its RUN steps see no
        # process of the host's, and whatever they leave running dies with it.
        inner = os.fork()
        if inner == 0:
            _own_proc(libc)
            try:
                os.execv(program, command)
            except OSError as e:
                sys.stderr.write(f"{command[0]}: {e.strerror}\n")
                os._exit(127)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # as the parent's below: it outlives the command
        _, status = os.waitpid(inner, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(128 - code if code < 0 else code)  # killed by a signal: the shell's 128+N
    # The parent waits for the child whatever the group is sent: a SIGTERM to the group is the
    # child's to act on (buildah removes its working container), and this process must outlive
    # it, or the caller, seeing it gone, would SIGKILL the group mid-cleanup.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"1":
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(f"0 {outer} {count}\n")
        except OSError as e:
            sys.stderr.write(f"mapping the namespace's ids: {e}\n")
        else:
            os.write(go_w, b"1")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _own_proc(libc: ctypes.CDLL) -> None:
    """/proc of the new PID namespace (the host's would still list the host's processes),
    mounted in this mount namespace only."""
    private = libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if private != 0 or libc.mount(b"proc", b"/proc", b"proc", flags, None) != 0:
        sys.stderr.write(f"mounting /proc: {os.strerror(ctypes.get_errno())}\n")
        os._exit(125)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
