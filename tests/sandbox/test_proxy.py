"""raas's egress proxy on the host, against real sockets on 127.0.0.1: what it tunnels, what it
refuses (each attack beside the request that passes), and its caps and deadlines.

The connection a sandbox makes reaches ``Egress.carry`` as a byte stream; here the test is that
connection's other end (tests/sandbox/test_sandbox_egress.py goes through a real sandbox). The
destinations are echo servers on 127.0.0.1, allowed by their address, since loopback is refused
unless the admin lists that very address.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from raas.helpers.destinations import IPAddress
from raas.sandbox.egress import EgressPolicy, Resolver, system_resolver
from raas.sandbox.proxy import BUFFER, Egress, EgressCaps, proxy_env

DEADLINE_S = 60.0  # for anything to happen on this loaded machine; nothing waits for it to pass


@dataclass
class Echo:
    """A TCP server that sends back what it gets, and counts the connections it had."""

    host: str = "127.0.0.1"
    port: int = 0
    connections: int = 0
    got: bytearray = field(default_factory=bytearray)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while data := await reader.read(BUFFER):
                self.got += data
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@asynccontextmanager
async def echo_server(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[Echo]:
    echo = Echo(host)
    server = await asyncio.start_server(echo.handle, host, port)
    echo.port = server.sockets[0].getsockname()[1]
    async with server:
        yield echo


@dataclass
class Proxy:
    port: int
    egress: Egress

    async def open(self, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(head)
        await writer.drain()
        return reader, writer

    async def ask(self, head: bytes) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
        """Send ``head``; the answer's status line, and the connection."""
        reader, writer = await self.open(head)
        status = await asyncio.wait_for(reader.readline(), DEADLINE_S)
        return status, reader, writer

    async def status(self, head: bytes) -> int:
        status, _, writer = await self.ask(head)
        writer.close()
        return int(status.split()[1]) if status else 0

    async def tunnel(self, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """An open tunnel to ``target`` (its 200 and blank line read)."""
        status, reader, writer = await self.ask(connect(target))
        assert status.startswith(b"HTTP/1.1 200 "), status
        assert await reader.readline() == b"\r\n"
        return reader, writer


def connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


@asynccontextmanager
async def proxy(
    allowed: list[str], caps: EgressCaps | None = None, resolve: Resolver = system_resolver
) -> AsyncIterator[Proxy]:
    """``Egress`` serving each connection to a port on 127.0.0.1 as a sandbox's tunnel."""
    egress = Egress(EgressPolicy.parse(allowed), caps or EgressCaps(), resolve)
    carried: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def opened() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return reader, writer

        async def refuse() -> None:
            writer.close()

        task = asyncio.current_task()
        assert task is not None
        carried.add(task)
        try:
            await egress.carry(opened, refuse)
        finally:
            carried.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=BUFFER)
    async with server:
        yield Proxy(server.sockets[0].getsockname()[1], egress)
        for task in carried:
            task.cancel()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition()`` until it is true, failing after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < ends, f"not within {DEADLINE_S:g} s: {what}"
        await asyncio.sleep(0.02)


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What the other end sent until it closed (or reset) the connection."""
    got = bytearray()
    try:
        while data := await asyncio.wait_for(reader.read(BUFFER), DEADLINE_S):
            got += data
    except ConnectionError:
        pass
    return bytes(got)


# -- what passes -------------------------------------------------------------------------------


async def test_a_listed_destination_is_tunnelled_both_ways_and_counted() -> None:
    async with echo_server() as echo, proxy([echo.address]) as px:
        reader, writer = await px.tunnel(echo.address)
        writer.write(b"hello through the tunnel")
        assert await reader.readexactly(24) == b"hello through the tunnel"
        writer.write_eof()  # the client's end passes on; the destination's closes the tunnel
        assert await closed(reader) == b""
        writer.close()
        await until(lambda: px.egress.meter.open == 0, "the tunnel is closed")
    assert px.egress.meter.metrics() == {
        "tunnels": 1,
        "bytes_out": 24,
        "bytes_in": 24,
        "refused": 0,
    }


async def test_bytes_sent_before_the_answer_go_to_the_destination() -> None:
    # A TLS client may send its hello right behind the CONNECT head.
    async with echo_server() as echo, proxy([echo.address]) as px:
        reader, writer = await px.open(connect(echo.address) + b"early bytes")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200 ")
        assert await reader.readline() == b"\r\n"
        assert await reader.readexactly(11) == b"early bytes"
        writer.close()


async def test_odd_spellings_of_a_listed_name_reach_only_its_checked_address() -> None:
    async with echo_server() as echo:
        resolve = answering("127.0.0.1")
        allowed = [f"echo.test:{echo.port}", echo.address]
        async with proxy(allowed, resolve=resolve) as px:
            for spelling in ["echo.test", "ECHO.Test", "echo.test."]:
                reader, writer = await px.tunnel(f"{spelling}:{echo.port}")
                writer.write(b"x")
                assert await reader.readexactly(1) == b"x"
                writer.close()
    assert echo.connections == 3


# -- what is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("evil.test:{port}", 403),  # a name not on the list
        ("127.0.0.1:{other}", 403),  # a port not on the list
        ("127.0.0.2:{port}", 403),  # another loopback address
        ("[::1]:{port}", 403),
        ("[::ffff:127.0.0.1]:{port}", 403),
        ("169.254.169.254:80", 403),  # the cloud's metadata service
        ("10.0.0.1:{port}", 403),
        ("0.0.0.0:{port}", 403),
        ("localhost:{port}", 403),  # a name for the listed address is not the address
        ("127.1:{port}", 400),  # spellings a resolver would read as 127.0.0.1
        ("2130706433:{port}", 400),
        ("0x7f.0.0.1:{port}", 400),
        ("%31%32%37.0.0.1:{port}", 400),  # percent-encoding
        ("evil.test@127.0.0.1:{port}", 400),  # user info
        ("127.0.0.1:{port}@evil.test", 400),
        ("127.0.0.1:0{port}", 400),
        ("127.0.0.1", 400),  # no port
        ("http://127.0.0.1:{port}/", 400),
    ],
)
async def test_a_connect_off_the_list_is_refused(target: str, status: int) -> None:
    async with echo_server() as echo, proxy([echo.address]) as px:
        target = target.format(port=echo.port, other=echo.port + 1)
        assert await px.status(connect(target)) == status
        assert await px.status(connect(echo.address)) == 200  # the control
    assert echo.connections == 1
    assert px.egress.meter.refused == 1 and px.egress.meter.tunnels == 1


async def test_a_listed_name_that_resolves_to_loopback_is_refused() -> None:
    async with echo_server() as echo, proxy([f"localhost:{echo.port}"]) as px:
        status, reader, writer = await px.ask(connect(f"localhost:{echo.port}"))
        assert status.startswith(b"HTTP/1.1 403 ")
        assert b"not public" in await reader.read()
        writer.close()
    assert echo.connections == 0


async def test_the_name_is_resolved_once_and_its_checked_address_connected_to() -> None:
    # DNS rebinding: the first answer passes the check, a second would lead elsewhere.
    answers = iter(["127.0.0.1", "127.0.0.2", "127.0.0.2"])
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        return [ipaddress.ip_address(next(answers))]

    async with echo_server() as echo, echo_server("127.0.0.2", echo.port) as victim:
        allowed = [f"rebind.test:{echo.port}", echo.address]
        async with proxy(allowed, resolve=rebinding) as px:
            reader, writer = await px.tunnel(f"rebind.test:{echo.port}")
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            writer.close()
    assert asked == ["rebind.test"]
    assert (echo.connections, victim.connections) == (1, 0)


async def test_the_next_checked_address_is_tried_when_one_does_not_answer() -> None:
    async with echo_server() as echo:
        # 127.0.0.2 first, where nothing listens on the port: refused, then the echo.
        allowed = [f"multi.test:{echo.port}", f"127.0.0.2:{echo.port}", echo.address]
        async with proxy(allowed, resolve=answering("127.0.0.2", "127.0.0.1")) as px:
            reader, writer = await px.tunnel(f"multi.test:{echo.port}")
            writer.write(b"x")
            assert await reader.readexactly(1) == b"x"
            writer.close()
        async with proxy(allowed[:2], resolve=answering("127.0.0.2")) as px:
            status, reader, writer = await px.ask(connect(f"multi.test:{echo.port}"))
            assert status.startswith(b"HTTP/1.1 502 ") and b"127.0.0.2" in await reader.read()
            writer.close()
    assert echo.connections == 1


@pytest.mark.parametrize(
    "head",
    [
        "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n",  # plain-HTTP proxying
        "connect {target} HTTP/1.1\r\n\r\n",  # a method is case-sensitive
        "CONNECT {target} HTTP/2\r\n\r\n",
        "CONNECT  {target} HTTP/1.1\r\n\r\n",
        "CONNECT {target}\r\n\r\n",
    ],
)
async def test_only_a_well_formed_connect_is_served(head: str) -> None:
    async with echo_server() as echo, proxy([echo.address]) as px:
        assert await px.status(head.format(target=echo.address).encode()) in (400, 405)
    assert echo.connections == 0


async def test_a_request_inside_a_tunnel_goes_to_the_tunnels_destination_only() -> None:
    async with echo_server() as echo, echo_server() as other, proxy([echo.address]) as px:
        reader, writer = await px.tunnel(echo.address)
        smuggled = (
            f"CONNECT {other.address} HTTP/1.1\r\n\r\n"
            f"GET http://{other.address}/ HTTP/1.1\r\nHost: {other.address}\r\n\r\n"
        )
        writer.write(smuggled.encode())
        assert await reader.readexactly(len(smuggled)) == smuggled.encode()  # echoed
        writer.close()
    assert (echo.connections, other.connections) == (1, 0)


@pytest.mark.parametrize(
    "head",
    [
        "CONNECT {target} HTTP/1.1\r\n" + "X-Flood: 1\r\n" * 200 + "\r\n",  # many headers
        "CONNECT {target} HTTP/1.1\r\nX-Big: " + "a" * 9000 + "\r\n\r\n",  # a large head
        "CONNECT {target} HTTP/1.1\r\nX-Huge: " + "a" * 200_000 + "\r\n\r\n",  # one huge line
    ],
)
async def test_a_header_flood_is_refused(head: str) -> None:
    async with echo_server() as echo, proxy([echo.address]) as px:
        assert await px.status(head.format(target=echo.address).encode()) == 431
    assert echo.connections == 0


async def test_a_slow_head_is_cut_off() -> None:
    caps = EgressCaps(head_s=1.0)
    async with echo_server() as echo, proxy([echo.address], caps) as px:
        reader, writer = await px.open(connect(echo.address)[:10])
        answered = asyncio.create_task(reader.readline())
        for _ in range(50):  # a byte every 0.2 s: the head would take 10 s
            await asyncio.wait({answered}, timeout=0.2)
            if answered.done():
                break
            writer.write(b"X")
        status = await asyncio.wait_for(answered, DEADLINE_S)
        assert status.startswith(b"HTTP/1.1 408 ")
        writer.close()
    assert echo.connections == 0 and px.egress.meter.refused == 1


# -- caps and deadlines ------------------------------------------------------------------------


async def test_tunnels_beyond_the_cap_are_refused_until_one_closes() -> None:
    async with echo_server() as echo, proxy([echo.address], EgressCaps(max_tunnels=2)) as px:
        first = await px.tunnel(echo.address)
        second = await px.tunnel(echo.address)
        reader, _ = await px.open(connect(echo.address))
        assert await closed(reader) == b""  # closed unanswered
        first[1].close()
        await until(lambda: px.egress.meter.open == 1, "the first tunnel is closed")
        third = await px.tunnel(echo.address)  # the control: room again
        for _, w in (second, third):
            w.close()
    assert echo.connections == 3 and px.egress.meter.refused == 1


async def test_a_sandbox_that_spends_its_bytes_gets_no_more() -> None:
    cap = 256 * 1024
    async with echo_server() as echo, proxy([echo.address], EgressCaps(max_bytes=cap)) as px:
        reader, writer = await px.tunnel(echo.address)
        writer.write(b"x" * 1024)
        assert await reader.readexactly(1024) == b"x" * 1024  # the control: under the cap
        writer.write(b"y" * (1024 * 1024))
        echoed = await closed(reader)  # ended at the cap
        writer.close()
        meter = px.egress.meter
        assert meter.bytes_in + meter.bytes_out == cap
        assert len(echoed) == meter.bytes_in - 1024 and meter.refused == 1
        await until(lambda: px.egress.meter.open == 0, "the tunnel is closed")
        reader, writer = await px.open(connect(echo.address))
        assert await closed(reader) == b""  # no new tunnel
        writer.close()
    assert px.egress.meter.refused == 2


@pytest.mark.parametrize("caps", [EgressCaps(idle_s=0.5), EgressCaps(total_s=0.5)])
async def test_a_tunnel_ends_at_its_deadlines(caps: EgressCaps) -> None:
    async with echo_server() as echo, proxy([echo.address], caps) as px:
        reader, writer = await px.tunnel(echo.address)
        assert await closed(reader) == b""  # nothing sent: it ends at its idle (or total) deadline
        writer.close()


async def test_a_fast_destination_waits_for_a_slow_reader() -> None:
    """Flow control: what the destination sends and the sandbox does not read waits in the
    sockets' buffers, not in the host's memory; all of it arrives once it is read."""
    total = 48 * 1024 * 1024
    data = hashlib.sha256(b"seed").digest() * (total // 32)
    sent = [0]

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(0, total, BUFFER):
            writer.write(data[i : i + BUFFER])
            await writer.drain()
            sent[0] = i + BUFFER
        writer.close()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, proxy([f"127.0.0.1:{port}"]) as px:
        reader, writer = await px.tunnel(f"127.0.0.1:{port}")
        # The sender stalls: its count stays put for 0.5 s (or it sent everything: a fail).
        seen = -1
        while sent[0] != seen and sent[0] < total:
            seen = sent[0]
            await asyncio.sleep(0.5)
        assert sent[0] < total // 2, f"{sent[0]} bytes left the destination, unread"
        got = hashlib.sha256()
        size = 0
        while chunk := await asyncio.wait_for(reader.read(1 << 20), DEADLINE_S):
            got.update(chunk)
            size += len(chunk)
        assert size == total and got.digest() == hashlib.sha256(data).digest()
        writer.close()


def answering(*addresses: str) -> Resolver:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in addresses]

    return resolve


def test_the_proxy_variables_leave_loopback_direct() -> None:
    env = proxy_env(3128)
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://127.0.0.1:3128"
    assert env["HTTP_PROXY"] == env["http_proxy"] == "http://127.0.0.1:3128"
    assert "127.0.0.1" in env["NO_PROXY"] and "localhost" in env["no_proxy"]
