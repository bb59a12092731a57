"""raas's HTTPS proxy for one sandbox: CONNECT tunnels to what an ``EgressPolicy`` allows.

The sandbox keeps no network. A connection made inside to the proxy's port (inside/tunnel.py)
reaches the host as a byte stream of its own (``ActionClient.open_tunnel``), and everything that
decides is here, on the host: the request head is read (within ``head_s``, at most
``max_head_bytes`` in ``max_header_lines``), only ``CONNECT HOST:PORT`` is served (a plain-HTTP
request, ``GET http://...``, is answered 405: one connection is one checked destination), the
target is parsed strictly (``raas.helpers.destinations``) and checked (``checked_address``), and
the proxy connects to the checked address and answers 200. From then on the bytes pass as they
are, both ways, through buffers of ``BUFFER`` bytes: a side that does not read stops the other
side's reading (nothing piles up here), and a tunnel ends when the destination closes, after
``idle_s`` without a byte either way, after ``total_s``, or when the sandbox's bytes reach
``max_bytes``. At most ``max_tunnels`` are open at once. A refusal is an HTTP answer naming the
reason; it is logged and counted (``EgressMeter``), and so is what passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from raas.helpers.destinations import Destination, IPAddress, parse_authority
from raas.sandbox.egress import (
    EgressPolicy,
    Refused,
    Resolver,
    checked_addresses,
    system_resolver,
)

# Bytes read at once from either side, and each side's reader's limit (asyncio stops reading a
# socket once twice this is buffered; a writer waits once 64 KiB are unsent).
BUFFER = 64 * 1024
CLOSE_S = 5.0
# After a refusal: how much of what the client still sends is read and dropped, for how long.
LINGER_BYTES = 1024 * 1024
LINGER_S = 2.0
# What passes to every program of the sandbox, in both spellings (curl reads the lower case,
# Python's urllib either); NO_PROXY keeps the sandbox's own loopback (the gateway's relay) direct.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EgressCaps:
    """What one sandbox's proxy allows besides its destinations."""

    max_tunnels: int = 16  # open at once
    max_bytes: int = 1024 * 1024 * 1024  # both ways, all tunnels of the sandbox together
    head_s: float = 10.0  # for a request's head to arrive (a slow sender is cut off)
    connect_s: float = 10.0  # to resolve the name, and again to connect
    idle_s: float = 120.0  # without a byte either way
    total_s: float = 3600.0  # a tunnel's whole life
    max_head_bytes: int = 8 * 1024
    max_header_lines: int = 64


@dataclass
class EgressMeter:
    """What a sandbox's proxy did: tunnels opened (answered 200), open now, bytes each way
    (``out``: from the sandbox), refusals."""

    tunnels: int = 0
    open: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    refused: int = 0

    def metrics(self) -> dict[str, int]:
        return {
            "tunnels": self.tunnels,
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "refused": self.refused,
        }


