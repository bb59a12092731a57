"""Starting raas's own servers as child processes (for the CLI, benchmarks and tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def terminate(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM (a raas server then drains), SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class ChildServer:
    """``python -m raas ARGS --port P`` in a child process, logging to a file, stopped with
    SIGTERM (a graceful drain for ``raas serve``)."""

    health_path = "/healthz"

    def __init__(
        self,
        args: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raas", *args, "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"{self.proc.args!r} exited with {self.proc.returncode}:\n{tail}"
                )
            try:
                if httpx.get(self.url + self.health_path, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.url} did not answer within {timeout_s:g} s (log: {self.log_path})"
        )

    def stop(self, timeout_s: float = 60.0) -> int:
        code = terminate(self.proc, timeout_s)
        self._log.close()
        return code


class ServerProcess(ChildServer):
    """``raas serve`` on a database file."""

    def __init__(
        self,
        db: Path,
        log: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        super().__init__(["serve", "--db", str(db), *(extra_args or [])], log, env, port)


class EngineProcess(ChildServer):
    """``raas engine`` with a model (the first SmolLM2 start converts it: allow minutes)."""

    health_path = "/health"

    def __init__(
        self,
        model: str,
        log: Path,
        threads: int | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        env = dict(os.environ)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        super().__init__(["engine", "--model", model, *(extra_args or [])], log, env)
