"""The Apptainer provider: a SIF file or a sandbox directory, the way HPC sites run containers.

``apptainer exec --containall --no-home`` gives the sandbox its own PID, IPC and mount
namespaces, a clean environment, a minimal /dev and no home directory; ``--net --network none``
leaves it only ``lo``; ``--writable-tmpfs`` a private writable layer over the image that vanishes
with it (capped by apptainer.conf's ``sessiondir max size``). Bound in are only the workspace, the
action server's code (read-only) and, as root, a /tmp of its own; the action server gets its
listening socket as an inherited fd (apptainer keeps the fds it was started with), as with bwrap.
The action server is the same as bwrap's, started with the image's python3 (or the Python raas
provides: ``raas.sandbox.hostpython``), and applies the rlimits itself. Apptainer has no switch
like bwrap's ``--disable-userns``: whether an agent may create nested user namespaces is up to
the site's kernel and apptainer.conf.

When raas runs as root, a plain ``apptainer exec`` would run the agent as root (and here it does
not even start: the starter asks for capabilities the machine withholds), while ``--userns``
maps the container's root to the host's root, for which the kernel does not enforce
RLIMIT_NPROC (seen: a fork loop under ``ulimit -u 5`` goes on). So, as with bwrap, each sandbox
runs as its own unprivileged host uid (``--security uid:N,gid:N``, which only root may ask for),
and its workspace and /tmp are size-capped tmpfs mounts in a mount namespace of its own
(``unshare``), gone with its last process. As a normal user apptainer runs unprivileged as that
user; the workspace is then a plain directory, capped per file (RLIMIT_FSIZE) but not in total.

The sandbox as a whole is held to its memory, process and CPU caps by a cgroup of its own where
raas can write one, as with bwrap (``raas.sandbox.cgroups``, joined through the gate of
``raas.sandbox.namespaced``): what is launched (``unshare`` as root, else apptainer) is moved in
before it runs, and apptainer's own processes (its Go runtime parent, the container's init)
count towards the caps with the agent's, since every one of them descends from it.

The seccomp filter (``raas.sandbox.seccomp``) is apptainer's own ``--security seccomp:FILE``,
a JSON profile of the same refusals, rather than raas's BPF program installed in a launcher
before apptainer runs. Apptainer installs it in the container's process just before the exec of
the action server, so apptainer itself runs unfiltered; it works as root (with ``uid:N``) and
unprivileged (user namespace mode) alike, both tried with the nested apptainer 1.4.5 of
``make test-hpc``. A filter installed before apptainer would need no_new_privs as a normal user,
which turns off the setuid bits of a setuid install's starter and of ``newuidmap`` (what
``--fakeroot`` runs), and would hold apptainer's own runtime to the list as well. An apptainer
built without libseccomp only warns and runs unfiltered: raas says so in its log (once).

An image of the image store (raas as root) is run as a sandbox directory: the copy-on-write
overlay of its layers that ``raas.sandbox.rootfs`` mounts in that same mount namespace. Any other
image is a SIF or sandbox directory that ``raas.images.sif_dir`` finds by its name, run directly
(root or not).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

from raas.images.errors import ImageError
from raas.images.image import StoredImage
from raas.images.sif_dir import resolve_image
from raas.sandbox import procs, seccomp
from raas.sandbox.base import Launched, launch_env
from raas.sandbox.client import SandboxError
from raas.sandbox.config import ApptainerConfig
from raas.sandbox.namespaced import PATH, NamespacedSandbox, gate, inside_dir

log = logging.getLogger(__name__)

BINARIES = ("apptainer", "singularity")


def find_binary(binary: str | None) -> str:
    """The apptainer (or singularity) executable to run; a SandboxError says what to do."""
    if binary is not None and os.sep in binary:
        if os.access(binary, os.X_OK) and not os.path.isdir(binary):
            return binary
        raise SandboxError(f"apptainer binary {binary} does not exist or is not executable")
    for name in (binary,) if binary else BINARIES:
        found = shutil.which(name)
        if found is not None:
            return found
    raise SandboxError(
        f"{binary or 'apptainer (or singularity)'} is not on PATH: install Apptainer or"
        " SingularityCE, or set the sandbox config's binary to its path (for tests on a"
        " machine without one: scripts/hpc/make-apptainer-env.sh builds a nested apptainer)"
    )


# Mount a size-capped tmpfs on each of the directories, then run the rest (from root's unshare).
_MOUNT_TMPFS = (
    'while [ "$1" != -- ]; do mount -t tmpfs -o "$1" tmpfs "$2" || exit 125; shift 2; done;'
    ' shift; exec "$@"'
)
SECCOMP_PROFILE = "seccomp.json"
# What an apptainer built without libseccomp says (and then runs the container unfiltered).
NO_SECCOMP = b"seccomp requested but not enabled"
_said_no_seccomp = False


class ApptainerSandbox(NamespacedSandbox):
    """An apptainer sandbox; with ``image`` (raas as root only), apptainer runs the directory
    that is that image's root (``raas.sandbox.rootfs``: an overlay of its layers, mounted first
    in a mount namespace of the sandbox's own, its work directories the sandbox uid's), as it
    runs a sandbox directory: with ``--writable-tmpfs``, writes land in apptainer's own layer
    over it (``--writable`` could not make the workspace's mount point).
    """

    config: ApptainerConfig

    def __init__(self, config: ApptainerConfig, image: StoredImage | None = None) -> None:
        super().__init__(config, image)
        self._root_prefix: list[str] = []

    def _own_env(self) -> dict[str, str]:
        return {"PATH": PATH, "LANG": "C.UTF-8", "USER": "sandbox"}

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
        args += ["--security", f"seccomp:{self.dir / SECCOMP_PROFILE}"]
        args += [
            "--bind", f"{inside_dir()}:/.raas/inside:ro",
            "--bind", f"{self.dir / 'workspace'}:{cfg.workdir}",
            "--pwd", cfg.workdir,
        ]  # fmt: skip
        for name, value in self._env().items():
            args += ["--env", f"{name}={value}"]
        for host, target in {**self.provided_binds(), **cfg.ro_binds}.items():
            args += ["--bind", f"{host}:{target}:ro"]
        if user is not None:  # a size-capped /tmp of its own (unprivileged: apptainer's own)
            args += ["--bind", f"{self.dir / 'tmp'}:/tmp"]
        args += [str(image), *self.server_command()]
        return args + self.server_args(listen_fd, "/tmp")

    async def _launch(self, listen_fd: int) -> asyncio.subprocess.Process:
        binary = find_binary(self.config.binary)
        (self.dir / "workspace").mkdir(exist_ok=True)
        await asyncio.to_thread((self.dir / SECCOMP_PROFILE).write_bytes, seccomp.profile())
        user: int | None = None
        prefix: list[str] = []
        if os.geteuid() == 0 and not self.config.fakeroot:
            user = self._sandbox_uid()
            (self.dir / "tmp").mkdir(exist_ok=True)
            prefix = self._tmpfs_prefix(user)
        if self.image is not None:
            if user is None:
                raise ImageError(
                    f"image {self.image.ref}: the apptainer provider runs images of the image"
                    " store only when raas runs as root, without fakeroot (else: bwrap)"
                )
            await asyncio.to_thread(self._plan_root, user)
            assert self._root is not None
            image = self._root.root
            prefix = self._root_prefix + prefix
        else:
            image = await asyncio.to_thread(resolve_image, self.config)
        argv = prefix + self._apptainer_args(binary, image, user, listen_fd)
        env = launch_env("PATH")  # apptainer and unshare find their helpers on PATH
        if self._root is not None:
            env.update(self._root.launch_env())

        async def spawn(run: list[str], gated: bool) -> asyncio.subprocess.Process:
            return await asyncio.create_subprocess_exec(
                *run,
                env=env,
                stdin=asyncio.subprocess.PIPE if gated else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=[listen_fd],
                start_new_session=True,
                cwd=self.dir,  # proves it this sandbox's to a successor (runtime.kill_recorded)
            )

        return await self._start_in_cgroup(argv, gate('exec "$@"', "sh", *argv), spawn)

    def _plan_root(self, user: int) -> None:
        """For an image: its root planned, and the mount prefix made (apptainer drops to the
        sandbox's uid itself: ``--security``)."""
        root = self._prepare_root(user)
        if root is not None:
            self._root_prefix = root.launch_prefix(as_owner=False)

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

    async def _after_start(self, process: Launched) -> None:
        await super()._after_start(process)
        if self._pidns is None:  # without it, close could not find the sandbox's processes
            raise SandboxError(f"sandbox {self.id}: apptainer started no PID namespace")
        global _said_no_seccomp
        if NO_SECCOMP in self._stderr and not _said_no_seccomp:
            _said_no_seccomp = True
            log.error(
                "%s was built without seccomp: apptainer sandboxes run without raas's seccomp"
                " filter (io_uring, keyctl, bpf, kernel modules are not refused)",
                self.config.binary,
            )

    async def _kill_unfound(self, process: Launched) -> None:
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
