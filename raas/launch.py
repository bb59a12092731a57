"""Starting raas's own servers as child processes (for the CLI, benchmarks and tests)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from raas.helpers.children import guarded, terminate
from raas.helpers.ports import free_port
from raas.helpers.readiness import exited, wait_until_answers

# `raas engine`'s port unless told (a deployment's nodes start theirs there too).
ENGINE_PORT = 8001


class ChildServer:
    """``python -m raas ARGS --port P`` in a child process, logging to a file, stopped with
    SIGTERM (a graceful drain for ``raas serve``).

    A ``tied`` child dies with its parent: it runs in a session of its own, so a Ctrl-C at the
    terminal reaches only the parent, which stops it (:meth:`stop`) after what it must do first
    (cancel its jobs on the child's server, say); and it gets SIGTERM from the kernel if the
    parent dies without stopping it (``guarded``: even by SIGKILL). Tie only a child started
    from a thread that lives as long as it should: the kernel's signal follows the thread that
    forked (a worker thread of ``asyncio.to_thread`` ends with its loop).
    """

    health_path = "/healthz"

    def __init__(
        self,
        args: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
        tied: bool = False,
    ) -> None:
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.name = f"raas {args[0]}" if args else "raas"
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, "-m", "raas", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(
            guarded(argv) if tied else argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=tied,
        )

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until it answers; raises NotReady (with its log's tail) if it exits or the time
        runs out. A process that exits is said at once, so the deadline is for one that hangs:
        minutes, since an engine's start on two loaded cores took over 60 s."""
        wait_until_answers(
            self.url + self.health_path, timeout_s, exited(self.proc, self.log_path, self.name)
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
        tied: bool = False,
    ) -> None:
        args = ["serve", "--db", str(db), *(extra_args or [])]
        super().__init__(args, log, env, port, tied)


class EngineProcess(ChildServer):
    """``raas engine`` with a model (the first SmolLM2 start converts it: allow minutes).

    It gets a key of its own (``api_key``, for ``/update_weights``: :meth:`admin_headers`)
    through its environment, never its argv, which every user of the machine can read; and
    ``weight_dirs``, where it may load weights from (default: its model cache).
    """

    health_path = "/health"

    def __init__(
        self,
        model: str,
        log: Path,
        threads: int | None = None,
        extra_args: list[str] | None = None,
        weight_dirs: Sequence[Path] = (),
        tied: bool = False,
    ) -> None:
        self.api_key = secrets.token_urlsafe(32)
        env = dict(os.environ)
        env.pop("RAAS_API_KEY_FILE", None)  # a key meant for another server
        env["RAAS_API_KEY"] = self.api_key
        if weight_dirs:
            env["RAAS_WEIGHTS_DIRS"] = os.pathsep.join(str(d) for d in weight_dirs)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        super().__init__(["engine", "--model", model, *(extra_args or [])], log, env, tied=tied)

    def admin_headers(self) -> dict[str, str]:
        """The header that opens the engine's admin routes."""
        return {"Authorization": f"Bearer {self.api_key}"}
