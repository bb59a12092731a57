"""A real sandbox with raas's egress proxy: its programs reach what the policy allows through
127.0.0.1:PORT inside, over the host's tunnels, and nothing else; the sandbox keeps no network.
Bubblewrap; Apptainer under ``-m hpc``, through the same ``config`` fixture as
tests/sandbox/test_sandbox.py.

The destinations are servers on the host's 127.0.0.1 (a TLS one for curl, a TCP echo), which the
policy lists by address; a name (``tls.test``) is resolved on the host by the test's resolver,
since the sandbox resolves nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shlex
import ssl
import subprocess
from pathlib import Path

import pytest

from raas.helpers.destinations import IPAddress
from raas.sandbox import ApptainerConfig, BwrapConfig, Sandbox, create_sandbox
from raas.sandbox.egress import EgressPolicy
from raas.sandbox.proxy import EgressCaps, proxy_env
from tests.sandbox import test_sandbox_relay
from tests.sandbox.test_proxy import DEADLINE_S, echo_server, until
from tests.sandbox.test_sandbox import config  # noqa: F401 (the fixture)

sandbox = test_sandbox_relay.sandbox  # the fixture: a started sandbox of ``config``

# Inside: a CONNECT to argv[2] through the proxy at argv[1], then argv[3] sent through the
# tunnel; prints the answer's status line and what came back ("hold": keeps the tunnel open).
CONNECT = r"""
import socket, sys, time
port, target, payload = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
s = socket.create_connection(("127.0.0.1", port), 30)
s.sendall(b"CONNECT " + target.encode() + b" HTTP/1.1\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    try:
        chunk = s.recv(4096)
    except ConnectionResetError:  # closed with the request unread
        chunk = b""
    if not chunk:
        break
    head += chunk
print(head.split(b"\r\n")[0].decode())
if b" 200 " in head.split(b"\r\n")[0]:
    if payload == b"hold":
        time.sleep(600)
    s.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    print(got.decode())
"""


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for tls.test (and its key), made with openssl."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=tls.test", "-addext", "subjectAltName=DNS:tls.test",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def https_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One HTTP request read, answered ``hello over tls``."""
    try:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        body = b"hello over tls\n"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body))
        writer.write(b"Connection: close\r\n\r\n" + body)
        await writer.drain()
    finally:
        writer.close()


async def resolve_test_names(host: str, port: int) -> list[IPAddress]:
    if host == "tls.test":
        return [ipaddress.ip_address("127.0.0.1")]
    raise OSError(f"no such name: {host}")


# Inside: Python's urllib, which takes https_proxy from the environment as curl does.
URLOPEN = (
    "python3 -c 'import ssl, sys, urllib.request;"
    ' context = ssl.create_default_context(cafile="/tmp/ca.pem");'
    " print(urllib.request.urlopen(sys.argv[1], context=context, timeout=60).read().decode(),"
    ' end="")\''
)
CLIENTS = {"curl": "curl -sS --max-time 60 --cacert /tmp/ca.pem", "python": URLOPEN}


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_client_reaches_an_allowed_https_server_through_the_proxy(
    sandbox: Sandbox, tls_files: tuple[Path, Path], client: str
) -> None:
    if (await sandbox.bash(f"command -v {client.replace('python', 'python3')}")).exit_code:
        pytest.skip(f"the sandbox's image has no {client}")
    cert, key = tls_files
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await asyncio.start_server(https_answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    async with server:
        policy = EgressPolicy.parse([f"tls.test:{port}", f"127.0.0.1:{port}"])
        proxy_port = await sandbox.open_egress(policy, resolve=resolve_test_names)
        await sandbox.write_file("/tmp/ca.pem", cert.read_bytes())
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in proxy_env(proxy_port).items())
        await sandbox.bash(f"export {exports}")
        allowed = await sandbox.bash(f"{CLIENTS[client]} https://tls.test:{port}/")
        assert allowed.exit_code == 0 and allowed.output == "hello over tls\n", allowed.output
        # Not on the list: the proxy answers 403, which the client reports.
        refused = await sandbox.bash(f"{CLIENTS[client]} https://pypi.org/")
        assert refused.exit_code != 0 and "403" in refused.output, refused.output
    assert sandbox.egress is not None
    meter = sandbox.egress.meter
    assert (meter.tunnels, meter.refused) == (1, 1) and meter.bytes_in > 0 < meter.bytes_out


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("127.0.0.1:{port}", "HTTP/1.1 200 Connection established\nping\n"),  # the control
        ("127.0.0.1:{other}", "HTTP/1.1 403 Forbidden\n"),  # a port not listed
        ("localhost:{port}", "HTTP/1.1 403 Forbidden\n"),  # a name for it, not listed
        ("169.254.169.254:80", "HTTP/1.1 403 Forbidden\n"),
        ("user@127.0.0.1:{port}", "HTTP/1.1 400 Bad Request\n"),
    ],
)
async def test_a_program_inside_reaches_only_the_listed_address(
    sandbox: Sandbox, target: str, said: str
) -> None:
    async with echo_server() as echo:
        proxy_port = await sandbox.open_egress(EgressPolicy.parse([echo.address]))
        await sandbox.write_file("/tmp/connect.py", CONNECT)
        target = target.format(port=echo.port, other=echo.port + 1)
        result = await sandbox.bash(f"python3 /tmp/connect.py {proxy_port} {target} ping")
        assert result.output == said
    assert echo.connections == (1 if said.endswith("ping\n") else 0)


async def test_connections_inside_beyond_the_cap_are_closed(sandbox: Sandbox) -> None:
    async with echo_server() as echo:
        caps = EgressCaps(max_tunnels=1)
        proxy_port = await sandbox.open_egress(EgressPolicy.parse([echo.address]), caps)
        await sandbox.write_file("/tmp/connect.py", CONNECT)
        # One tunnel held open in the background, then a second one.
        hold = f"python3 /tmp/connect.py {proxy_port} {echo.address} hold"
        await sandbox.bash(f"{hold} >/dev/null 2>&1 &")
        await until(lambda: echo.connections == 1, "the first tunnel is open")
        second = await sandbox.bash(f"python3 /tmp/connect.py {proxy_port} {echo.address} ping")
        assert second.output == "\n"  # closed, unanswered
    assert echo.connections == 1
    assert sandbox.egress is not None and sandbox.egress.meter.refused == 0  # not even asked


async def test_closing_the_sandbox_closes_its_tunnels(
    config: BwrapConfig | ApptainerConfig,  # noqa: F811
) -> None:
    closed = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the proxy's side ends
        closed.set()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        sandbox = create_sandbox(config)
        await sandbox.start()
        try:
            proxy_port = await sandbox.open_egress(EgressPolicy.parse([f"127.0.0.1:{port}"]))
            await sandbox.write_file("/tmp/connect.py", CONNECT)
            holder = f"python3 /tmp/connect.py {proxy_port} 127.0.0.1:{port} hold"
            await sandbox.bash(f"{holder} >/dev/null 2>&1 &")
            assert sandbox.egress is not None
            egress = sandbox.egress
            await until(lambda: egress.meter.tunnels == 1, "the tunnel is open")
        finally:
            await sandbox.close()
        await asyncio.wait_for(closed.wait(), DEADLINE_S)
    assert egress.meter.open == 0
