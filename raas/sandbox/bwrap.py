"""The bubblewrap provider: rootless namespaces (user, PID, IPC, UTS, network), no network.

The root is an empty tmpfs; onto it go the host's /usr read-only (or every top-level entry of an
image directory), a private size-capped /tmp and workspace, the action server's code read-only,
and the directory that holds its socket. Nothing else of the host is visible: not the home
directories, not raas's database, not other sandboxes. As root, raas runs each sandbox as its own
unprivileged host uid, so process limits count per sandbox and root's powers never enter.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from raas.sandbox import procs
from raas.sandbox.base import SOCKET_NAME
from raas.sandbox.client import SandboxError
from raas.sandbox.config import BwrapConfig
from raas.sandbox.namespaced import PATH, NamespacedSandbox, inside_dir

SANDBOX_UID = 1000
# What of the host's /etc a sandbox sees (read-only): enough for programs to run, no secrets.
HOST_ETC = [
    "alternatives", "ssl", "ca-certificates", "ca-certificates.conf", "ld.so.cache",
    "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "mime.types", "os-release",
    "debian_version", "python3", "python3.11", "inputrc", "bash.bashrc", "profile", "gitconfig",
    "protocols", "services", "magic", "timezone",
]  # fmt: skip


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


class BwrapSandbox(NamespacedSandbox):
    config: BwrapConfig

    def __init__(self, config: BwrapConfig) -> None:
        super().__init__(config)

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
            user = self._sandbox_uid()
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

    def _find_namespace(self, pid: int) -> int | None:
        # bwrap's child is the PID namespace's init; every sandbox process lives in that namespace.
        # When a start fails before it is known, close's SIGKILL of bwrap is enough: the sandbox
        # goes with it (--die-with-parent).
        children = procs.children_of(pid)
        return procs.pid_namespace(children[0]) if children else None
