"""Bounds on the HTTP server's connections, which uvicorn leaves open-ended.

uvicorn keeps a connection for as long as its client wants while it sends a request's head (its
keep-alive timer stops at the first byte, and a new connection has none), and it accepts
connections until the process runs out of file descriptors: a client that opens a thousand
connections and drips a byte on each makes the server unreachable, with no key. Here:

- a connection gets ``head_timeout_s`` to send a request's head, counted from its opening or
  from the end of its last response, whatever it drips meanwhile; then it is closed;
- at most ``max_connections`` are open: beyond it, a new connection closes the one that has
  waited longest for a head (idle between requests, or sending one slowly), and is answered 503
  only when every open connection has a request in flight (those are never cut).

``raise_file_limit`` raises the soft limit on open files to the hard one, and ``connection_cap``
keeps the cap at half of it, the other half for the database, sandboxes and backends.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# The default cap's ceiling: past it, memory for idle connections matters more than descriptors.
MAX_DEFAULT_CONNECTIONS = 16384
_BUSY = b"the server has as many connections as it keeps, each with a request in flight\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n"
    b"content-length: " + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY
)
# How often, at most, a warning says that connections are being cut or refused.
WARN_EVERY_S = 60.0


class TooManyConnections(ValueError):
    """A ``max_connections`` the open-file limit cannot hold beside everything else."""


def raise_file_limit() -> int:
    """Raise the soft limit on open files to the hard one (a process may); the soft limit in
    force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # an unlimited hard limit is more than the kernel's
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, e)
    return soft


def connection_cap(max_connections: int | None, file_limit: int) -> int:
    """The cap on open connections: ``max_connections``, or half ``file_limit`` (at most
    MAX_DEFAULT_CONNECTIONS); never more than half ``file_limit``."""
    half = max(1, file_limit // 2) if file_limit != resource.RLIM_INFINITY else 1 << 30
    if max_connections is None:
        return min(half, MAX_DEFAULT_CONNECTIONS)
    if max_connections > half:
        raise TooManyConnections(
            f"--max-connections {max_connections} is over half the open-file limit"
            f" ({file_limit}; the rest is for the database, sandboxes and backends): give at"
            f" most {half}, or raise the hard limit (ulimit -Hn, limits.conf, LimitNOFILE=)"
        )
    return max_connections


class ConnectionBounds:
    """The open connections of one server, and the order they began waiting for a head in."""

    def __init__(self, max_connections: int, head_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.open: set[BoundedProtocol] = set()
        # Those that began waiting for a head, longest first (entries go stale when a head
        # arrives: they are skipped when met).
        self.waiting: dict[BoundedProtocol, None] = {}
        self.cut = 0
        self.refused = 0
        self._warned_at = -WARN_EVERY_S

    def admit(self, conn: BoundedProtocol) -> bool:
        """Take ``conn`` in, closing the connection that has waited longest for a head if the
        cap is reached; False if every open one has a request in flight."""
        if len(self.open) >= self.max_connections:
            victim = self._longest_waiting()
            if victim is None:
                self.refused += 1
                self._warn()
                return False
            self.cut += 1
            self._warn()
            self.forget(victim)
            victim.transport.close()
        self.open.add(conn)
        return True

    def waits_for_head(self, conn: BoundedProtocol) -> None:
        self.waiting.pop(conn, None)
        self.waiting[conn] = None

    def forget(self, conn: BoundedProtocol) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)

    def _longest_waiting(self) -> BoundedProtocol | None:
        while self.waiting:
            conn = next(iter(self.waiting))
            del self.waiting[conn]
            if conn in self.open and not conn.transport.is_closing() and not conn.in_flight():
                return conn
        return None

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "%d connections open, the most kept (--max-connections): %d cut while waiting"
                " for a request's head, %d refused with a 503 so far",
                len(self.open),
                self.cut,
                self.refused,
            )


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a server's ConnectionBounds (``bounded_protocol``
    makes the class of one server)."""

    bounds: ConnectionBounds
    _head_timer: asyncio.TimerHandle | None = None

    def in_flight(self) -> bool:
        """Has a request's head arrived whose response is not finished?"""
        return self.cycle is not None and not self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.bounds.admit(self):
            transport.write(BUSY_RESPONSE)
            transport.close()
            return
        self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.bounds.forget(self)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.in_flight():  # not a pipelined next
            self._wait_for_head()

    def _wait_for_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.bounds.head_timeout_s, self._head_timed_out)
        self.bounds.waits_for_head(self)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.in_flight() or self.transport.get_protocol() is not self:  # upgraded: not ours
            return
        log.debug("%s: no request head in %.1f s: closed", self.client, self.bounds.head_timeout_s)
        self.bounds.forget(self)
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(bounds: ConnectionBounds) -> type[BoundedProtocol]:
    """The protocol class (uvicorn's ``http=``) of a server under ``bounds``."""

    class ServerProtocol(BoundedProtocol):
        pass

    ServerProtocol.bounds = bounds
    return ServerProtocol
