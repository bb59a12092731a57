"""``raas demo``: start a real server, run the main job over HTTP, print what came back.

Until the model-backed tasks land, the main job is the built-in ``countdown`` task, played by its
scripted policy with some exploration so that rewards differ between rollouts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from raas.api.schemas import RolloutRequest, RolloutResult
from raas.client import AsyncRolloutClient
from raas.client.files import run_requests
from raas.tasks.countdown import generate_instances


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """``raas serve`` as a child process, stopped with SIGTERM (a graceful drain)."""

    def __init__(
        self,
        db: Path,
        log: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "raas", "serve", "--port", str(self.port), "--db", str(db)]
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*args, *(extra_args or [])], stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"raas serve exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"raas serve did not answer on {self.url} within {timeout_s:g} s")

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def demo_requests(n: int, seed: int) -> list[RolloutRequest]:
    return [
        RolloutRequest(
            instance=instance,
            sampling_params={"temperature": 0.35, "seed": seed + i, "max_turns": 6},
            timeout_s=60,
        )
        for i, instance in enumerate(generate_instances(n, seed=seed))
    ]


def result_table(requests: list[RolloutRequest], results: list[RolloutResult]) -> Table:
    table = Table(title="countdown rollouts through raas")
    for col in ("instance", "numbers -> target", "state", "reward", "moves", "stop", "total s"):
        table.add_column(col, justify="right" if col in {"reward", "total s"} else "left")
    for req, res in zip(requests, results, strict=True):
        moves = ", ".join(t["action"] for t in res.trajectory.turns)
        table.add_row(
            str(res.instance_id),
            f"{req.instance['numbers']} -> {req.instance['target']}",
            res.state,
            "-" if res.reward is None else f"{res.reward:.1f}",
            moves,
            str(res.trajectory.stop_reason),
            f"{res.timing.total_s:.3f}",
        )
    return table


def run_demo(n: int = 16, seed: int = 0, workdir: Path = Path("out/demo")) -> int:
    console = Console(width=max(Console().width, 110))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "demo.db"
    for stale in workdir.glob("demo.db*"):
        stale.unlink()
    server = ServerProcess(db, workdir / "server.log")
    console.print(f"starting raas serve on {server.url} (log: {workdir / 'server.log'})")
    try:
        server.wait_ready()
        requests = demo_requests(n, seed)
        with Progress(console=console) as progress:
            bar = progress.add_task("rollouts", total=len(requests))

            async def go() -> list[RolloutResult]:
                async with AsyncRolloutClient(server.url) as client:
                    return await run_requests(
                        client, requests, on_result=lambda _: progress.advance(bar)
                    )

            results = asyncio.run(go())
    finally:
        code = server.stop()
    console.print(result_table(requests, results))
    rewards = [r.reward for r in results if r.reward is not None]
    done = sum(r.state == "done" for r in results)
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    console.print(
        f"{done}/{len(results)} done, mean reward {mean:.2f}; results persisted in {db};"
        f" server drained and exited with code {code}"
    )
    return 0 if done == len(results) and code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(run_demo(int(os.environ.get("RAAS_DEMO_N", "16"))))