def proxy_env(port: int) -> dict[str, str]:
    """The variables that send a sandbox's HTTP clients through the proxy at ``port``."""
    url = f"http://127.0.0.1:{port}"
    return {**dict.fromkeys(PROXY_VARIABLES, url), "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


# Refusals of one sandbox's proxy that are logged, each (the rest are counted).
LOGGED_REFUSALS = 10


@dataclass
class Egress:
    """One sandbox's proxy: its policy, caps and meter. ``carry(open_stream, refuse)`` serves one
    connection made inside: ``open_stream()`` gives its byte stream, ``refuse()`` turns it away
    unopened (over the caps)."""

    policy: EgressPolicy
    caps: EgressCaps = field(default_factory=EgressCaps)
    resolve: Resolver = system_resolver
    label: str = "a sandbox"
    meter: EgressMeter = field(default_factory=EgressMeter)

    def refusal(self, reason: str) -> None:
        # Logged for the first few only: a refused connection costs the agent nothing, and a
        # warning for each would let it fill the host's log (the meter counts them all).
        self.meter.refused += 1
        if self.meter.refused <= LOGGED_REFUSALS:
            log.warning("egress of %s refused: %s", self.label, reason)
        elif self.meter.refused == LOGGED_REFUSALS + 1:
            log.warning("egress of %s: more refusals, counted in its metrics only", self.label)

    async def carry(
        self, open_stream: Callable[[], Awaitable[Streams]], refuse: Callable[[], Awaitable[None]]
    ) -> None:
        over = self._over_caps()
        if over is not None:
            self.refusal(over)
            await refuse()
            return
        self.meter.open += 1
        try:
            reader, writer = await asyncio.wait_for(open_stream(), self.caps.connect_s)
            try:
                await self.serve(reader, writer)
            finally:
                await close(writer)
        finally:
            self.meter.open -= 1

    def _over_caps(self) -> str | None:
        if self.meter.open >= self.caps.max_tunnels:
            return f"{self.caps.max_tunnels} tunnels are open already"
        if self._spent() >= self.caps.max_bytes:
            return f"the sandbox's {self.caps.max_bytes} bytes of egress are spent"
        return None

    def _spent(self) -> int:
        return self.meter.bytes_out + self.meter.bytes_in

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One proxy connection: its CONNECT read and decided, then its tunnel."""
        try:
            far = await self._decide(reader)
        except Refused as e:
            return await self._refuse(reader, writer, e)
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        far_reader, far_writer = far
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.meter.tunnels += 1
            await self.splice(reader, writer, far_reader, far_writer)
        finally:
            await close(far_writer)

    async def _decide(self, reader: asyncio.StreamReader) -> Streams:
        """The request read, its target checked and connected to; Refused otherwise."""
        try:
            target = await asyncio.wait_for(read_connect(reader, self.caps), self.caps.head_s)
        except TimeoutError:
            raise Refused(408, "the request head came too slowly") from None
        addresses = await checked_addresses(target, self.policy, self.resolve, self.caps.connect_s)
        try:
            return await asyncio.wait_for(connect(target, addresses), self.caps.connect_s)
        except TimeoutError:
            raise Refused(
                504, f"{target} did not answer within {self.caps.connect_s:g} s"
            ) from None

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refused: Refused
    ) -> None:
        """Answer ``refused``, then read and drop what the client still sends (at most
        ``LINGER_BYTES``, for ``LINGER_S``) before the connection closes: closed with bytes
        unread, it would be reset, and the client might never read the answer."""
        self.refusal(str(refused))
        with contextlib.suppress(ConnectionError, TimeoutError):
            writer.write(answer(refused.status, str(refused)))
            await asyncio.wait_for(writer.drain(), CLOSE_S)
            if writer.can_write_eof():
                writer.write_eof()
            await asyncio.wait_for(drop(reader, LINGER_BYTES), LINGER_S)

    async def splice(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        far_reader: asyncio.StreamReader,
        far_writer: asyncio.StreamWriter,
    ) -> None:
        """Bytes both ways until the destination's side ends (the sandbox's end is passed on
        as an end of its writing), or a deadline or the byte cap ends the tunnel."""
        last = [time.monotonic()]
        up = asyncio.create_task(self._pipe(reader, far_writer, "bytes_out", last))
        down = asyncio.create_task(self._pipe(far_reader, writer, "bytes_in", last))
        ends = time.monotonic() + self.caps.total_s
        pending: set[asyncio.Task[None]] = {up, down}
        try:
            while down in pending:
                wait = min(ends, last[0] + self.caps.idle_s) - time.monotonic()
                if wait <= 0:
                    return
                done, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if any(t.exception() is not None for t in done):
                    return
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        counter: str,
        last: list[float],
    ) -> None:
        while data := await src.read(BUFFER):
            room = self.caps.max_bytes - self._spent()
            if room <= 0:  # spent by the other direction, which said so
                raise ConnectionAbortedError("the egress byte cap is reached")
            setattr(self.meter, counter, getattr(self.meter, counter) + min(len(data), room))
            dst.write(data[:room])  # up to the cap, which then ends the tunnel
            await dst.drain()
            if len(data) >= room:
                self.refusal(f"the sandbox's {self.caps.max_bytes} bytes of egress are spent")
                raise ConnectionAbortedError("the egress byte cap is reached")
            last[0] = time.monotonic()
        if dst.can_write_eof():
            dst.write_eof()


async def connect(target: Destination, addresses: list[IPAddress]) -> Streams:
    """A connection to the first of ``addresses`` (checked for ``target``) that answers;
    Refused (502) where none does."""
    assert target.port is not None
    errors = []
    for address in addresses:
        try:
            return await asyncio.open_connection(str(address), target.port, limit=BUFFER)
        except OSError as e:
            errors.append(f"{address}: {e.strerror or e}")
    raise Refused(502, f"cannot connect to {target} ({'; '.join(errors)})")


async def read_connect(reader: asyncio.StreamReader, caps: EgressCaps) -> Destination:
    """A request head, read whole within the caps; its CONNECT target, else Refused."""
    try:
        request_line = await reader.readline()
        size, lines = len(request_line), 0
        while (line := await reader.readline()) not in (b"\r\n", b"\n"):
            if not line:
                raise asyncio.IncompleteReadError(b"", None)
            size, lines = size + len(line), lines + 1
            if size > caps.max_head_bytes or lines > caps.max_header_lines:
                raise Refused(431, "the request head is too large")
    except ValueError:  # a line over the reader's limit
        raise Refused(431, "a line of the request head is too long") from None
    if size > caps.max_head_bytes:
        raise Refused(431, "the request head is too large")
    parts = request_line.rstrip(b"\r\n").split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Refused(400, "not an HTTP/1 request line")
    if parts[0] != b"CONNECT":
        raise Refused(405, "this proxy only tunnels (CONNECT HOST:PORT, as HTTPS clients do)")
    try:
        return parse_authority(parts[1].decode("ascii"))
    except ValueError as e:  # UnicodeDecodeError too
        raise Refused(400, f"CONNECT: {e}") from None


async def drop(reader: asyncio.StreamReader, limit: int) -> None:
    """Read and drop until the end of the stream, or ``limit`` bytes."""
    while limit > 0 and (data := await reader.read(BUFFER)):
        limit -= len(data)


def answer(status: int, reason: str) -> bytes:
    """A whole HTTP answer that says ``reason`` and closes the connection."""
    body = f"raas egress proxy: {reason}\n".encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), CLOSE_S)


def metrics_of(egress: Egress | None) -> dict[str, Any]:
    """A job's ``metrics.egress``: what its sandbox's proxy did (empty where it had none)."""
    return {} if egress is None else egress.meter.metrics()
