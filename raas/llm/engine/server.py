"""Running the engine under uvicorn: SIGTERM/SIGINT stop the generations in flight, so the
process exits within a decode step or two instead of after the longest generation."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from raas.llm.engine.generator import Engine

log = logging.getLogger(__name__)

# Left for anything else in flight (a weight update being read) before uvicorn cancels it.
GRACEFUL_SHUTDOWN_S = 5


class EngineServer(uvicorn.Server):
    """A uvicorn server that, as it starts shutting down, stops its engine: requests in flight or
    waiting get a 503 at once, so their connections close and uvicorn need not wait for them.

    A signal ends the process with status 0 (uvicorn would re-raise it); a second SIGINT or
    SIGTERM exits at once.
    """

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in (signal.SIGINT, signal.SIGTERM):
            self.force_exit = True
        else:
            log.info("signal %d: stopping the engine", sig)
            self.should_exit = True

    async def shutdown(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self.engine.stop()  # does not block: the worker stops after its current step
        await super().shutdown(sockets)  # type: ignore[arg-type]


def serve_engine(app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
    """Serve an app from :func:`~raas.llm.engine.create_engine_app` until a signal."""
    engine: Engine = app.state.engine
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    EngineServer(config, engine).run()
