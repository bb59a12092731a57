"""Warm pools: sandboxes started ahead of need, so that INIT does not wait for a start."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from raas.sandbox.base import Sandbox
from raas.sandbox.config import SandboxConfig
from raas.sandbox.providers import create_sandbox

log = logging.getLogger(__name__)


class SandboxPool:
    """``size`` started sandboxes of one config, handed out by ``acquire`` and refilled behind.

    A sandbox is used by one job and closed after it (never handed out twice: an agent may have
    changed anything in it).
    """

    def __init__(self, config: SandboxConfig, size: int) -> None:
        if size < 0:
            raise ValueError("a pool size is at least 0")
        self.config = config
        self.size = size
        self._ready: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._starting: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def ready(self) -> int:
        return self._ready.qsize()

    def fill(self) -> None:
        """Start sandboxes in the background until ``size`` are ready or starting."""
        while not self._closed and self._ready.qsize() + len(self._starting) < self.size:
            task = asyncio.create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        sandbox = create_sandbox(self.config)
        try:
            await sandbox.start()
        except Exception:
            log.exception("warm pool: a sandbox failed to start")
            return
        if self._closed:
            await sandbox.close()
        else:
            self._ready.put_nowait(sandbox)

    async def wait_filled(self) -> None:
        """Until every sandbox being started has started (for start-up and tests)."""
        while self._starting:
            await asyncio.gather(*list(self._starting), return_exceptions=True)

    async def acquire(self) -> Sandbox:
        """A started sandbox: a warm one if there is one, else one started now."""
        try:
            sandbox = self._ready.get_nowait()
        except asyncio.QueueEmpty:
            sandbox = create_sandbox(self.config)
            await sandbox.start()
        self.fill()
        return sandbox

    async def close(self) -> None:
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*list(self._starting), return_exceptions=True)
        while not self._ready.empty():
            await self._ready.get_nowait().close()
