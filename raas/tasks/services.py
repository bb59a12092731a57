"""What the service gives every task: the LLM backends, the tokenizer, sandboxes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raas.agent.gateway import Gateway
from raas.agent.loop import Generator
from raas.agent.snapshots import Snapshots
from raas.images.image import StoredImage
from raas.images.store import ImageStore, default_store_dir
from raas.sandbox import BwrapConfig, Sandbox, SandboxConfig, SandboxPool, create_sandbox
from raas.sandbox.egress import EgressPolicy
from raas.sandbox.proxy import EgressCaps
from raas.settings import AgentSettings, LlmSettings, SandboxSettings


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
    # Where images named by tasks are found; default: the store at the sandbox config's
    # image_store directory, opened on first use.
    image_store: ImageResolver | None = None
    # Per-turn snapshots of jobs that keep them (sampling_params.keep_snapshots), for branches.
    snapshots: Snapshots = field(default_factory=Snapshots)
    # The destinations a task that asks for the network may reach through raas's proxy (the
    # egress_allow setting; empty: such a task is refused), and that proxy's caps.
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    egress_caps: EgressCaps = field(default_factory=EgressCaps)
    _pool: SandboxPool | None = None
    # Per-job OpenAI-style sessions for agent programs raas did not write (raas.agent.gateway):
    # gateway.open(job_id, params, trajectory) gives the session and its token.
    gateway: Gateway = field(init=False, repr=False)

    def __post_init__(self) -> None:
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
        self, image: str | None = None, caps: Mapping[str, Any] | None = None
    ) -> Sandbox:
        """A started sandbox of the configured kind (warm from the pool when one is ready); with
        ``image``, one whose root is that image of the image store (never from the pool).
        ``caps``: limits a task asks for (SandboxLimits' fields), each taken only where lower
        than the server's own: a task file may narrow a sandbox, never widen it."""
        if image is not None:
            return await self._image_sandbox(image, caps or {})
        if self._pool is None:
            self._pool = SandboxPool(self.sandbox_config, self.warm_sandboxes)
            self._pool.fill()
        return await self._pool.acquire()

    async def _image_sandbox(self, ref: str, caps: Mapping[str, Any]) -> Sandbox:
        store = self._store()
        stored = await asyncio.to_thread(store.resolve, ref)
        sandbox = create_sandbox(narrowed(self.sandbox_config, caps), stored)
        # No prune removes its layers while it runs; the hold waits out a prune's lock (a thread).
        await asyncio.to_thread(sandbox.hold, store.in_use(stored))
        await sandbox.start()  # a start that fails closes it, and lets the image go
        return sandbox

    def _store(self) -> ImageResolver:
        if self.image_store is None:
            self.image_store = ImageStore(self.image_store_dir())
        return self.image_store

    def image_store_dir(self) -> Path:
        """The directory of the node's image store: the sandbox config's ``image_store``."""
        root = getattr(self.sandbox_config, "image_store", None)  # the local one has none
        return Path(root) if root is not None else default_store_dir()

    def release(self, session: str) -> None:
        release = getattr(self.llm, "release", None)
        if release is not None:
            release(session)

    async def close(self) -> None:
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
    return loaded


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
