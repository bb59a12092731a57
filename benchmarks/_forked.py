"""A server for a benchmark in a forked process of its own, as deployed (shared by benchmarks).

The target runs ``target(port, *args)`` and serves HTTP on that port; the parent waits for
``health`` to answer 200 and can read the process's CPU time from /proc.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from raas.launch import free_port


class ForkedServer:
    def __init__(self, target: Callable[..., None], *args: Any, health: str = "/healthz") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.health = health
        ctx = multiprocessing.get_context("fork")
        self.proc = ctx.Process(target=target, args=(self.port, *args), daemon=True)

    def __enter__(self) -> ForkedServer:
        self.proc.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + self.health).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"the benchmark's server {self.proc.name} did not start")

    def cpu_s(self) -> float:
        """CPU time (user + system) the process has used so far, its children not included."""
        assert self.proc.pid is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.join(30)
