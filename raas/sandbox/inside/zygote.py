"""The zygote: one process per sandbox template that has already started Python and imported
the action server, and forks a new sandbox for each request, so no interpreter starts and
nothing is imported per sandbox.

It runs in a bwrap of the template (the same root, /etc, /.raas and seccomp filter as a sandbox
of it; the filter and no_new_privs are inherited by every fork) as the sandbox user, with no
capabilities. A request comes on the control socket (SOCK_SEQPACKET, the fd of ``--control-fd``):
one JSON message ``{"argv": [...], "env": {...}, "mounts": [[path, bytes], ...], "hostname":
..., "lowers": [path, ...], "joins": N}`` carrying four fds (SCM_RIGHTS): the action server's
listening socket, its stdout and stderr, and a pipe to wait on; then one more for each of
``lowers``, then ``N`` of its cgroup's ``tasks`` files (v1), which the fork moves itself in by
before anything else.
The answer is ``{"pid": N}`` (the fork, in the zygote's PID namespace) or ``{"error": ...}``.
The fork is made by clone(2) into new namespaces of its own (a user namespace, the sandbox
user mapped to itself, so its process count is its own; mount, PID, IPC, UTS and network) and
is their PID namespace's init. It moves itself into the sandbox's cgroup by the ``tasks``
files (on v2 raas moves it by PID meanwhile), mounts its own /proc and a size-capped tmpfs on
each of ``mounts``; where that path is one of ``lowers`` (a fork of a sealed sandbox), the
tmpfs becomes the upper layer of an overlay whose lower is the detached mount its fd holds
(``raas.sandbox.cow``), and forbids further user namespaces. Then it waits for a byte on that
pipe, takes a cgroup namespace rooted at its cgroup, drops every capability, and forks the
action server (``server.main``, with only its three fds), then reaps what is left to it until
the server ends, as bwrap's init does in a sandbox started cold.

Standard library (with ctypes) only, Python 3.8+. Linux x86_64 and aarch64.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

import array  # noqa: E402
import ctypes  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402

import server  # noqa: E402  (imported here, once: what every fork saves)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 0x4000, 1 << 18
MNT_DETACH = 2
SYS_MOVE_MOUNT = 429  # the same on x86_64 and aarch64
AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH = -100, 0x4
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
IFREQ = "16sH22s"  # struct ifreq: the name, then ifr_flags in its union
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
CAP_V3 = 0x20080522
MAX_REQUEST = 1 << 20
MAX_PTYS = 64  # a sandbox's own: its shell's, IPython's, and what its commands open
DEVPTS = f"newinstance,ptmxmode=0666,mode=0620,max={MAX_PTYS}"
FDS = 4  # listen, stdout, stderr, go
SCRATCH_OWN = ".raas-"  # the action server's own files in /tmp (raas.sandbox.fork's too)
MAX_LOWERS = 8  # the most lower layers (fds beyond FDS) one request may carry
MAX_JOINS = 4  # the most cgroup ``tasks`` files (after the lowers') one request may carry

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def mount(source: str, target: str, kind: str, flags: int, data: str = "") -> None:
    check(
        libc.mount(source.encode(), target.encode(), kind.encode(), flags, data.encode() or None),
        f"mount {target}",
    )


def move_mount(fd: int, target: str) -> None:
    """Attach the detached mount ``fd`` holds at ``target`` (relative to the working directory)."""
    args = [ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_long(fd), ctypes.c_char_p(b"")]
    args += [ctypes.c_long(AT_FDCWD), ctypes.c_char_p(target.encode())]
    check(libc.syscall(*args, ctypes.c_long(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount {target}")


def overlay_on(path: str, lower: int) -> None:
    """The tmpfs just mounted on ``path`` becomes the upper layer (and work directory) of an
    overlay mounted over it, whose lower is the detached read-only mount ``lower`` (a sealed
    sandbox's directory): writes land in this sandbox's own tmpfs, of its size, and the lower
    is never written. ``userxattr``: overlayfs' marks (opaque directories) as ``user.``
    xattrs, the only ones a user namespace may set. The lower's own mount is detached once the
    overlay holds it, and the tmpfs lies under the overlay: neither is reachable by a path."""
    os.chdir(path)
    for name in ("upper", "work", "lower"):
        os.mkdir(name, 0o700)
    move_mount(lower, "lower")
    os.close(lower)  # else /proc/1/fd would reach the lower whole, under the child's deletes
    os.chmod("upper", os.stat("lower").st_mode & 0o7777)  # the root's mode is the upper's
    options = "lowerdir=lower,upperdir=upper,workdir=work,userxattr"
    mount("overlay", path, "overlay", MS_NOSUID | MS_NODEV, options)
    check(libc.umount2(b"lower", MNT_DETACH), "umount the lower layer")
    os.chdir("/")


def drop_scratch(directory: str) -> None:
    """The sealed action server's own files (``.raas-`` at the top of ``directory``), or what
    its sandbox planted under that name, removed from this fork's view (whiteouts in its own
    upper), before its own server starts: in this sandbox's namespaces only, so whatever the
    sealed sandbox left there (links, FIFOs, a tree deeper than Python recurses) can cost it its
    own fork at most. A directory goes by ``rm -rf``, which walks without recursion and follows
    no link."""
    trees = []
    for entry in os.scandir(directory):
        if not entry.name.startswith(SCRATCH_OWN):
            continue
        if entry.is_dir(follow_symlinks=False):
            trees.append(entry.path)
        else:
            os.unlink(entry.path)
    if trees:
        pid = os.posix_spawn("/bin/rm", ["rm", "-rf", "--", *trees], {})
        if exit_code(os.waitpid(pid, 0)[1]) != 0:
            raise OSError(f"rm -rf of {len(trees)} scratch trees failed")


def drop_capabilities() -> None:
    """Every capability this user namespace gave: the bounding set, then the rest (capset)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    header = (ctypes.c_uint32 * 2)(CAP_V3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two words each
    check(libc.syscall(SYS_CAPSET[platform.machine()], header, data), "capset")


def loopback_up() -> None:
    """The new network namespace's ``lo`` up (it starts down), as bwrap does for its own."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(IFREQ, b"lo", 0, b"")
        flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP, b""))


def become_init(request: dict, lowers: dict) -> None:
    """In the new PID namespace's init: the sandbox's own mounts, name and limits."""
    # Python's SIGINT handler would let a sandbox's ``kill -INT 1`` end its init (and the
    # sandbox); with none, the kernel keeps its namespace's signals from it, as from bwrap's.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    # The zygote's directory (bwrap's --chdir: its own workspace tmpfs, shared by every fork of
    # it) is left for the sandbox's own, once mounted: /proc/1/cwd must not reach the zygote's.
    cwd = os.getcwd()
    os.chdir("/")
    mount("none", "/", "", MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path, size in request["mounts"]:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0755")
        if path in lowers:
            overlay_on(path, lowers.pop(path))
    for fd in lowers.values():  # a lower for no mount of this sandbox's: never attached
        os.close(fd)
    # Ptys of its own (bwrap's /dev/ptmx is a link to pts/ptmx): the zygote's devpts, which
    # every fork shared, listed each tenant's terminal to the others, all of one uid, so one
    # could open another's and set it; and a few of them, since the kernel counts every
    # devpts but the host's own against one limit for the whole host.
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, DEVPTS)
    loopback_up()
    name = request["hostname"].encode()
    check(libc.sethostname(name, len(name)), "hostname")
    # No user namespace below this one: the mounts one would allow are capped by nothing.
    write("/proc/sys/user/max_user_namespaces", "0")
    for name in PROC_COVERED:  # read-only, as bwrap leaves them in a sandbox started cold
        path = "/proc/" + name
        if os.path.exists(path):
            mount(path, path, "", MS_BIND | MS_REC)
            mount("none", path, "", MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(cwd)  # the path again: now the sandbox's own mount


def join_cgroup(tasks: list) -> None:
    """Into the sandbox's cgroup (v1), by ``0`` written to each hierarchy's ``tasks`` file
    raas opened: this process alone, single-threaded, so the kernel takes no global lock."""
    try:
        for fd in tasks:
            os.write(fd, b"0")
    finally:  # each, whatever failed: one left open moves any process this one can name
        for fd in tasks:
            os.close(fd)


def lock_down() -> None:
    """What the init gives up before the action server starts: new privileges, capabilities."""
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    drop_capabilities()


def exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def reap_until(server_pid: int, fds: tuple) -> None:
    """The init's part, as bwrap's own in a sandbox started cold: reap every process left to
    it, and end (taking the namespace's processes with it) when the action server ends."""
    for fd in fds:
        os.close(fd)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == server_pid:
            os._exit(exit_code(status))


def clone_into_namespaces() -> int:
    """fork(2) into new user, mount, PID, IPC, UTS and network namespaces at once: the child
    (0 returned to it) is the new PID namespace's init, with no process between it and the
    zygote. Python has no clone; the zygote is single-threaded and the child takes no lock of
    the parent's (the call released the GIL), so it goes on as after a fork."""
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    flags |= CLONE_NEWNET | signal.SIGCHLD
    # No new stack (the child runs on its copy of this one), no tid or TLS pointers: a fork.
    # Every argument a long: a variadic int's upper half is undefined.
    args = [ctypes.c_long(a) for a in (SYS_CLONE[platform.machine()], flags, 0, 0, 0, 0)]
    pid = int(libc.syscall(*args))
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def run_sandbox(request: dict, fds: list, uid: int, gid: int) -> None:
    """The init's part, in the new namespaces: into the sandbox's cgroup, map the sandbox
    user (``uid`` and ``gid``, the zygote's) to itself, set the sandbox up, wait for raas, take
    a cgroup namespace rooted at the sandbox's cgroup and start its action server (never
    returns)."""
    listen, out, err, go = fds[:FDS]
    names = request.get("lowers", [])
    lowers = dict(zip(names, fds[FDS : FDS + len(names)]))
    joins = fds[FDS + len(names) :]
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent death signal")
    sealed_scratch = "/tmp" in lowers
    failed = None
    try:
        join_cgroup(joins)
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"{uid} {uid} 1")
        write("/proc/self/gid_map", f"{gid} {gid} 1")
        # Set up meanwhile where raas moves it into its cgroup by PID (cgroup v2: a move that
        # waits out an RCU grace period): only this code runs before, charged to no cap but
        # for the init's own few pages.
        become_init(request, lowers)
    except OSError as e:  # said once raas lets it go: till then its PID is raas's to use
        failed = e
    if os.read(go, 1) != b"g":  # raas gave up on it (or failed to move it into its cgroup)
        os._exit(1)
    os.close(go)
    if failed is not None:
        raise failed
    check(libc.unshare(CLONE_NEWCGROUP), "unshare cgroup")  # raas has moved it: the root
    if sealed_scratch:  # in its cgroup: whatever the sealed sandbox left costs its own caps
        drop_scratch("/tmp")
    lock_down()
    gc.disable()  # the init allocates nothing more: no collection ever copies its pages
    server_pid = os.fork()
    if server_pid:
        reap_until(server_pid, (listen, out, err))
    for target, fd in ((3, listen), (1, out), (2, err)):
        os.dup2(fd, target)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.closerange(4, 65536)  # the control socket and anything else of the zygote's
    gc.enable()
    os.environ.clear()
    os.environ.update(request["env"])
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    try:
        server.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        os._exit(code)
    except BaseException as e:  # said on stderr, which raas reads
        print(f"action server: {e!r}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


def reap(*_: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def serve(control: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, reap)
    # Every object imported so far into the collector's permanent generation: a fork's
    # collections never walk them, so never write to (copy) the pages that hold them.
    gc.freeze()
    uid, gid = os.getuid(), os.getgid()  # a clone's own are unmapped until it maps them
    control.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        fds = array.array("i")
        space = socket.CMSG_SPACE((FDS + MAX_LOWERS + MAX_JOINS) * fds.itemsize)
        message, ancillary, _, _ = control.recvmsg(MAX_REQUEST, space)
        if not message:  # raas closed its end
            return
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        received = list(fds)
        try:
            request = json.loads(message)
            wanted = FDS + len(request.get("lowers", [])) + int(request.get("joins", 0))
            if len(received) != wanted:
                raise ValueError(f"a request carries {len(received)} fds, not {wanted}")
            pid = clone_into_namespaces()
            if pid == 0:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                try:
                    run_sandbox(request, received, uid, gid)
                except BaseException as e:
                    os.write(received[2], (f"sandbox set-up: {e!r}\n").encode())
                    os._exit(1)
            answer = {"pid": pid}
        except (ValueError, OSError) as e:
            answer = {"error": str(e)}
        finally:
            for fd in received:
                os.close(fd)
        control.send(json.dumps(answer).encode())


def main() -> None:
    args = sys.argv[1:]
    if len(args) != 2 or args[0] != "--control-fd":
        sys.exit("zygote.py: usage: zygote.py --control-fd N")
    control = socket.socket(fileno=int(args[1]))
    control.set_inheritable(False)
    serve(control)


if __name__ == "__main__":
    main()
