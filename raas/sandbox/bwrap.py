"""The bubblewrap provider: rootless namespaces (user, PID, IPC, UTS, network), no network.

The root is an empty tmpfs, made read-only once set up; onto it go the host's /usr read-only (or
every top-level entry of an image directory), a private size-capped /tmp, /dev/shm and workspace,
the action server's code read-only, and what the config's ``ro_binds`` name (read-only; none by
default). The action server gets its listening socket as an inherited fd, and bwrap its arguments
through one (``--args``), so no other host directory is bound in and no host path shows in a
command line. Nothing else of the host is visible: not the home
directories, not raas's database, not other sandboxes; nothing writable inside is on the host's
disk, and no nested user namespace can be made (``--disable-userns``) to mount more. As root, raas
runs each sandbox as its own unprivileged host uid, so process limits count per sandbox and
root's powers never enter. A seccomp filter refuses the system calls no agent needs
(``raas.sandbox.seccomp``), and where raas can write cgroups the sandbox as a whole is held to
its memory, process and CPU caps (``raas.sandbox.cgroups``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from raas.helpers.threads import nothing, to_its_end
from raas.images.image import StoredImage
from raas.sandbox import cgroups, cow, procs, seccomp
from raas.sandbox import zygote as zygotes
from raas.sandbox.base import INSIDE_DIR, SERVER_PYTHON_FLAGS, Launched, launch_env, reap
from raas.sandbox.checkpoint import (
    Checkpointed,
    Restored,
    archive_tree,
    tree_signature,
    unpack_chain,
)
from raas.sandbox.client import SandboxError
from raas.sandbox.config import BwrapConfig, SandboxLimits
from raas.sandbox.fork import (
    CARRY_ALL,
    SCRATCH_OWN,
    SHELL_OUTPUT_BYTES,
    ForkCarry,
    ShellState,
    check_fits,
    copy_into,
    fork_note,
    namespace_init,
    not_carried,
    read_shell_command,
)
from raas.sandbox.namespaced import PATH, NamespacedSandbox, gate, uid_slots

log = logging.getLogger(__name__)

SANDBOX_UID = 1000
# The kernel's FILESYSTEM_MAX_STACK_DEPTH: an overlay over an overlay over a tmpfs, no deeper.
MAX_STACK = 2
# A zygote's own scratch mounts: its forks mount theirs, of their sizes, over them.
ZYGOTE_LIMITS = SandboxLimits(shm_bytes=1 << 20, tmp_bytes=1 << 20, disk_bytes=1 << 20)
# What the gate runs when the sandbox has a cgroup: bwrap with no environment (dash exports PWD;
# PATH stays an unexported shell variable) and the bare name as argv[0]. $0: bwrap's directory.
EXEC_BWRAP = 'unset PWD OLDPWD; PATH=$0; exec bwrap "$@"'
# What of the host's /etc a sandbox sees (read-only): enough for programs to run, no secrets.
HOST_ETC = [
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "mime.types",
    "os-release",
    "debian_version",
    "python3",
    "python3.11",
    "inputrc",
    "bash.bashrc",
    "profile",
    "gitconfig",
    "protocols",
    "services",
    "magic",
    "timezone",
]


NO_BWRAP = (
    "bubblewrap is not installed: apt-get install bubblewrap (or use the 'local' provider for"
    " development)"
)


def _cgroup_to_join(
    runtime_dir: Path, sandbox_id: str, caps: cgroups.Caps
) -> tuple[cgroups.SandboxCgroup | None, list[int]]:
    """Blocking: a zygote's sandbox's cgroup, and the fds it moves itself in by (none on v2)."""
    group = cgroups.create(runtime_dir, sandbox_id, caps)
    try:
        return group, [] if group is None else group.open_self_joins()
    except BaseException:
        if group is not None:
            group.remove()
        raise


def _let_go_of(forked: zygotes.Forked) -> None:
    """A fork no start wants any more: with its pipe to go closed, it exits having run nothing."""
    for fd in (forked.go, forked.stdout, forked.stderr):
        with contextlib.suppress(OSError):
            os.close(fd)


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


@functools.cache
def disables_userns() -> bool:
    """Whether this bwrap can forbid nested user namespaces (``--disable-userns``, 0.8+)."""
    try:
        usage = subprocess.run(
            ["bwrap", "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    if "--disable-userns" in usage.stdout + usage.stderr:
        return True
    log.warning(
        "bubblewrap is older than 0.8 (no --disable-userns): agents in sandboxes can create"
        " nested user namespaces, and in them mounts that no size limit caps"
    )
    return False


@functools.cache
def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


@functools.cache
def _inside_files() -> dict[str, bytes]:
    """The action server's code, copied into each sandbox (no host path shows in its mounts)."""
    return {p.name: p.read_bytes() for p in sorted(INSIDE_DIR.glob("*.py"))}


