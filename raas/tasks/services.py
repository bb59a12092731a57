"""What the service gives every task: the LLM backends, the tokenizer, sandboxes, and the task
directories a submission may name by their path."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raas.agent.checkpoints import CheckpointBook
from raas.agent.gateway import Gateway
from raas.agent.loop import Generator
from raas.agent.snapshots import Snapshots
from raas.helpers.task_dirs import (
    NotATaskUnderRoots,
    TaskDirError,
    beneath_roots,
    read_task_under,
)
from raas.images.image import StoredImage
from raas.images.store import ImageStore, default_store_dir
from raas.sandbox import (
    ApptainerConfig,
    BwrapConfig,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPool,
    cgroups,
    create_sandbox,
    runtime_root,
)
from raas.sandbox.egress import EgressPolicy
from raas.sandbox.proxy import EgressCaps
from raas.settings import AgentSettings, HttpSettings, LlmSettings, SandboxSettings, TaskSettings

# A task directory named by its path is read at submission, by a few threads of its own (a slow
# read never holds the threads the rest of the server uses), within this time.
TASK_DIR_READERS = 4
TASK_DIR_TIMEOUT_S = 30.0


class NoTaskRoots(TaskDirError):
    """This server reads no task directories (no ``harbor_roots``)."""

    def __init__(self) -> None:
        super().__init__(
            "this server reads no task directories: send the task's files inline (raas submit"
            " DIR and raas run DIR read a directory into them), or ask its admin to name the"
            " directories of shared datasets with raas serve --harbor-roots DIR"
        )


class ImageResolver(Protocol):
    """What a task's sandbox asks of the image store (``raas.images.store.ImageStore``):
    the image of a name, and a hold on it (``in_use``) that each sandbox keeps while it runs."""

    def resolve(self, ref: str) -> StoredImage: ...

    def in_use(self, image: StoredImage) -> AbstractContextManager[object]: ...


@dataclass
class TaskServices:
    llm: Generator
    # The defaults are the settings' (raas.settings): the server passes its own.
    tokenizer_name: str = field(default_factory=lambda: LlmSettings().tokenizer)
    sandbox_config: SandboxConfig = field(default_factory=BwrapConfig)
    warm_sandboxes: int = field(default_factory=lambda: SandboxSettings().warm_sandboxes)
    # Agent programs of harness tasks: the agents environment (mini-swe-agent, whose
    # dependencies conflict with raas's own), the node one (CLIs from npm), the user's own agent
    # files, and whether gateway calls may change a job's sampling (a 400 naming it).
    agents: AgentSettings = field(default_factory=AgentSettings)
    # The directories a submission may name a Harbor task in by its path (harbor_roots), and
    # what reading them may add to one submission at most: the server's max_body_mb, the bytes
    # its body could have carried the same tasks in.
    tasks: TaskSettings = field(default_factory=TaskSettings)
    prepared_bytes: int = field(default_factory=lambda: int(HttpSettings().max_body_mb * 2**20))
    # Where images named by tasks are found; default: the store at the sandbox config's
    # image_store directory, opened on first use.
    image_store: ImageResolver | None = None
    # Per-turn snapshots of jobs that keep them (sampling_params.keep_snapshots), for branches.
    snapshots: Snapshots = field(default_factory=Snapshots)
    # The destinations a task that asks for the network may reach through raas's proxy (the
    # egress_allow setting; empty: such a task is refused), and that proxy's caps.
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    egress_caps: EgressCaps = field(default_factory=EgressCaps)
    # Where agent jobs' durable turn boundaries are kept (the server's result store); None: no
    # job is checkpointed, and a job in flight at a crash runs again from the start.
    checkpoints: CheckpointBook | None = None
    _pool: SandboxPool | None = None
    # Per-job OpenAI-style sessions for agent programs raas did not write (raas.agent.gateway):
    # gateway.open(job_id, params, trajectory) gives the session and its token.
    gateway: Gateway = field(init=False, repr=False)

    _readers: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    # Each root as its admin spelt it (absolute) and the directory it was then: a link changed
    # later does not move a root.
    _roots: list[tuple[Path, Path]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._roots = [
            (Path(os.path.abspath(root)), Path(os.path.realpath(root)))
            for root in self.tasks.harbor_roots
        ]
        self.gateway = Gateway(
            self.llm,
            self.tokenizer,
            model=self.tokenizer_name,
            fixed_sampling=self.agents.gateway_fixed_sampling,
        )

    def tokenizer(self) -> Any:
        return _tokenizer(self.tokenizer_name)

    async def tokenizer_async(self) -> Any:
        """The tokenizer, loaded off the event loop the first time (it reads files)."""
        loaded = _loaded.get(self.tokenizer_name)
        if loaded is not None:  # every job after the first: no hop to a thread
            return loaded
        return await asyncio.to_thread(self.tokenizer)

    async def sandbox(
        self,
        image: str | None = None,
        caps: Mapping[str, Any] | None = None,
        binds: Mapping[str, str] | None = None,
    ) -> Sandbox:
        """A started sandbox of the configured kind (warm from the pool when one is ready); with
        ``image``, one whose root is that image of the image store (never from the pool).
        ``caps``: limits a task asks for (SandboxLimits' fields), each taken only where lower
        than the server's own: a task file may narrow a sandbox, never widen it. ``binds``
        (host path -> sandbox path), even empty: a sandbox of its own (never from the pool)
        with those bound read-only besides the config's (a harness job's agent program)."""
        if image is not None or binds is not None:
            return await self._own_sandbox(image, caps or {}, binds or {})
        if self._pool is None:
            self._pool = SandboxPool(self.sandbox_config, self.warm_sandboxes)
            self._pool.fill()
        return await self._pool.acquire()

    async def _own_sandbox(
        self, ref: str | None, caps: Mapping[str, Any], binds: Mapping[str, str]
    ) -> Sandbox:
        config = with_binds(narrowed(self.sandbox_config, caps), binds)
        if ref is None:
            sandbox = create_sandbox(config)
            await sandbox.start()  # a start that fails closes it
            return sandbox
        store = self._store()
        stored = await asyncio.to_thread(store.resolve, ref)
        sandbox = create_sandbox(config, stored)
        # No prune removes its layers while it runs; the hold waits out a prune's lock (a thread).
        await asyncio.to_thread(sandbox.hold, store.in_use(stored))
        await sandbox.start()  # a start that fails closes it, and lets the image go
        return sandbox

    @contextlib.asynccontextmanager
    async def build_cgroup(
        self, caps: Mapping[str, Any] | None = None
    ) -> AsyncIterator[list[Path]]:
        """A cgroup for one image build (a Dockerfile's RUN steps are a task's, as hostile as
        its sandbox): the sandbox's caps on memory, processes and CPUs, narrowed by ``caps``
        as a sandbox's are. Its ``cgroup.procs`` files, for ``build_context``; none where raas
        can write no cgroup (as for sandboxes, said once in the log). Removed, with whatever
        still runs in it, on the way out."""
        limits = narrowed(self.sandbox_config, caps or {}).limits
        held = cgroups.Caps(limits.sandbox_memory_bytes, limits.sandbox_tasks, limits.cpus)
        runtime_dir = self.sandbox_config.runtime_dir or runtime_root()
        name = f"build-{secrets.token_hex(8)}"
        group = await asyncio.to_thread(cgroups.create, runtime_dir, name, held)
        try:
            yield group.procs_files() if group is not None else []
        finally:
            if group is not None:
                await asyncio.to_thread(group.remove)

    def _store(self) -> ImageResolver:
        if self.image_store is None:
            self.image_store = ImageStore(self.image_store_dir())
        return self.image_store

    def image_store_dir(self) -> Path:
        """The directory of the node's image store: the sandbox config's ``image_store``."""
        root = getattr(self.sandbox_config, "image_store", None)  # the local one has none
        return Path(root) if root is not None else default_store_dir()

    async def read_task_dir(self, path: str) -> dict[str, Any]:
        """The ``harbor`` instance of the task directory at ``path`` (``read_task_under``),
        which must lie beneath one of ``tasks.harbor_roots``: read by the readers' threads, off
        the event loop, within TASK_DIR_TIMEOUT_S. Raises TaskDirError (NoTaskRoots without
        roots, NotATaskUnderRoots for a path that names no task beneath them)."""
        if not self._roots:
            raise NoTaskRoots()
        if not beneath_roots(path, self._roots):  # as text: no thread, no file looked at
            raise NotATaskUnderRoots([given for given, _ in self._roots])
        if self._readers is None:
            self._readers = ThreadPoolExecutor(TASK_DIR_READERS, thread_name_prefix="task-dirs")
        deadline = time.monotonic() + TASK_DIR_TIMEOUT_S
        loop = asyncio.get_running_loop()
        read = loop.run_in_executor(self._readers, read_task_under, path, self._roots, deadline)
        try:
            # The reader stops itself at the deadline; this bounds the wait for a free thread
            # too (a read stuck in the kernel cannot be stopped, only left).
            return await asyncio.wait_for(read, TASK_DIR_TIMEOUT_S + 1.0)
        except TimeoutError:
            raise TaskDirError(
                f"{path}: not read within {TASK_DIR_TIMEOUT_S:g} s (the server's readers are"
                " busy, or its file system is slow): try again"
            ) from None

    def release(self, session: str) -> None:
        release = getattr(self.llm, "release", None)
        if release is not None:
            release(session)

    async def close(self) -> None:
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)
        await self.snapshots.close()
        if self._pool is not None:
            await self._pool.close()


_tokenizer_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # the tokenizers loaded so far, by name (a handful at most)


def _tokenizer(name: str) -> Any:
    loaded = _loaded.get(name)
    if loaded is None:
        # One loader at a time: transformers' lazy imports are not safe to race from threads.
        with _tokenizer_lock:
            loaded = _loaded.get(name)
            if loaded is None:
                from raas.llm.models import load_tokenizer

                loaded = _loaded[name] = load_tokenizer(name)
                # The tokenizer and transformers live as long as the process: out of the
                # collector's sight, so that its full collections (each a walk of every
                # object: about a tenth of a second once they are loaded) do not stall turns
                # over objects that are never garbage. Once a name, so a few times a process.
                gc.freeze()
    return loaded


def with_binds(config: SandboxConfig, binds: Mapping[str, str]) -> SandboxConfig:
    """``config`` with ``binds`` (host path -> sandbox path) bound read-only besides its own; a
    provider that binds nothing in (local) takes none."""
    if not binds:
        return config
    if not isinstance(config, BwrapConfig | ApptainerConfig):
        raise SandboxError(f"the {config.type} sandbox binds nothing in: {sorted(binds)[0]}")
    return config.model_copy(update={"ro_binds": {**config.ro_binds, **binds}})


def egress_of(settings: SandboxSettings) -> tuple[EgressPolicy, EgressCaps]:
    """The ``egress_allow`` and ``egress_max_mb`` settings as the proxy takes them."""
    max_bytes = int(settings.egress_max_mb * 1024 * 1024)
    return EgressPolicy.parse(settings.egress_allow), EgressCaps(max_bytes=max_bytes)


def narrowed(config: SandboxConfig, caps: Mapping[str, Any]) -> SandboxConfig:
    """``config`` with each of ``caps`` (SandboxLimits' fields) where it is lower than the
    config's own (a cap of None, unlimited, is lowered by any number)."""
    if not caps:
        return config
    limits = config.limits
    update: dict[str, Any] = {}
    for name, value in caps.items():
        own = getattr(limits, name)
        if value is not None and (own is None or value < own):
            update[name] = value
    return config.model_copy(update={"limits": limits.model_copy(update=update)})
