"""What bwrap and apptainer sandboxes share: a PID namespace of their own, and a host uid each.

Each sandbox's processes live in one PID namespace, found once it has started: listing and
killing them goes by that namespace, so a process that double-forks or calls setsid is still
found, and nothing outside the sandbox is ever touched. As root, each sandbox runs as its own
unprivileged host uid (a slot above the config's ``uid_base``), so RLIMIT_NPROC counts per
sandbox and root's powers never enter; the slots are one table for both providers, so one raas
process never gives a bwrap and an apptainer sandbox the same uid.

Where raas can write cgroups, each sandbox is also held to its memory, process and CPU caps as a
whole (``raas.sandbox.cgroups``): the provider's launch goes through ``_start_in_cgroup``, which
starts it behind a gate (``sh`` waiting for a line on its stdin), moves that ``sh`` into the
sandbox's cgroup and only then lets it exec the provider, so nothing forks before the move
(asyncio has no hook to run between fork and exec, and a PID written after the start would let a
fork slip out). Close removes the cgroup, killing whatever is left in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar

from raas.helpers.threads import nothing, to_its_end
from raas.images.image import StoredImage
from raas.sandbox import cgroups, copies, procs, pydeps
from raas.sandbox.base import (
    EXIT_WAIT_S,
    INSIDE_DIR,
    SERVER_PYTHON_FLAGS,
    Launched,
    Sandbox,
    reap,
)
from raas.sandbox.config import ApptainerConfig, BwrapConfig
from raas.sandbox.hostpython import MOUNT, provided_python
from raas.sandbox.rootfs import ImageRoot, check_layers, image_env, overlay_options, probe_python

log = logging.getLogger(__name__)

# Both start the action server with a clean environment: the usual tool directories of an image.
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
EMPTY_NAMESPACE_S = 10.0
# The start of every gate: wait for raas's line (it has moved this sh into the cgroup; EOF: it
# failed to), then give the rest stdin from /dev/null. The provider's part follows (``gate``).
GATE = "read -r _ || exit 1; exec </dev/null; "
# Starts argv; its bool: gated, with its stdin a pipe that the gate waits on.
Spawn = Callable[[list[str], bool], Awaitable[asyncio.subprocess.Process]]


def gate(then: str, *args: str) -> list[str]:
    """``sh`` running ``then`` (``args`` its $0, $1...) once raas has moved it into a cgroup."""
    return ["sh", "-c", GATE + then, *args]


class _UidSlots:
    """Host uids for sandboxes when raas runs as root: one per live sandbox (or zygote, which
    takes its slot on the thread that starts it)."""

    def __init__(self) -> None:
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            slot = next(i for i in range(len(self._used) + 1) if i not in self._used)
            self._used.add(slot)
            return slot

    def give_back(self, slot: int) -> None:
        with self._lock:
            self._used.discard(slot)


uid_slots = _UidSlots()
_inside_copy: Path | None = None


def inside_dir() -> Path:
    """The action server's code, where any uid can read it (raas may live in root's home): a
    staged copy (``pydeps.stage_copy``), verified each time it is bound (``copies.verify``)."""
    global _inside_copy
    if os.geteuid() != 0:
        return INSIDE_DIR
    if _inside_copy is None or not copies.current(_inside_copy):
        sources = {"inside": INSIDE_DIR}
        _inside_copy = pydeps.stage_copy(sources, ["action server"], ("__pycache__", "*.md"))
    copies.verify(_inside_copy)
    return _inside_copy / "inside"


class NamespacedSandbox(Sandbox):
    """A sandbox that is one PID namespace; subclasses launch it and say how to find it."""

    config: BwrapConfig | ApptainerConfig
    # Whether the launched process waits for the namespace's init, so that its end means the
    # namespace is empty (the kernel ends an init only once all else in its namespace is gone).
    init_is_launched_child: ClassVar[bool] = False

    def __init__(
        self, config: BwrapConfig | ApptainerConfig, image: StoredImage | None = None
    ) -> None:
        super().__init__(config)
        self.image = image
        self._root: ImageRoot | None = None
        # What runs the action server: the config's python (an image's own, once found), or
        # the Python raas provides (``_prepare_root``), bound from ``_provided``.
        self._python: list[str] = [config.python]
        self._provided: Path | None = None
        self._slot: int | None = None
        self._pidns: int | None = None
        self._pin: int | None = None  # holds the namespace's number while the sandbox has it
        self._cgroup: cgroups.SandboxCgroup | None = None
        self._init: tuple[int, int] | None = None  # the namespace's init: PID and pidfd

    def _sandbox_uid(self) -> int:
        """This sandbox's own host uid (for raas running as root), held until it is closed."""
        if self._slot is None:
            self._slot = uid_slots.take()
        return self.config.uid_base + self._slot

    async def _start_in_cgroup(
        self, argv: list[str], gated: list[str], spawn: Spawn
    ) -> asyncio.subprocess.Process:
        """Start the sandbox in a cgroup of its own that holds it to its caps: ``gated`` (``argv``
        behind a ``gate``) is started, moved in, then let go. Where raas can make no cgroup,
        ``argv`` is started as it is.
        """
        limits = self.limits
        caps = cgroups.Caps(limits.sandbox_memory_bytes, limits.sandbox_tasks, limits.cpus)
        create = functools.partial(cgroups.create, self.dir.parent, self.id, caps)
        self._cgroup = await to_its_end(create, self._keep_cgroup)  # a close removes it
        if self._cgroup is None:
            return await spawn(argv, False)
        process = await spawn(gated, True)
        assert process.stdin is not None
        try:
            # To its end: cancelled, the process is reaped below, and a join still to come
            # would write a PID that may be another process's by then.
            await to_its_end(functools.partial(self._cgroup.join, process.pid), nothing)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            if not await reap(process, EXIT_WAIT_S):  # the gate, unless stuck in the kernel
                log.error("sandbox %s: process %d outlived SIGKILL", self.id, process.pid)
            raise
        process.stdin.write(b"go\n")
        process.stdin.close()
        return process

    def _keep_cgroup(self, made: cgroups.SandboxCgroup | None) -> None:
        self._cgroup = made

    @abstractmethod
    def _own_env(self) -> dict[str, str]:
        """The environment this provider gives the action server."""

    def _env(self) -> dict[str, str]:
        """The sandbox's environment: the provider's, under the image's ``Env`` where there is
        an image (its PATH, LANG, ...), but HOME and USER, which are the sandbox user's."""
        own = self._own_env()
        if self.image is None:
            return own
        merged = {**own, **image_env(self.image)}
        for name in ("HOME", "USER"):
            merged.pop(name, None)
            if name in own:
                merged[name] = own[name]
        return merged

    def server_command(self) -> list[str]:
        """The action server's command in the sandbox, but for its arguments."""
        return [*self._python, *SERVER_PYTHON_FLAGS, "/.raas/inside/server.py"]

    def provided_binds(self) -> dict[str, str]:
        """``{host copy: sandbox path}`` of the Python raas provides, where this sandbox runs on
        it (bound read-only)."""
        return {} if self._provided is None else {str(self._provided): MOUNT}

    def _prepare_root(self, user: int | None) -> ImageRoot | None:
        """For an image (in a thread, before the launch): its layers checked, its python3 found
        or else the Python raas provides staged (an ImageError where the image can run neither),
        its root planned on a tmpfs of the sandbox's disk size; ``user``: the sandbox's host uid
        when raas runs as root."""
        if self.image is None:
            return None
        check_layers(self.image)
        found = probe_python(self.image, self.config.python, self._env()["PATH"])
        if found.path is not None:
            self._python = [found.path]
        else:
            log.debug("image %s: runs on raas's Python: %s", self.image.ref, found.why)
            provided = provided_python()
            self._python, self._provided = list(provided.argv), provided.copy
        mount_dir = self.dir / "image"
        mount_dir.mkdir()
        overlay = overlay_options(rootless=user is None)
        self._root = ImageRoot(self.image, mount_dir, self.limits.disk_bytes, user, overlay)
        return self._root

    @abstractmethod
    def _find_namespace(self, pid: int) -> int | None:
        """The PID namespace of the sandbox that process ``pid`` (the one launched) started.

        Runs in a thread: it reads /proc.
        """

    async def _after_start(self, process: Launched) -> None:
        await asyncio.to_thread(self._pin_namespace, process.pid)  # /proc reads: one thread hop

    def _pin_namespace(self, pid: int) -> None:
        """The sandbox's PID namespace, held open, and its init, by pidfd."""
        ns = self._find_namespace(pid)
        if ns is not None:
            self._pin = procs.pin_namespace(ns, pid)
        # Unpinned, the number may already name another sandbox's namespace: not ours to kill.
        self._pidns = ns if self._pin is not None else None
        if self._pidns is not None and self.init_is_launched_child:
            init = procs.init_of(self._pidns, pid)
            fd = None if init is None else procs.open_pidfd(init)
            if init is not None and fd is not None and fd >= 0:
                self._init = (init, fd)

    def host_pids(self) -> set[int]:
        if self._pidns is None or self.closed:
            return set()
        return procs.in_namespace(self._pidns)

    async def _terminate(self) -> None:
        process = self.process
        try:
            if process is not None and process.returncode is None:
                await self._kill(process)
        finally:
            if self._slot is not None:
                uid_slots.give_back(self._slot)
                self._slot = None
            if self._init is not None:
                os.close(self._init[1])
                self._init = None
            if self._pin is not None:  # only now may the number name another namespace
                os.close(self._pin)
                self._pin = None
            if self._cgroup is not None:  # kills what is left in it (what escaped the namespace)
                await asyncio.to_thread(self._cgroup.remove)
                self._cgroup = None

    async def _kill(self, process: Launched) -> None:
        if self._init is not None and await self._kill_init(process):
            return
        if self._pidns is not None:
            # Killing the namespace's init makes the kernel kill everything else in it, and the
            # launched process then reaps that init and exits. Killing the launched one first
            # would leave the init a zombie for the host's PID 1, which in a container may never
            # reap it.
            left = await asyncio.to_thread(procs.empty_namespace, self._pidns, EMPTY_NAMESPACE_S)
            if left:
                log.error("sandbox %s: processes %s survived close", self.id, sorted(left))
        else:
            await self._kill_unfound(process)
        if await reap(process, EXIT_WAIT_S):
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        if not await reap(process, EXIT_WAIT_S):
            log.error("sandbox %s: process %d outlived SIGKILL", self.id, process.pid)

    async def _kill_init(self, process: Launched) -> bool:
        """SIGKILL the namespace's init (by its pidfd) and wait for the launched process, its
        parent, to end: then nothing is left in the namespace, found without reading /proc.
        False if it did not end in time (``_kill`` then goes by the namespace)."""
        assert self._init is not None
        pid, fd = self._init
        procs.signal_pidfd(fd, pid)
        return await reap(process, EXIT_WAIT_S)

    async def _kill_unfound(self, process: Launched) -> None:
        """Kill what ``process`` started when it failed before its namespace was found.

        By default nothing: a provider whose sandbox dies with the launched process needs no more
        than the SIGKILL that follows.
        """
