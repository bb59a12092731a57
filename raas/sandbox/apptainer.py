"""The Apptainer provider: a SIF file or a sandbox directory, the way HPC sites run containers.

``apptainer exec --containall --no-home`` gives the sandbox its own PID, IPC and mount
namespaces, a clean environment, a minimal /dev and no home directory; ``--net --network none``
leaves it only ``lo``; ``--writable-tmpfs`` a private writable layer over the image that vanishes
with it (capped by apptainer.conf's ``sessiondir max size``). Bound in are only the workspace, the
action server's code (read-only) and, as root, a /tmp of its own; the action server gets its
listening socket as an inherited fd (apptainer keeps the fds it was started with), as with bwrap.
The action server is the same as bwrap's, started with the image's python3, and applies the
rlimits itself. Apptainer has no switch like bwrap's ``--disable-userns``: whether an agent may
create nested user namespaces is up to the site's kernel and apptainer.conf.

When raas runs as root, a plain ``apptainer exec`` would run the agent as root (and here it does
not even start: the starter asks for capabilities the machine withholds), while ``--userns``
maps the container's root to the host's root, for which the kernel does not enforce
RLIMIT_NPROC (seen: a fork loop under ``ulimit -u 5`` goes on). So, as with bwrap, each sandbox
runs as its own unprivileged host uid (``--security uid:N,gid:N``, which only root may ask for),
and its workspace and /tmp are size-capped tmpfs mounts in a mount namespace of its own
(``unshare``), gone with its last process. As a normal user apptainer runs unprivileged as that
user; the workspace is then a plain directory, capped per file (RLIMIT_FSIZE) but not in total.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from raas.sandbox import procs
from raas.sandbox.base import SERVER_PYTHON_FLAGS, launch_env
from raas.sandbox.client import SandboxError
from raas.sandbox.config import ApptainerConfig
from raas.sandbox.images import find_binary, resolve_image
from raas.sandbox.namespaced import PATH, NamespacedSandbox, inside_dir

# Mount a size-capped tmpfs on each of the directories, then run the rest (from root's unshare).
_MOUNT_TMPFS = (
    'while [ "$1" != -- ]; do mount -t tmpfs -o "$1" tmpfs "$2" || exit 125; shift 2; done;'
    ' shift; exec "$@"'
)


class ApptainerSandbox(NamespacedSandbox):
    config: ApptainerConfig

    def __init__(self, config: ApptainerConfig) -> None:
        super().__init__(config)

    def _apptainer_args(
        self, binary: str, image: Path, user: int | None, listen_fd: int
    ) -> list[str]:
        cfg = self.config
        args = [binary, "exec", "--containall", "--no-home", "--uts", "--hostname", "sandbox"]
        if not cfg.network:
            args += ["--net", "--network", "none"]
        if cfg.fakeroot:
            args.append("--fakeroot")
        elif user is not None:
            args += ["--security", f"uid:{user},gid:{user}"]
        if cfg.writable == "tmpfs":
            args.append("--writable-tmpfs")
        args += [
            "--bind", f"{inside_dir()}:/.raas/inside:ro",
            "--bind", f"{self.dir / 'workspace'}:{cfg.workdir}",
            "--pwd", cfg.workdir,
            "--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8", "--env", "USER=sandbox",
        ]  # fmt: skip
        for host, target in cfg.ro_binds.items():
            args += ["--bind", f"{host}:{target}:ro"]
        if user is not None:  # a size-capped /tmp of its own (unprivileged: apptainer's own)
            args += ["--bind", f"{self.dir / 'tmp'}:/tmp"]
        args += [str(image), cfg.python, *SERVER_PYTHON_FLAGS, "/.raas/inside/server.py"]
        return args + self.server_args(listen_fd, "/tmp")

    async def _launch(self, listen_fd: int) -> asyncio.subprocess.Process:
        binary = find_binary(self.config.binary)
        image = await asyncio.to_thread(resolve_image, self.config)
        (self.dir / "workspace").mkdir(exist_ok=True)
        user: int | None = None
        prefix: list[str] = []
        if os.geteuid() == 0 and not self.config.fakeroot:
            user = self._sandbox_uid()
            (self.dir / "tmp").mkdir(exist_ok=True)
            prefix = self._tmpfs_prefix(user)
        args = prefix + self._apptainer_args(binary, image, user, listen_fd)
        return await asyncio.create_subprocess_exec(
            *args,
            env=launch_env("PATH"),  # apptainer and unshare find their helpers on PATH
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=[listen_fd],
            start_new_session=True,
        )

    def _tmpfs_prefix(self, user: int) -> list[str]:
        if shutil.which("unshare") is None:
            raise SandboxError("unshare (util-linux) is not installed: apt-get install util-linux")
        limits = self.limits
        workspace = f"size={limits.disk_bytes},mode=0755,uid={user},gid={user}"
        tmp = f"size={limits.tmp_bytes},mode=1777"
        mounts = [workspace, str(self.dir / "workspace"), tmp, str(self.dir / "tmp")]
        shell = ["sh", "-c", _MOUNT_TMPFS, "sh", *mounts, "--"]
        return ["unshare", "--mount", "--propagation", "private", "--", *shell]

    def _find_namespace(self, pid: int) -> int | None:
        # The process we started ends as apptainer's runtime parent, outside the container; its
        # child in another PID namespace is the container's init.
        return _container_namespace(pid)

    async def _after_start(self, process: asyncio.subprocess.Process) -> None:
        await super()._after_start(process)
        if self._pidns is None:  # without it, close could not find the sandbox's processes
            raise SandboxError(f"sandbox {self.id}: apptainer started no PID namespace")

    async def _kill_unfound(self, process: asyncio.subprocess.Process) -> None:
        # Nothing like bwrap's --die-with-parent ties the container to the process we launched:
        # whatever that process started is killed by ancestry.
        members = await asyncio.to_thread(procs.descendants, process.pid)
        procs.kill(members)


def _container_namespace(pid: int) -> int | None:
    """The PID namespace of the first descendant of ``pid`` that is not in ``pid``'s own."""
    own = procs.pid_namespace(pid)
    for child in sorted(procs.descendants(pid)):
        ns = procs.pid_namespace(child)
        if ns is not None and ns != own and procs.pid_namespace(procs.parent_of(child) or 0) == own:
            return ns
    return None
