"""The ``ipython`` action: a persistent IPython kernel through jupyter_client.

Needs ipykernel and jupyter_client in the image's Python; imported only when first used, so the
rest of the action server works in any image. The kernel talks over IPC sockets in the scratch
directory (no TCP ports). Blocking jupyter_client calls run on a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
START_TIMEOUT_S = 60.0


class KernelUnavailable(Exception):
    pass


class IPythonSession:
    def __init__(self, cwd: str, scratch_dir: str) -> None:
        self.cwd = cwd
        self.scratch_dir = scratch_dir
        self.manager: Any = None
        self.client: Any = None
        self.lock = asyncio.Lock()

    def _start(self) -> None:
        if sys.flags.no_site:  # the server starts without site (-S): jupyter is in site-packages
            import site

            site.main()
        if "ssl" in sys.modules and sys.modules["ssl"] is None:  # kept out by server.py
            del sys.modules["ssl"]
        try:
            from jupyter_client.manager import (  # type: ignore[import-not-found, unused-ignore]
                KernelManager,
            )
        except ImportError as e:
            raise KernelUnavailable(
                f"this sandbox's python3 has no jupyter_client/ipykernel ({e}); use bash, or an"
                " image that has them"
            ) from e
        manager = KernelManager(
            kernel_name="python3",
            transport="ipc",
            ip=os.path.join(self.scratch_dir, "kernel"),
        )
        env = dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1")
        manager.start_kernel(
            cwd=self.cwd, env=env, extra_arguments=["--HistoryManager.enabled=False"]
        )
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=START_TIMEOUT_S)
        self.manager, self.client = manager, client

    def _execute(self, code: str, timeout_s: float) -> dict[str, Any]:
        if self.client is None:
            self._start()
        client = self.client
        # stop_on_error=False: after a cell that raised, ipykernel would otherwise silently abort
        # requests that reach it within a short window, and a slow machine sends the next one then.
        msg_id = client.execute(code, allow_stdin=False, store_history=True, stop_on_error=False)
        deadline = time.monotonic() + timeout_s
        stdout: list[str] = []
        result: str | None = None
        error: dict[str, Any] | None = None
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and not timed_out:
                timed_out = True
                self.manager.interrupt_kernel()
                deadline = time.monotonic() + 5.0
                continue
            if left <= 0:  # the interrupt did not bring it back: start afresh
                self._shutdown()
                return {
                    "stdout": "".join(stdout),
                    "result": None,
                    "error": {"ename": "Timeout", "evalue": "kernel restarted", "traceback": ""},
                    "timed_out": True,
                    "kernel_restarted": True,
                }
            try:
                msg = client.get_iopub_msg(timeout=min(left, 1.0))
            except Exception:  # queue.Empty
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                stdout.append(content.get("text", ""))
            elif kind in ("execute_result", "display_data"):
                text = content.get("data", {}).get("text/plain")
                if text is not None:
                    result = text
            elif kind == "error":
                error = {
                    "ename": content.get("ename", ""),
                    "evalue": content.get("evalue", ""),
                    "traceback": ANSI.sub("", "\n".join(content.get("traceback", []))),
                }
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        return {
            "stdout": "".join(stdout),
            "result": result,
            "error": error,
            "timed_out": timed_out,
            "kernel_restarted": False,
        }

    async def run(self, code: str, timeout_s: float) -> dict[str, Any]:
        async with self.lock:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._execute, code, timeout_s)

    def _shutdown(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
        if self.manager is not None:
            self.manager.shutdown_kernel(now=True)
        self.manager = self.client = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._shutdown()
