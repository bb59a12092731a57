"""The proxy's door: a TCP listener on 127.0.0.1 inside the sandbox whose connections the host
carries, each as a byte stream of its own; raas's proxy on the host decides where they go.

On the host's ``expose_proxy`` action the server listens on ``127.0.0.1:PORT``. Each connection
made to it is announced over the action-server connection that asked, as ``{"tunnel": {"id":
N}}``. The host then opens a connection of its own to the action server's socket and, after the
hello, sends ``{"tunnel_attach": N}`` as its first line: from then on the two connections are
one stream each way, and nothing here reads what passes (the host reads the proxy request and
answers it). The host may instead send ``{"tunnel_close": {"id": N}}`` (it is over its caps), or
not attach within ``ATTACH_S``: the connection is then closed.

The sandbox keeps no network: the only way out is the host's stream, over the Unix socket the
host made. The host's deadlines (idle, total) and caps (bytes, tunnels) hold there; here, at
most ``max_tunnels`` connections wait or pass at once (the host's cap, so that a flood of
connections costs the host no message), and no side's bytes pile up: each is read
``BUFFER`` bytes at a time and written on only once the other side has taken the last.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Awaitable, Callable, Dict, Tuple

BUFFER = 64 * 1024
ATTACH_S = 30.0
MAX_TUNNELS = 16

Send = Callable[[Dict[str, Any]], Awaitable[None]]
Streams = Tuple[asyncio.StreamReader, asyncio.StreamWriter, "asyncio.Future[None]"]


class TunnelRefused(Exception):
    pass


class Tunnels:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.waiting = {}  # type: Dict[int, asyncio.Future[Streams]]
        self.live = 0
        self.send = None  # type: Send | None
        self.server = None  # type: asyncio.AbstractServer | None
        self.port = 0
        self.max_tunnels = MAX_TUNNELS

    async def expose(self, send: Send, port: int, max_tunnels: int) -> int:
        """Listen (once; later calls re-attach to ``send``) and return the port."""
        if self.server is None:
            self.server = await asyncio.start_server(self.accepted, "127.0.0.1", port, limit=BUFFER)
            self.port = int(self.server.sockets[0].getsockname()[1])
        elif port and port != self.port:
            raise ValueError(f"the proxy already listens on port {self.port}")
        self.send = send
        self.max_tunnels = max_tunnels
        return self.port

    def detach(self, send: Send) -> None:
        """The host connection ``send`` writes to is gone: what waits for it is closed."""
        if self.send is not send:
            return
        self.send = None
        for tunnel_id in list(self.waiting):
            self.refused(tunnel_id)

    def refused(self, tunnel_id: Any) -> None:
        """The host will not carry ``tunnel_id`` (``tunnel_close``)."""
        future = self.waiting.pop(tunnel_id, None) if isinstance(tunnel_id, int) else None
        if future is not None and not future.done():
            future.set_exception(TunnelRefused())

    async def accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection made inside: announced, carried once the host attaches, else closed."""
        send = self.send
        if send is None or self.live >= self.max_tunnels:
            writer.close()
            return
        self.live += 1
        tunnel_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()  # type: asyncio.Future[Streams]
        self.waiting[tunnel_id] = future
        try:
            await send({"tunnel": {"id": tunnel_id}})
            host_reader, host_writer, done = await asyncio.wait_for(future, ATTACH_S)
        except (asyncio.TimeoutError, TunnelRefused, ConnectionError):
            writer.close()
            self.live -= 1
            return
        finally:
            self.waiting.pop(tunnel_id, None)
        try:
            await splice(reader, writer, host_reader, host_writer)
        finally:
            writer.close()
            host_writer.close()
            self.live -= 1
            if not done.done():
                done.set_result(None)

    async def attached(
        self, tunnel_id: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """The host's connection for ``tunnel_id``: held until the tunnel ends."""
        future = self.waiting.pop(tunnel_id, None) if isinstance(tunnel_id, int) else None
        if future is None or future.done():
            return
        # This connection's reader was made for the protocol's large messages, and asyncio
        # buffers twice a reader's limit before it stops reading: a tunnel's bytes must wait
        # in the socket instead (the host then stops reading its destination).
        if hasattr(reader, "_limit"):
            setattr(reader, "_limit", BUFFER)  # noqa: B010 (a private attribute, said so)
        done = asyncio.get_running_loop().create_future()  # type: asyncio.Future[None]
        future.set_result((reader, writer, done))
        await done


async def splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host_reader: asyncio.StreamReader,
    host_writer: asyncio.StreamWriter,
) -> None:
    """Bytes both ways until the host's side ends (the host decides when a tunnel is over);
    the end of this side's writing is passed on."""
    up = asyncio.ensure_future(pipe(reader, host_writer))
    down = asyncio.ensure_future(pipe(host_reader, writer))
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        if down not in done and up.exception() is None:
            await asyncio.wait({down})
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while True:
        data = await src.read(BUFFER)
        if not data:
            break
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof():
        dst.write_eof()
