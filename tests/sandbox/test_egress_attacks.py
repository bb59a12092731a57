"""Attacks on the egress proxy (security review): each test asserts the safe behaviour, beside
a control that shows the legitimate path works. Two worked when found, and are mended: IPv6
forms that embed a private IPv4 address (NAT64, IPv4-compatible, IPv4-translated, site-local)
passed as public, and a subverted action server's endless tunnel announcements each became a
task on the host (and a refusal it need not read).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path

import pytest

from raas.helpers.destinations import Destination, IPAddress, parse_authority
from raas.sandbox.client import PROTOCOL, ActionClient
from raas.sandbox.egress import EgressPolicy, Refused, checked_addresses, is_public
from raas.sandbox.proxy import Egress, EgressCaps
from tests.sandbox.test_proxy import DEADLINE_S, closed, connect, echo_server, proxy, until

# -- addresses that embed a private IPv4 address in an IPv6 one --------------------------------


@pytest.mark.parametrize(
    "address",
    [
        # NAT64's well-known prefix (RFC 6052): a NAT64 gateway connects to the embedded IPv4
        # address, so a listed name whose AAAA is 64:ff9b::a00:5 (DNS64 synthesises it from an
        # A record of 10.0.0.5) reaches the VPC's private 10.0.0.5 (AWS NAT gateways do).
        "64:ff9b::a00:5",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        # IPv4-compatible (deprecated, ::/96) and IPv4-translated (SIIT, ::ffff:0:0/96) forms.
        "::7f00:1",
        "::a9fe:a9fe",
        "::ffff:0:a00:5",
        # Site-local (deprecated fec0::/10): internal wherever it is still routed.
        "fec0::1",
        # Already refused (controls of the same family).
        "::ffff:10.0.0.5",
        "2002:a00:5::",
        # NAT64's local-use prefix (RFC 8215): global to this Python (3.11) as well
        "64:ff9b:1::a00:5",
    ],
)
def test_an_ipv6_form_of_a_private_ipv4_address_is_not_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


def test_a_public_ipv4_in_nat64_form_stays_public() -> None:
    # The control: a fix must not refuse NAT64 forms of public addresses (IPv6-only hosts).
    assert is_public(ipaddress.ip_address("64:ff9b::5db8:d70e"))  # 93.184.215.14
    assert is_public(ipaddress.ip_address("93.184.215.14"))


async def test_a_listed_name_whose_aaaa_is_nat64_of_a_private_address_is_refused() -> None:
    async def dns64(host: str, port: int) -> list[IPAddress]:
        # DNS64 answers a name whose A record is 10.0.0.5 with its synthesised AAAA too.
        return [ipaddress.ip_address("10.0.0.5"), ipaddress.ip_address("64:ff9b::a00:5")]

    policy = EgressPolicy.parse(["internal.test:443"])
    with pytest.raises(Refused):
        await checked_addresses(Destination("internal.test", 443), policy, dns64)


async def test_a_listed_name_with_a_public_address_passes() -> None:
    async def public(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address("93.184.215.14")]

    policy = EgressPolicy.parse(["example.test:443"])
    found = await checked_addresses(Destination("example.test", 443), policy, public)
    assert found == [ipaddress.ip_address("93.184.215.14")]


# -- name and address spellings ----------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "0x7f000001:{port}",  # a valid name by the syntax; the resolver reads it as 127.0.0.1
        "0177.0.0.1:{port}",
        "127.000.000.001:{port}",
        "127.0.0.1.:{port}",
        "[::ffff:7f00:1]:{port}",
        "[0:0:0:0:0:ffff:127.0.0.1]:{port}",
        "[::127.0.0.1]:{port}",
        "[fe80::1%lo]:{port}",
        "[fe80::1%25lo]:{port}",
        "localhost.:{port}",
        "LOCALHOST:{port}",
        "127.0.0.1:{port}:{port}",
        "127.0.0.1:+{port}",
        "127.0.0.1: {port}",
        "[127.0.0.1]:{port}",
        "127.0.0.1\t:{port}",
        "127.0.0.1:{port}\x00",
        "\u0661\u0662\u0667.0.0.1:{port}",  # Arabic-Indic digits
        "127.0.0.1:\u0661{port}",
        "\uff4cocalhost:{port}",  # fullwidth l
    ],
)
async def test_spellings_of_loopback_do_not_reach_an_unlisted_port(target: str) -> None:
    # Only 127.0.0.1:<echo> is listed; every spelling here aims at the victim, another port of
    # the host's loopback (the raas server's HTTP port, sshd...), which must stay unreached.
    async with echo_server() as echo, echo_server() as victim, proxy([echo.address]) as px:
        target = target.format(port=victim.port)
        status = await px.status(connect(target).replace(b"Host: ", b"X-Host: "))
        assert status in (400, 403), (target, status)
        assert await px.status(connect(echo.address)) == 200  # the control
    assert victim.connections == 0 and echo.connections == 1


def test_a_hex_name_is_a_name_and_never_an_address() -> None:
    # "0x7f000001" passes the syntax as a name: only an admin who lists it could be fooled,
    # and even then the resolver's 127.0.0.1 is checked (not public).
    assert parse_authority("0x7f000001:80") == Destination("0x7f000001", 80)


async def test_a_listed_hex_name_that_the_resolver_reads_as_loopback_is_refused() -> None:
    async with echo_server() as echo, proxy([f"0x7f000001:{echo.port}"]) as px:
        assert await px.status(connect(f"0x7f000001:{echo.port}")) == 403
    assert echo.connections == 0


# -- request smuggling -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        # a second request line among the headers
        "CONNECT {ok} HTTP/1.1\r\nCONNECT {victim} HTTP/1.1\r\n\r\n",
        # two heads in one write: the second is tunnelled bytes, for {ok}
        "CONNECT {ok} HTTP/1.1\r\n\r\nCONNECT {victim} HTTP/1.1\r\n\r\n",
        # a body announced on CONNECT
        "CONNECT {ok} HTTP/1.1\r\nContent-Length: 40\r\n\r\nCONNECT {victim} HTTP/1.1\r\n\r\n",
        "CONNECT {ok} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        # an absolute-URI request pipelined after CONNECT
        "CONNECT {ok} HTTP/1.1\r\n\r\nGET http://{victim}/ HTTP/1.1\r\nHost: {victim}\r\n\r\n",
        # a bare CR in the request line, a header folded onto it
        "CONNECT {ok} HTTP/1.1\r\r\n\r\n",
        "CONNECT {ok} HTTP/1.1\r\n CONNECT {victim} HTTP/1.1\r\n\r\n",
    ],
)
async def test_smuggled_requests_reach_only_the_first_target(head: str) -> None:
    async with echo_server() as echo, echo_server() as victim, proxy([echo.address]) as px:
        reader, writer = await px.open(head.format(ok=echo.address, victim=victim.address).encode())
        status = await asyncio.wait_for(reader.readline(), DEADLINE_S)
        assert status.startswith(b"HTTP/1.1 200 "), status
        writer.write_eof()
        await closed(reader)
        writer.close()
    assert victim.connections == 0 and echo.connections == 1


@pytest.mark.parametrize(
    "head",
    [
        "GET http://{victim}/ HTTP/1.1\r\nHost: {victim}\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: {victim}\r\n\r\n",
        "POST http://{victim}/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: {victim}\r\n\r\n",
        "CONNECT {victim} HTTP/1.1\r\n\r\n",  # not listed
    ],
)
async def test_plain_http_through_the_proxy_is_refused(head: str) -> None:
    async with echo_server() as echo, echo_server() as victim, proxy([echo.address]) as px:
        # the victim is the listed host's other port: not listed
        assert await px.status(head.format(victim=victim.address).encode()) in (403, 405)
        assert await px.status(connect(echo.address)) == 200
    assert victim.connections == 0


# -- the byte cap, split across tunnels --------------------------------------------------------


async def test_many_tunnels_at_once_do_not_pass_more_than_the_byte_cap() -> None:
    cap = 100_000
    async with (
        echo_server() as echo,
        proxy([echo.address], EgressCaps(max_bytes=cap, max_tunnels=8)) as px,
    ):
        tunnels = [await px.tunnel(echo.address) for _ in range(8)]
        for _, writer in tunnels:
            writer.write(b"x" * cap)
        for reader, writer in tunnels:
            await closed(reader)
            writer.close()
        await until(lambda: px.egress.meter.open == 0, "the tunnels are closed")
        assert px.egress.meter.bytes_out + px.egress.meter.bytes_in <= cap
        try:  # refused unopened (closed, or reset: the test's refuse() closes with bytes unread)
            status = await px.status(connect(echo.address))
        except ConnectionError:
            status = 0
        assert status == 0
    assert len(echo.got) <= cap


# -- a subverted action server against the host --------------------------------------------------


FLOOD = 50_000


async def test_a_subverted_action_server_cannot_pile_up_tunnel_work_on_the_host(
    tmp_path: Path,
) -> None:
    """The inside server announces at most max_tunnels connections, but a subverted one (the
    agent owns the sandbox's processes) can announce any number. Each announcement becomes a
    task on the host, and each over the cap a ``tunnel_close`` written to a connection the
    server never reads: the host's tasks and write buffer grow with the flood, without bound."""
    path = tmp_path / "a.sock"
    hold = asyncio.Event()
    connections = []

    async def subverted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        if len(connections) > 1:  # the host's tunnel streams: no hello, held open
            await hold.wait()
            return
        writer.write(json.dumps({"hello": {"protocol": PROTOCOL}}).encode() + b"\n")
        request = json.loads(await reader.readline())
        flood = b"".join(
            json.dumps({"tunnel": {"id": i}}).encode() + b"\n" for i in range(1, FLOOD + 1)
        )
        writer.write(flood)
        # The answer to the host's call comes behind the flood: once the call returns, the
        # host has read every announcement. From then on nothing is read here.
        writer.write(json.dumps({"id": request["id"], "ok": True, "result": {}}).encode() + b"\n")
        await writer.drain()
        await hold.wait()

    server = await asyncio.start_unix_server(subverted, str(path))
    client = await ActionClient.connect(path, DEADLINE_S)
    try:
        egress = Egress(EgressPolicy.parse(["127.0.0.1:1"]), EgressCaps(max_tunnels=1))

        async def carry(tunnel_id: int) -> None:
            await egress.carry(
                lambda: client.open_tunnel(tunnel_id), lambda: client.refuse_tunnel(tunnel_id)
            )

        client.set_tunnels(carry)
        await client.call("ping", {}, deadline_s=DEADLINE_S)
        for _ in range(3):  # each spawned task takes its first step (its refusal's write)
            await asyncio.sleep(0)
        transport = client._writer.transport
        buffered = transport.get_write_buffer_size()
        working = len(client._working)
        assert egress.meter.refused > 0  # the flood was read and refused
        print(f"host tasks: {working}, write buffer: {buffered} bytes")
        assert working < 1000, f"{working} tasks on the host for one sandbox's flood"
        assert buffered < 64 * 1024, f"{buffered} bytes of refusals held on the host"
    finally:
        hold.set()
        await client.close()
        server.close()
        for writer in connections:
            writer.close()


async def test_an_agents_refused_connections_are_counted_not_each_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused connections cost the agent nothing: each is counted, but only the first few
    are logged (else it fills the host's log); the control: the first is logged."""
    egress = Egress(EgressPolicy.parse(["127.0.0.1:1"]))
    with caplog.at_level("WARNING", logger="raas.sandbox.proxy"):
        for _ in range(1000):
            egress.refusal("example.com:443 is not on this server's egress allow-list")
    assert egress.meter.refused == 1000
    assert "example.com:443" in caplog.records[0].getMessage()
    assert len(caplog.records) <= 20