def _memfd(name: str, data: bytes) -> int:
    """An fd to read ``data`` from (what bwrap's ``--args`` and ``--ro-bind-data`` take)."""
    fd = os.memfd_create(name)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclasses.dataclass(frozen=True)
class _ForkLayer:
    """Where a fork's parent keeps its root's changes (a host path through its /proc/PID/root):
    its overlay's upper directory, or its whole root (``overlay`` None: the copy fallback);
    ``owner``: the parent's host uid (raas as root); ``overlay``: the parent's overlay options,
    which the child's root takes too (the changes are of that kind)."""

    source: Path
    owner: int | None
    overlay: str | None
    image_kept: tuple[str, ...] = ()  # ForkCarry's: the root's entries left as the image has them


@dataclasses.dataclass(frozen=True)
class _Sealed:
    """What a sealed sandbox keeps for its forks: the holder of its files, its shell's state
    and what ran in it besides (read before its processes were killed), and its host uid (raas
    as root: its files' owner, which a fork must run as)."""

    held: cow.Held
    shell: ShellState
    lost: list[str]
    uid: int | None


# Whether forks can mount overlays over a sealed sandbox's files here (None: not tried yet).
_overlays_work: bool | None = None


class BwrapSandbox(NamespacedSandbox):
    """A bwrap sandbox; with ``image``, its root is a copy-on-write overlay of that image's
    layers (``raas.sandbox.rootfs``), its action server runs on the image's own python3 (or,
    where it has none raas can run on, the Python raas provides: ``raas.sandbox.hostpython``), and
    its environment is the image's ``Env`` (PATH and the rest) under raas's HOME and USER.
    """

    config: BwrapConfig
    can_fork = True
    init_is_launched_child = True  # bwrap's child is the init (a zygote's fork is the init)

    def __init__(self, config: BwrapConfig, image: StoredImage | None = None) -> None:
        super().__init__(config, image)
        # Read from the image's layers before the launch (off the event loop).
        self._root_binds: list[str] = []
        self._root_prefix: list[str] = []
        self._fork_layer: _ForkLayer | None = None
        self._seed_fd: int | None = None  # a fork's: its parent's changes, for the launch
        self._zygote_uid: int | None = None  # forked from a zygote as root: the zygote's uid
        self._forked = False  # forked from a zygote: the launched process is the init
        self._sealed: _Sealed | None = None
        self._seal_lock = asyncio.Lock()
        # A fork of a sealed sandbox's: a detached mount (fd) of each directory that its own
        # tmpfs goes over (an overlay's upper), for its launch; and the uid that owns them.
        self._lowers: dict[str, int] = {}
        self._lowers_owner: int | None = None
        # How many overlays deep its workspace and /tmp are (a fork of a sealed sandbox: one
        # more than its parent's): the kernel stacks file systems MAX_STACK deep at most.
        self._depth = 0

    def _bwrap_args(self, data_fds: dict[str, int], zygote: bool = False) -> list[str]:
        """bwrap's options; ``data_fds``: an fd to read each file from (passwd, group and the
        action server's code; see ``_data``). ``zygote``: for this template's zygote, whose
        forks mount their own tmpfs of their sizes over its (tiny) ones and make their own user
        namespaces (so it does not forbid them: each fork forbids its own).
        """
        cfg, limits = self.config, self.limits
        if zygote:
            limits = ZYGOTE_LIMITS
        workdir = cfg.workdir
        args = [
            "--die-with-parent", "--new-session",
            "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        ]  # fmt: skip
        if disables_userns() and not zygote:
            args.append("--disable-userns")
        if "seccomp" in data_fds:
            args += ["--seccomp", str(data_fds["seccomp"])]
        if not cfg.network:
            args.append("--unshare-net")
        args += self._root_binds if self._root is not None else rootfs_args(cfg.image)
        if cfg.network and Path("/etc/resolv.conf").exists():
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        args += [
            "--ro-bind-data", str(data_fds["passwd"]), "/etc/passwd",
            "--ro-bind-data", str(data_fds["group"]), "/etc/group",
            "--proc", "/proc",
            # /dev is a tmpfs the sandbox owns: read-only, but for a capped /dev/shm.
            "--dev", "/dev", "--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev",
            "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--size", str(limits.disk_bytes), "--tmpfs", workdir,
        ]  # fmt: skip
        for directory in cfg.tmpfs_dirs:
            args += ["--size", str(limits.tmp_bytes), "--tmpfs", directory]
        if zygote:  # its forks mount their own over these: the zygote's are no one's to write
            for directory in ("/dev/shm", "/tmp", workdir, *cfg.tmpfs_dirs):
                args += ["--remount-ro", directory]
        for name in _inside_files():
            args += ["--perms", "0444", "--file", str(data_fds[name]), f"/.raas/inside/{name}"]
        for host, target in {**self.provided_binds(), **cfg.ro_binds}.items():
            args += ["--ro-bind", host, target]
        args += [
            # Last: the root tmpfs (and what it holds: /etc, /.raas) becomes read-only.
            "--remount-ro", "/",
            "--chdir", workdir, "--clearenv",
        ]  # fmt: skip
        for name, value in self._env().items():
            args += ["--setenv", name, value]
        return args

    def _own_env(self) -> dict[str, str]:
        return {"PATH": PATH, "HOME": self.config.workdir, "LANG": "C.UTF-8", "USER": "sandbox"}

    def _plan_root(self, user: int | None) -> None:
        """For an image: its root planned, and bwrap's binds and the mount prefix made. A
        fork's root is seeded with its parent's changes: the launch copies them from an open
        directory (``_seed_fd``) into the fork's own tmpfs, of its ``disk_bytes``, before it
        mounts the overlay (``rootfs.MOUNT_SCRIPT``): they count against the fork's cap, never
        lie on the host's disk, and go when the fork closes."""
        root = self._prepare_root(user)
        if root is None:
            return
        layer = self._fork_layer
        if layer is not None:
            owner = None if user is None else layer.owner
            root = dataclasses.replace(
                root, overlay=layer.overlay, seed_owner=owner, seed_keep=layer.image_kept
            )
        own = [directory.lstrip("/") for directory in self.config.tmpfs_dirs]
        self._root_binds, self._root_prefix = root.bwrap_args(own), root.launch_prefix()
        if layer is not None:
            try:
                fd = os.open(layer.source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as e:
                raise SandboxError(f"fork: cannot open the parent's root changes: {e}") from None
            self._seed_fd = fd
            root = dataclasses.replace(root, seed_fd=fd)
        self._root = root

    def _host_uid(self) -> int | None:
        if self._zygote_uid is not None:
            return self._zygote_uid
        return None if self._slot is None else self.config.uid_base + self._slot

    def host_pids(self) -> set[int]:
        if self._sealed is not None:  # it ran its last at the seal (its init's zombie aside,
            return set()  # which its zygote reaps when it comes to it)
        return super().host_pids()

    async def seal(self) -> bool:
        """See ``Sandbox.seal``: for a sandbox forked from a zygote (no image, no network).
        An image's root keeps a copy fork (its launch copies the parent's upper layer)."""
        async with self._seal_lock:
            if self._sealed is not None:
                return True
            if not self._forked or self.closed or self.process is None:
                return False
            if self._depth >= MAX_STACK:  # its forks' overlays would be one too deep
                return False
            shell = await self._shell_state()
            init, lost = await asyncio.to_thread(self._processes)
            try:
                held = await asyncio.to_thread(cow.hold, init, [self.config.workdir, "/tmp"])
            except cow.HoldRefused as e:
                log.warning("sandbox %s: not sealed, its forks copy: %s", self.id, e)
                return False
            try:
                if not await self._forks_mount_overlays(held):
                    await asyncio.to_thread(held.close)
                    return False
                await self._end_processes()
            except BaseException:
                await asyncio.to_thread(held.close)
                raise
            self._sealed = _Sealed(held, shell, lost, self._host_uid())
            return True

    async def _forks_mount_overlays(self, held: cow.Held) -> bool:
        """Whether a fork's init can mount its overlays over ``held``'s copies (moving a
        detached mount of another user namespace's into its own: Linux 6.18 allows it, an
        older kernel may not), found once per process by a trial fork, before the first seal
        kills anything: where it cannot, no sandbox is sealed and forks copy."""
        global _overlays_work
        if _overlays_work is None:
            trial = BwrapSandbox(self.config, self.image)
            trial._lowers = await asyncio.to_thread(held.copies)
            trial._lowers_owner = self._host_uid()
            try:
                await trial.start()
                _overlays_work = True
            except SandboxError as e:
                log.warning("sandboxes are not sealed, their forks copy: %s", e)
                _overlays_work = False
            finally:
                await trial.close()
                trial._close_lowers()
        return _overlays_work

    async def _end_processes(self) -> None:
        """Every process of this sandbox killed, and seen gone: the namespace's init killed
        (the kernel kills the rest and ends the init last) and its end seen, the namespace found
        empty, and what else its cgroup held killed. A SandboxError where any is left."""
        process = self.process
        assert process is not None
        if self.client is not None:
            client, self.client = self.client, None
            await client.close()
        if self._init is not None:
            await self._kill_init(process)
        else:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await reap(process, zygotes.ANSWER_TIMEOUT_S)
        # A zombie holds no file: the init's, until the zygote reaps it, is left out.
        left: set[int] = set()
        if self._pidns is not None:
            ns = self._pidns
            left = await asyncio.to_thread(procs.empty_namespace, ns, zygotes.ANSWER_TIMEOUT_S)
        if self._cgroup is not None:
            left |= {p for p in await asyncio.to_thread(self._cgroup.pids) if procs.alive(p)}
        if process.returncode is None or left:
            raise SandboxError(f"seal of {self.id}: its processes did not all end: {sorted(left)}")

    async def _fork_sealed(self, limits: SandboxLimits | None, carry: ForkCarry) -> BwrapSandbox:
        """A fork of this sealed sandbox: its workspace and /tmp overlays over this one's
        (nothing copied), its shell's state as read at the seal."""
        sealed = self._sealed
        assert sealed is not None
        child = BwrapSandbox(self._child_config(limits, carry), self.image)
        self.share_holds(child)
        restored = None
        try:
            if carry.scratch:
                child._lowers = await asyncio.to_thread(sealed.held.copies)
                child._lowers_owner, child._depth = sealed.uid, self._depth + 1
            await child.start()
            if carry.scratch:
                restored = await child.bash(sealed.shell.restore_command())
                if restored.exit_code != 0:
                    raise SandboxError(f"fork of {self.id}: the shell's state: {restored.output}")
        except BaseException:
            await child.close()
            child._close_lowers()
            raise
        shell_lost: list[str] = []
        if restored is not None:
            shell_lost = [*sealed.shell.dropped, *sealed.shell.not_restored(restored.output)]
        child.note = fork_note(self.id, sealed.lost, shell_lost)
        return child

    def _close_lowers(self) -> None:
        lowers, self._lowers = self._lowers, {}
        for fd in lowers.values():
            os.close(fd)

    def _child_config(self, limits: SandboxLimits | None, carry: ForkCarry) -> BwrapConfig:
        config = self.config
        if limits is not None:
            config = config.model_copy(update={"limits": limits})
        if carry.tmpfs_dirs:
            config = config.model_copy(update={"tmpfs_dirs": carry.tmpfs_dirs})
        if carry.ro_binds is not None:
            config = config.model_copy(update={"ro_binds": dict(carry.ro_binds)})
        return config

    async def _terminate(self) -> None:
        try:
            await super()._terminate()
        finally:
            self._close_lowers()
            if self._sealed is not None:
                await asyncio.to_thread(self._sealed.held.close)

    async def fork(
        self, limits: SandboxLimits | None = None, carry: ForkCarry = CARRY_ALL
    ) -> BwrapSandbox:
        if self._sealed is not None:
            return await self._fork_sealed(limits, carry)
        if carry.image_kept and self._root is not None and self._root.overlay is None:
            raise SandboxError(
                f"sandbox {self.id}: a fork that leaves {', '.join(carry.image_kept)} as the"
                " image has them needs overlayfs, which this kernel refuses here"
            )
        state = await self._shell_state() if carry.scratch else None
        pids = await asyncio.to_thread(self.host_pids)
        lost = await asyncio.to_thread(not_carried, pids)
        init = await asyncio.to_thread(namespace_init, pids)
        if init is None or self.process is None:
            raise SandboxError(f"sandbox {self.id}: its processes are gone; cannot fork it")
        config = self._child_config(limits, carry)
        caps = config.limits
        # What the child's tmpfs mounts must hold, in allocated blocks: refused before a copy.
        scratch = [(config.workdir, "", "disk_bytes"), ("/tmp", SCRATCH_OWN, "tmp_bytes")]
        if not carry.scratch:
            scratch = []
        mounts = [
            (
                f"workspace ({path})" if path != "/tmp" else path,
                Path(f"/proc/{init}/root{path}"),
                cap,
                getattr(caps, cap),
            )
            for path, _, cap in scratch
        ]
        child = BwrapSandbox(config, self.image)
        if self._root is not None:
            tree = "upper" if self._root.overlay is not None else "root"
            # The parent's root lives in its launch's mount namespace (not bwrap's).
            mount = Path(f"/proc/{self.process.pid}/root{self._root.mount_dir}")
            mounts.append(("image root's changes", mount, "disk_bytes", caps.disk_bytes))
            child._fork_layer = _ForkLayer(
                mount / tree, self._host_uid(), self._root.overlay, carry.image_kept
            )
        await asyncio.to_thread(check_fits, self.id, mounts)
        self.share_holds(child)
        restored = None
        try:
            await child.start()
            child_init = await asyncio.to_thread(lambda: namespace_init(child.host_pids()))
            if child_init is None:
                raise SandboxError(f"sandbox {child.id}: its namespace was not found")
            uid = child._host_uid()
            for path, skip, _ in scratch:
                ours, theirs = (
                    Path(f"/proc/{init}/root{path}"),
                    Path(f"/proc/{child_init}/root{path}"),
                )
                await asyncio.to_thread(copy_into, ours, theirs, skip, uid)
            if state is not None:
                restored = await child.bash(state.restore_command())
                if restored.exit_code != 0:
                    raise SandboxError(f"fork of {self.id}: the shell's state: {restored.output}")
        except BaseException:
            await child.close()
            if child._seed_fd is not None:  # opened, but its launch never came to take it
                os.close(child._seed_fd)
                child._seed_fd = None
            raise
        shell_lost: list[str] = []
        if state is not None and restored is not None:
            shell_lost = [*state.dropped, *state.not_restored(restored.output)]
        child.note = fork_note(self.id, lost, shell_lost)
        return child

    @property
    def can_checkpoint(self) -> bool:
        # An image root's changes are not archived (yet). The image, not the root, says so:
        # the root is planned only at the start, and a sandbox not yet started must say no.
        return self.image is None

    def _check_checkpoints(self) -> None:
        if not self.can_checkpoint:
            raise SandboxError(f"sandbox {self.id}: an image root's changes are not checkpointed")

    async def checkpoint(
        self, snar: Path, dest: Path, max_bytes: int, unchanged: str | None = None
    ) -> Checkpointed:
        self._check_checkpoints()
        state = await self._shell_state()
        init, lost = await asyncio.to_thread(self._processes)
        # Metadata only, never a file's bytes, and never beyond the process: a link swapped in
        # under the walk changes the digest (so an archive is written), nothing else.
        source = Path(f"/proc/{init}/root{self.config.workdir}")
        signature = await asyncio.to_thread(tree_signature, source)
        if signature is not None and signature == unchanged:  # no archive needed: no change
            return Checkpointed(None, 0, None, state, (*lost, *state.dropped), signature)
        size, sha = await asyncio.to_thread(
            archive_tree, init, self.config.workdir, snar, dest, max_bytes, self._host_uid()
        )
        return Checkpointed(dest, size, sha, state, (*lost, *state.dropped), signature)

    async def restore(self, archives: Sequence[Path], shell: ShellState | None) -> Restored:
        self._check_checkpoints()  # its workspace alone would not be the image sandbox's state
        init, _ = await asyncio.to_thread(self._processes)
        await asyncio.to_thread(unpack_chain, archives, init, self._host_uid())
        if shell is None:
            return Restored()
        restored = await self.bash(shell.restore_command())
        if restored.exit_code != 0:
            raise SandboxError(f"sandbox {self.id}: restoring the shell's state: {restored.output}")
        return Restored(tuple(shell.not_restored(restored.output)))

    def _processes(self) -> tuple[int, list[str]]:
        """The host PID of the sandbox's init, and what runs besides its own (in words)."""
        pids = self.host_pids()
        init = namespace_init(pids)
        if init is None:
            raise SandboxError(f"sandbox {self.id}: its processes are gone")
        return init, not_carried(pids)

    async def _shell_state(self) -> ShellState:
        """The agent's shell's directory and exported variables: data the shell prints for the
        host to check, never code to replay."""
        nonce = secrets.token_hex(8)
        shell = await self.call(
            "bash", command=read_shell_command(nonce), max_output=SHELL_OUTPUT_BYTES
        )
        return ShellState.parse(str(shell["output"]), nonce, not shell["output_cut_bytes"])

    def _data(self) -> dict[str, bytes]:
        """The files bwrap makes from data: passwd, group, and the action server's code."""
        home = self.config.workdir
        data = {
            "passwd": f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{home}:/bin/bash\n".encode(),
            "group": f"sandbox:x:{SANDBOX_UID}:\n".encode(),
            **_inside_files(),
        }
        program = seccomp.host_program()
        if program is not None:
            data["seccomp"] = program
        return data

    def _command(self, listen_fd: int) -> list[str]:
        """What bwrap runs: it must be on bwrap's own command line, which holds no host path."""
        return ["--", *self.server_command(), *self.server_args(listen_fd, "/tmp")]

    async def _launch(self, listen_fd: int) -> Launched:
        binary = shutil.which("bwrap")
        if binary is None:
            raise SandboxError(NO_BWRAP)
        await asyncio.to_thread(disables_userns)  # runs bwrap --help once, off the loop
        if self._uses_zygote():
            return await self._zygote_launch(binary, listen_fd)
        user: int | None = None
        if os.geteuid() == 0:
            user = self._sandbox_uid()
        await asyncio.to_thread(self._plan_root, user)
        fds: list[int] = []
        try:
            if self._seed_fd is not None:  # a fork's parent's changes: the launch closes it
                fds.append(self._seed_fd)
                self._seed_fd = None
            data_fds: dict[str, int] = {}
            for name, data in self._data().items():
                fds.append(fd := _memfd(name, data))
                data_fds[name] = fd
            args = b"".join(a.encode() + b"\0" for a in self._bwrap_args(data_fds))
            fds.append(args_fd := _memfd("bwrap-args", args))
            # argv[0] is the bare name: the sandbox's PID 1 shows no path of the host.
            argv = ["bwrap", "--args", str(args_fd), *self._command(listen_fd)]
            bwrap_dir = os.path.dirname(binary)
            gated_argv = gate(EXEC_BWRAP, bwrap_dir, *argv[1:])
            env: dict[str, str] = {}
            if self._root is not None:
                # Mounts the root (as root), then runs bwrap as ``user``, behind the gate when
                # gated: the mounts' own processes are the sandbox's too.
                argv = [*self._root_prefix, "/bin/sh", "-c", EXEC_BWRAP, bwrap_dir, *argv[1:]]
                gated_argv = gate('exec "$@"', "sh", *argv)
                binary, env, user = argv[0], self._root.launch_env(), None

            async def spawn(run: list[str], gated: bool) -> asyncio.subprocess.Process:
                executable = "/bin/sh" if gated else binary
                return await self._spawn(run, executable, [listen_fd, *fds], user, gated, env)

            return await self._start_in_cgroup(argv, gated_argv, spawn)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _uses_zygote(self) -> bool:
        """Whether this sandbox is forked from its template's zygote: the host's root (an
        image root is mounted per sandbox), no network (a fork takes a network namespace of its
        own), and a kernel with pidfds (how raas sees the end of a process not its child)."""
        cfg = self.config
        return cfg.zygote and self.image is None and not cfg.network and _has_pidfd()

    def _zygote_key(self) -> str:
        """What the template's zygote is: everything of the config but the sizes and caps,
        which each fork takes for itself."""
        parts = [self.config.model_dump(mode="json", exclude={"limits"}), self._python]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def _start_zygote(self, binary: str) -> zygotes.Zygote:
        """Blocking, on the zygote keeper thread: this template's zygote, started and ready."""
        slot = uid_slots.take() if os.geteuid() == 0 else None
        user = None if slot is None else self.config.uid_base + slot
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds: list[int] = []
        try:
            data_fds: dict[str, int] = {}
            for name, data in self._data().items():
                fds.append(fd := _memfd(name, data))
                data_fds[name] = fd
            args = b"".join(a.encode() + b"\0" for a in self._bwrap_args(data_fds, zygote=True))
            fds.append(args_fd := _memfd("bwrap-args", args))
            control = str(theirs.fileno())
            zygote_py = [*self._python, *SERVER_PYTHON_FLAGS, "/.raas/inside/zygote.py"]
            argv = ["bwrap", "--args", str(args_fd), "--", *zygote_py, "--control-fd", control]
            process = subprocess.Popen(
                argv,
                executable=binary,
                env=launch_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=[theirs.fileno(), *fds],
                user=user,
                group=user,
                extra_groups=[] if user is not None else None,
                start_new_session=True,
                cwd=self.dir.parent,
            )
        except BaseException:
            ours.close()
            if slot is not None:
                uid_slots.give_back(slot)
            raise
        finally:
            theirs.close()
            for fd in fds:
                os.close(fd)
        zygote = zygotes.Zygote(process, ours, user)
        if slot is not None:
            zygote.on_kill = functools.partial(uid_slots.give_back, slot)
        try:
            zygote.wait_ready()
        except BaseException:
            zygote.kill()
            raise
        return zygote

    async def _zygote_launch(self, binary: str, listen_fd: int) -> Launched:
        """This sandbox forked from its template's zygote: held until it is in its cgroup."""
        key = self._zygote_key()
        zygote = await zygotes.get(key, functools.partial(self._start_zygote, binary))
        self._zygote_uid = zygote.uid
        if self._lowers and zygote.uid != self._lowers_owner:
            raise SandboxError(
                f"sandbox {self.id}: a fork of a sealed sandbox must run as its uid"
                f" ({self._lowers_owner}), not {zygote.uid}: fork it with its own config"
            )
        limits = self.limits
        mounts = [
            ("/dev/shm", limits.shm_bytes),
            ("/tmp", limits.tmp_bytes),
            (self.config.workdir, limits.disk_bytes),
            *((directory, limits.tmp_bytes) for directory in self.config.tmpfs_dirs),
        ]
        caps = cgroups.Caps(limits.sandbox_memory_bytes, limits.sandbox_tasks, limits.cpus)

        def undo_join(made: tuple[cgroups.SandboxCgroup | None, list[int]]) -> None:
            self._cgroup = made[0]  # the close that follows removes it
            for fd in made[1]:
                os.close(fd)

        self._cgroup, joins = await to_its_end(
            functools.partial(_cgroup_to_join, self.dir.parent, self.id, caps), undo_join
        )
        try:
            request = zygotes.Request(
                self.server_args(zygotes.LISTEN_FD, "/tmp"),
                self._env(),
                mounts,
                "sandbox",
                list(self._lowers),
                len(joins),
            )
            # The thread passes these fds (and listen_fd) on by number: none is closed before
            # it ends, even by a cancellation.
            lowers = list(self._lowers.values())
            forked = await to_its_end(
                functools.partial(zygote.fork, request, listen_fd, lowers, joins), _let_go_of
            )
        finally:
            self._close_lowers()  # the fork has its own: the zygote passed them on
            for fd in joins:
                os.close(fd)
        pending = [forked.stdout, forked.stderr]  # ours to close till a reader takes each
        try:
            if self._cgroup is not None and not joins:  # v2: moved by PID (on v1 it moves itself)
                await to_its_end(functools.partial(self._cgroup.join, forked.pid), nothing)
            self._forked = True
            streams = []
            while pending:
                streams.append(await zygotes.reader(pending.pop(0)))  # its transport closes it
            # Its pidfd while it waits for go: till then it cannot end (but killed), and the go
            # written proves it alive when the pidfd was opened, so the pidfd is the fork's.
            process = zygotes.ForkedProcess(forked.pid, *streams)
            try:
                os.write(forked.go, b"g")
            except OSError as e:  # no reader: the fork is dead, its PID maybe another's by now
                process.release()
                raise SandboxError(
                    f"sandbox {self.id}: its process ended before it was let go ({e})"
                ) from None
            return process
        except BaseException:
            for fd in pending:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        finally:
            os.close(forked.go)

    async def _spawn(
        self,
        argv: list[str],
        binary: str,
        pass_fds: list[int],
        user: int | None,
        gated: bool = False,
        env: dict[str, str] | None = None,
    ) -> asyncio.subprocess.Process:
        """Start ``argv``; ``gated``: its stdin a pipe it waits on (``namespaced.gate``);
        ``env``: for an image root's mount script, which unsets it."""
        return await asyncio.create_subprocess_exec(
            *argv,
            executable=binary,
            env={**launch_env(), **(env or {})},  # bwrap needs none: found by its full path
            stdin=asyncio.subprocess.PIPE if gated else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=pass_fds,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
            start_new_session=True,
            cwd=self.dir,  # what proves it this sandbox's to a successor (runtime.kill_recorded)
        )

    def _find_namespace(self, pid: int) -> int | None:
        # bwrap's child is the PID namespace's init; every sandbox process lives in that namespace.
        # When a start fails before it is known, close's SIGKILL of bwrap is enough: the sandbox
        # goes with it (--die-with-parent).
        if self._forked:
            return procs.pid_namespace(pid)
        children = procs.children_of(pid)
        return procs.pid_namespace(children[0]) if children else None
