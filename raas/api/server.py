"""Running the service under uvicorn, with a graceful drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from raas.api.app import create_app
from raas.api.connections import (
    ConnectionBounds,
    bounded_protocol,
    connection_cap,
    raise_file_limit,
)
from raas.api.log_redaction import redact_logs
from raas.api.state import ServiceState
from raas.helpers.ports import check_port, is_loopback
from raas.settings import ServeSettings
from raas.store.schema import check_version
from raas.store.sqlite import hold_database
from raas.tasks import TaskRegistry

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM/SIGINT, drain before exiting; a second signal exits at once.

    While draining, HTTP stays up: new submissions get 503, but trainers can still read results
    and blocked ``/process`` calls get theirs. Once every job has a persisted result (or the grace
    period has run out and the rest were cancelled), uvicorn shuts down.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None or self._loop is None or not self.started:
            self.should_exit = True
            self.force_exit = self._drain is not None
            return
        log.info("signal %d: draining (grace period %.1f s)", sig, self.grace_s)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        svc: ServiceState = self.app.state.service
        try:
            await svc.pipeline.drain(self.grace_s)
        finally:
            self.should_exit = True


class KeyNeeded(ValueError):
    """A server without an API key asked to listen beyond the loopback interface."""


def check_exposure(settings: ServeSettings) -> None:
    """Refuse to serve without a key anywhere but on loopback: whoever reaches the address
    could run jobs, read every result and stop the server. A key made up here instead would
    reach no trainer (and be one more secret in a log), so the operator is told what to do."""
    host = settings.server.host
    if settings.auth.api_key is None and not is_loopback(host):
        raise KeyNeeded(
            f"--host {host} without an API key would let anyone who reaches it run and"
            " cancel jobs: give a key (RAAS_API_KEY or --api-key-file FILE; clients send the"
            " same), or bind 127.0.0.1 and reach it over ssh -L"
        )


def check_free(db: Path) -> None:
    """DatabaseInUse, said before the app starts, if another server holds ``db`` (the store
    takes the same hold for its life when it opens)."""
    if db.parent.is_dir():
        os.close(hold_database(db))


def serve(settings: ServeSettings, registry: TaskRegistry | None = None) -> None:
    check_exposure(settings)
    check_port(
        settings.server.host, settings.server.port
    )  # a busy port is said before the app starts
    check_version(settings.server.db)  # and a database from a newer raas
    check_free(settings.server.db)  # or one another server holds
    # The cap on connections keeps half the file limit (raised first) for the rest: a cap
    # too high for it (TooManyConnections) is said before the app starts.
    bounds = ConnectionBounds(
        connection_cap(settings.http.max_connections, raise_file_limit()),
        settings.http.head_timeout_s,
    )
    app = create_app(settings, registry)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        http=bounded_protocol(bounds),
        log_level=settings.server.log_level,
        timeout_graceful_shutdown=5,
    )
    redact_logs(settings.auth.api_key)  # uvicorn's handlers are set up by Config
    DrainingServer(config, app, settings.pipeline.drain_grace_s).run()
