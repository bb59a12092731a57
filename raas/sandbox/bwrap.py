"""The bubblewrap provider: rootless namespaces (user, PID, IPC, UTS, network), no network.

The root is an empty tmpfs; onto it go the host's /usr read-only (or every top-level entry of an
image directory), a private size-capped /tmp and workspace, the action server's code read-only,
and the directory that holds its socket. Nothing else of the host is visible: not the home
directories, not raas's database, not other sandboxes. As root, raas runs each sandbox as its own
unprivileged host uid, so process limits count per sandbox and root's powers never enter.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
from pathlib import Path

from raas.sandbox import procs
from raas.sandbox.base import INSIDE_DIR, SOCKET_NAME, Sandbox, runtime_root
from raas.sandbox.client import SandboxError
from raas.sandbox.config import BwrapConfig

log = logging.getLogger(__name__)

SANDBOX_UID = 1000
# What of the host's /etc a sandbox sees (read-only): enough for programs to run, no secrets.
HOST_ETC = [
    "alternatives", "ssl", "ca-certificates", "ca-certificates.conf", "ld.so.cache",
    "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "mime.types", "os-release",
    "debian_version", "python3", "python3.11", "inputrc", "bash.bashrc", "profile", "gitconfig",
    "protocols", "services", "magic", "timezone",
]  # fmt: skip
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


class _UidSlots:
    """Host uids for sandboxes when raas runs as root: one per live sandbox."""

    def __init__(self) -> None:
        self._used: set[int] = set()

    def take(self) -> int:
        slot = next(i for i in range(len(self._used) + 1) if i not in self._used)
        self._used.add(slot)
        return slot

    def give_back(self, slot: int) -> None:
        self._used.discard(slot)


_uid_slots = _UidSlots()
_inside_copy: Path | None = None


def inside_dir() -> Path:
    """The action server's code, where any uid can read it (raas may live in root's home)."""
    global _inside_copy
    if os.geteuid() != 0:
        return INSIDE_DIR
    if _inside_copy is None:
        files = sorted(p for p in INSIDE_DIR.iterdir() if p.suffix == ".py")
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:12]
        target = runtime_root() / f"inside-{digest}"
        if not target.exists():
            staging = target.with_name(target.name + f".{os.getpid()}")
            staging.mkdir(mode=0o755, exist_ok=True)
            for p in files:
                shutil.copy(p, staging / p.name)
                (staging / p.name).chmod(0o644)
            staging.rename(target)
        _inside_copy = target
    return _inside_copy


def rootfs_args(image: Path | None) -> list[str]:
    if image is None:
        args = ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        for name in HOST_ETC:
            if (Path("/etc") / name).exists():
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        return args
    if not image.is_dir():
        raise SandboxError(f"sandbox image {image} is not a directory (a root filesystem)")
    args = []
    for entry in sorted(image.iterdir()):
        if entry.name in {"proc", "dev", "tmp", "workspace", ".raas"}:
            continue
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry), f"/{entry.name}"]
        elif entry.is_dir():
            args += ["--ro-bind", str(entry), f"/{entry.name}"]
    return args


class BwrapSandbox(Sandbox):
    config: BwrapConfig

    def __init__(self, config: BwrapConfig) -> None:
        super().__init__(config)
        self._slot: int | None = None
        self._pidns: int | None = None

    def _bwrap_args(self) -> list[str]:
        cfg, limits = self.config, self.limits
        workdir = cfg.workdir
        args = [
            "bwrap", "--die-with-parent", "--new-session",
            "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        ]  # fmt: skip
        if not cfg.network:
            args.append("--unshare-net")
        args += rootfs_args(cfg.image)
        if cfg.network and Path("/etc/resolv.conf").exists():
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        args += [
            "--ro-bind", str(self.dir / "passwd"), "/etc/passwd",
            "--ro-bind", str(self.dir / "group"), "/etc/group",
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--size", str(limits.disk_bytes), "--tmpfs", workdir,
            "--ro-bind", str(inside_dir()), "/.raas/inside",
            "--bind", str(self.dir / "sock"), "/.raas/sock",
            "--chdir", workdir,
            "--clearenv", "--setenv", "PATH", PATH, "--setenv", "HOME", workdir,
            "--setenv", "LANG", "C.UTF-8", "--setenv", "USER", "sandbox",
            "--", cfg.python, "-s", "/.raas/inside/server.py",
        ]  # fmt: skip
        return args + self.server_args(f"/.raas/sock/{SOCKET_NAME}", "/tmp")

    async def _launch(self) -> asyncio.subprocess.Process:
        if shutil.which("bwrap") is None:
            raise SandboxError(
                "bubblewrap is not installed: apt-get install bubblewrap (or use the 'local'"
                " provider for development)"
            )
        (self.dir / "passwd").write_text(
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{self.config.workdir}:/bin/bash\n"
        )
        (self.dir / "group").write_text(f"sandbox:x:{SANDBOX_UID}:\n")
        user: int | None = None
        if os.geteuid() == 0:
            self._slot = _uid_slots.take()
            user = self.config.uid_base + self._slot
            for path in (self.dir, self.dir / "sock"):
                os.chown(path, user, user)
        with open(self.dir / "stderr.log", "wb") as stderr:  # noqa: ASYNC230 - a local tmp file
            process = await asyncio.create_subprocess_exec(
                *self._bwrap_args(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                user=user,
                group=user,
                extra_groups=[] if user is not None else None,
                start_new_session=True,
            )
        return process

    async def start(self) -> None:
        await super().start()
        assert self.process is not None
        # bwrap's child is the PID namespace's init; every sandbox process lives in that namespace.
        children = await asyncio.to_thread(procs.children_of, self.process.pid)
        if children:  # /proc reads, off the event loop
            self._pidns = procs.pid_namespace(children[0])

    def host_pids(self) -> set[int]:
        if self._pidns is None or self.closed:
            return set()
        return procs.in_namespace(self._pidns)

    async def _terminate(self) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            if self._pidns is not None:
                # Killing the namespace's init makes the kernel kill everything else in it. The
                # outer bwrap reaps that init and exits: killing the outer one first would leave
                # the init a zombie for the host's PID 1, which in a container may never reap it.
                left = await asyncio.to_thread(procs.empty_namespace, self._pidns, 10.0)
                if left:
                    log.error("sandbox %s: processes %s survived close", self.id, sorted(left))
            try:
                await asyncio.wait_for(process.wait(), timeout=5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                await process.wait()
        if self._slot is not None:
            _uid_slots.give_back(self._slot)
            self._slot = None
