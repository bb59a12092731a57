"""The local provider: the action server as a plain subprocess. No isolation; development only."""

from __future__ import annotations

import asyncio
import logging
import signal

from raas.sandbox import procs
from raas.sandbox.base import (
    EXIT_WAIT_S,
    INSIDE_DIR,
    SERVER_PYTHON_FLAGS,
    Sandbox,
    launch_env,
    reap,
    warn_unisolated,
)
from raas.sandbox.config import LocalConfig

log = logging.getLogger(__name__)


class LocalSandbox(Sandbox):
    config: LocalConfig

    def __init__(self, config: LocalConfig) -> None:
        super().__init__(config)
        # Paths inside are host paths here: keep the workspace in the sandbox's own directory.
        self.config = config.model_copy(update={"workdir": str(self.dir / "workspace")})

    async def _launch(self, listen_fd: int) -> asyncio.subprocess.Process:
        warn_unisolated()
        (self.dir / "workspace").mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        args = self.server_args(listen_fd, str(self.dir / "tmp"))
        return await asyncio.create_subprocess_exec(
            self.config.python,
            *SERVER_PYTHON_FLAGS,
            str(INSIDE_DIR / "server.py"),
            *args,
            env=launch_env("PATH"),  # no isolation, but not raas's secrets in its environment
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=[listen_fd],
            start_new_session=True,
        )

    def host_pids(self) -> set[int]:
        if self.process is None or self.closed or self.process.returncode is not None:
            return set()
        return {self.process.pid} | procs.descendants(self.process.pid)

    async def _terminate(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        members = {process.pid} | procs.descendants(process.pid)
        procs.kill(members - {process.pid})
        process.send_signal(signal.SIGKILL)
        if not await reap(process, EXIT_WAIT_S):
            log.error("sandbox %s: process %d outlived SIGKILL", self.id, process.pid)
        await asyncio.to_thread(procs.wait_gone, members, 10.0)
