"""A server for a benchmark in a forked process of its own, as deployed (shared by benchmarks).

The target runs ``target(port, *args)`` and serves HTTP on that port; the parent waits for
``health`` to answer 200 and can read the process's CPU time from /proc.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import uvicorn

from raas.api.app import create_app
from raas.helpers.ports import free_port
from raas.helpers.readiness import wait_until_answers
from raas.settings import ServeSettings
from raas.tasks import TaskHandler, TaskRegistry


class ForkedServer:
    def __init__(
        self,
        target: Callable[..., None],
        *args: Any,
        health: str = "/healthz",
        port: int | None = None,  # a restart takes its predecessor's
    ) -> None:
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.health = health
        ctx = multiprocessing.get_context("fork")
        self.proc = ctx.Process(target=target, args=(self.port, *args), daemon=True)

    def __enter__(self) -> ForkedServer:
        self.proc.start()
        wait_until_answers(self.url + self.health, 120.0, self._gone)
        return self

    def _gone(self) -> str | None:
        if self.proc.is_alive():
            return None
        return f"the benchmark's server {self.proc.name} exited with {self.proc.exitcode}"

    def cpu_s(self) -> float:
        """CPU time (user + system) the process has used so far, its children not included."""
        assert self.proc.pid is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.join(30)


def serve_raas(
    port: int, settings: ServeSettings, tasks: Iterable[TaskHandler], log_level: str = "warning"
) -> None:
    """raas on ``port`` with ``tasks``: a benchmark's server as ``raas serve`` runs it, raas's
    log and uvicorn's at ``log_level`` (a line per job would cost what is measured), no access
    log."""
    logging.getLogger("raas").setLevel(log_level.upper())
    registry = TaskRegistry()
    for task in tasks:
        registry.register(task)
    app = create_app(settings.model_copy(update={"port": port}), registry)
    uvicorn.run(app, port=port, log_level=log_level, access_log=False)


def serve_fake_vllm(
    port: int,
    reply: Callable[[list[int]], list[int]],
    latency_s: float,
    answered: Callable[[list[int]], None] | None = None,
    jitter: float = 0.0,
) -> None:
    """A fake model behind vLLM's ``/v1/completions`` (token ids in, ids and logprobs out), for
    the benchmarks: ``reply(prompt_ids)`` gives the answer's ids, sent after ``latency_s`` (times
    a uniform draw from 1 - ``jitter`` to 1 + ``jitter``); ``answered(prompt_ids)``, where
    given, is called as it is sent."""
    import asyncio
    import random

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ClientDisconnect:  # raas was killed mid-request (raas bench soak does that)
            return Response(status_code=499)
        ids = reply(body["prompt"])
        await asyncio.sleep(latency_s * random.uniform(1 - jitter, 1 + jitter))
        if answered is not None:
            answered(body["prompt"])
        choice = {
            "index": 0,
            "text": "",
            "token_ids": ids,
            "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.1] * len(ids)},
        }
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}
        return JSONResponse(
            {"id": "c", "object": "text_completion", "choices": [choice], "usage": usage}
        )

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", ok),
        Route("/v1/models", ok),
    ]
    uvicorn.run(Starlette(routes=routes), port=port, log_level="warning", access_log=False)
