"""The relay: HTTP on 127.0.0.1 inside a sandbox without network, answered by a host handler.

Real sandboxes (bubblewrap; Apptainer under ``-m hpc``), through the same ``config`` fixture as
tests/sandbox/test_sandbox.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.sandbox import ApptainerConfig, BwrapConfig, Sandbox, create_sandbox
from raas.sandbox.client import RELAY_MAX_BODY_BYTES
from tests.sandbox.test_sandbox import LIMITS, MiB, config  # noqa: F401 (the fixture)

# Inside: POST a JSON body (or N bytes of it, from argv[3]) and print status, headers, body.
POST = """
import json, sys, urllib.request, urllib.error
port, path = sys.argv[1], sys.argv[2]
size = int(sys.argv[3]) if len(sys.argv) > 3 else 0
body = (b"x" * size) if size else json.dumps({"model": "m", "messages": []}).encode()
req = urllib.request.Request("http://127.0.0.1:%s%s" % (port, path), data=body, method="POST",
    headers={"Content-Type": "application/json", "Authorization": "Bearer tok-1",
             "X-Odd": "a b:c"})
try:
    resp = urllib.request.urlopen(req, timeout=60)
    status, headers, data = resp.status, dict(resp.headers), resp.read()
except urllib.error.HTTPError as e:
    status, headers, data = e.code, dict(e.headers), e.read()
print(json.dumps({"status": status, "headers": headers, "body": data.decode()}))
"""


class Recorder:
    """A fake gateway session: answers OpenAI-shaped JSON and keeps what it was sent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, str, dict[str, str], bytes]] = []

    async def __call__(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        self.calls.append((method, path, headers, body))
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"hello from {self.name}"},
                    "finish_reason": "stop",
                }
            ],
            "sha256": hashlib.sha256(body).hexdigest(),
        }
        return (
            200,
            {"content-type": "application/json", "x-gateway": self.name},
            (json.dumps(answer).encode()),
        )


@pytest.fixture
async def sandbox(config: BwrapConfig | ApptainerConfig) -> AsyncIterator[Sandbox]:  # noqa: F811
    sb = create_sandbox(config)
    await sb.start()
    yield sb
    await sb.close()


async def post(sandbox: Sandbox, port: int, path: str, size: int = 0) -> dict[str, object]:
    await sandbox.write_file("/tmp/post.py", POST)
    result = await sandbox.bash(f"python3 /tmp/post.py {port} {shlex.quote(path)} {size}")
    assert result.exit_code == 0, result.output
    answer: dict[str, object] = json.loads(result.output)
    return answer


async def test_a_request_inside_reaches_the_handler_and_its_answer_comes_back(
    sandbox: Sandbox,
) -> None:
    gateway = Recorder("g1")
    port = await sandbox.expose(gateway)
    answer = await post(sandbox, port, "/v1/chat/completions?x=1")
    assert answer["status"] == 200
    assert isinstance(answer["headers"], dict) and answer["headers"]["x-gateway"] == "g1"
    reply = json.loads(str(answer["body"]))
    assert reply["choices"][0]["message"]["content"] == "hello from g1"
    [(method, path, headers, body)] = gateway.calls
    assert (method, path) == ("POST", "/v1/chat/completions?x=1")
    assert headers["authorization"] == "Bearer tok-1"
    assert headers["x-odd"] == "a b:c"
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"model": "m", "messages": []}


async def test_a_megabyte_body_arrives_intact(sandbox: Sandbox) -> None:
    gateway = Recorder("big")
    port = await sandbox.expose(gateway)
    size = 1024 * 1024 + 7
    answer = await post(sandbox, port, "/v1/chat/completions", size)
    assert answer["status"] == 200
    assert gateway.calls[0][3] == b"x" * size
    assert json.loads(str(answer["body"]))["sha256"] == hashlib.sha256(b"x" * size).hexdigest()


async def test_keep_alive_and_chunked_bodies(sandbox: Sandbox) -> None:
    gateway = Recorder("ka")
    port = await sandbox.expose(gateway)
    script = f"""
import http.client, json
c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=30)
out = []
for i in range(3):
    c.request("POST", "/v1/responses", body=json.dumps({{"i": i}}), headers={{"X-I": str(i)}})
    r = c.getresponse(); out.append([r.status, len(r.read())])
c.request("POST", "/v1/chat/completions", body=iter([b"ab", b"cd"]),
          headers={{"Transfer-Encoding": "chunked"}}, encode_chunked=True)
r = c.getresponse(); out.append([r.status, len(r.read())])
print(json.dumps(out))
"""
    await sandbox.write_file("/tmp/ka.py", script)
    result = await sandbox.bash("python3 /tmp/ka.py")
    assert result.exit_code == 0, result.output
    assert [s for s, _ in json.loads(result.output)] == [200] * 4
    assert [c[3] for c in gateway.calls] == [b'{"i": 0}', b'{"i": 1}', b'{"i": 2}', b"abcd"]


async def test_two_sandboxes_reach_only_their_own_handler(
    config: BwrapConfig | ApptainerConfig,  # noqa: F811
) -> None:
    one, two = create_sandbox(config), create_sandbox(config)
    await asyncio.gather(one.start(), two.start())
    try:
        first, second = Recorder("first"), Recorder("second")
        port_one, port_two = await one.expose(first), await two.expose(second)
        a, b = await asyncio.gather(
            post(one, port_one, "/v1/chat/completions"),
            post(two, port_two, "/v1/chat/completions"),
        )
        assert "hello from first" in str(a["body"]) and "hello from second" in str(b["body"])
        assert len(first.calls) == len(second.calls) == 1
        if port_one != port_two:  # the other's port is nothing inside this one
            connect = f"socket.create_connection(('127.0.0.1', {port_two}), 2)"
            stray = await one.bash(f'python3 -c "import socket; {connect}"')
            assert stray.exit_code != 0 and "ConnectionRefused" in stray.output
    finally:
        await asyncio.gather(one.close(), two.close())


async def test_the_sandbox_still_has_no_network(sandbox: Sandbox) -> None:
    await sandbox.expose(Recorder("g"))
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    host_port = listener.getsockname()[1]
    try:
        interfaces = await sandbox.bash("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert interfaces.output == "lo\n"
        for address in ["10.0.0.1", "8.8.8.8", "192.168.1.1"]:
            result = await sandbox.bash(
                "python3 -c 'import socket; socket.create_connection"
                f'(("{address}", {host_port}), 2)\''
            )
            assert result.exit_code != 0
            assert "unreachable" in result.output.lower() or "Errno" in result.output
    finally:
        listener.close()


async def test_a_handler_that_raises_gives_a_502_not_a_hang(sandbox: Sandbox) -> None:
    async def broken(
        method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        raise RuntimeError("the gateway broke")

    port = await sandbox.expose(broken)
    answer = await post(sandbox, port, "/v1/chat/completions")
    assert answer["status"] == 502
    assert "the gateway broke" in json.loads(str(answer["body"]))["error"]["message"]


async def test_a_handler_that_never_answers_gives_a_504(sandbox: Sandbox) -> None:
    async def stuck(
        method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    port = await sandbox.expose(stuck, timeout_s=1.0)
    answer = await post(sandbox, port, "/v1/models")
    assert answer["status"] == 504
    # And a later expose replaces the handler on the same port.
    assert await sandbox.expose(Recorder("after")) == port
    assert (await post(sandbox, port, "/v1/models"))["status"] == 200


# Inside: send a request of a declared size (or chunked), streaming the body from one buffer,
# and stop sending as soon as an answer arrives; print the status line's code.
STREAM = """
import select, socket, sys
port, size, token, chunked = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
head = "POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
if token != "-":
    head += "Authorization: Bearer %s\\r\\n" % token
if chunked:
    head += "Transfer-Encoding: chunked\\r\\n\\r\\n"
else:
    head += "Content-Length: %d\\r\\n\\r\\n" % size
block = b"x" * (1 << 20)
if chunked:
    block = b"%x\\r\\n" % len(block) + block + b"\\r\\n"
s = socket.create_connection(("127.0.0.1", port), 30)
s.sendall(head.encode())
sent, answer = 0, b""
while b"\\r\\n" not in answer:
    readable, writable, _ = select.select([s], [s] if sent < size else [], [], 30)
    if readable:
        data = s.recv(65536)
        if not data:
            break
        answer += data
    elif writable:
        try:
            sent += s.send(block)
        except OSError:
            sent = size
    elif not readable:
        break
print(answer.split(b"\\r\\n")[0].decode().split(" ")[1] if answer else "none")
"""


def peak_rss(reset: bool = False) -> int:
    """This process's peak resident memory (VmHWM), in bytes; ``reset``: start it again from
    the present resident memory first."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


async def stream(sandbox: Sandbox, port: int, size: int, token: str, chunked: bool = False) -> str:
    await sandbox.write_file("/tmp/stream.py", STREAM)
    line = f"python3 /tmp/stream.py {port} {size} {token} {int(chunked)}"
    result = await sandbox.bash(line, timeout_s=60)
    assert result.exit_code == 0, result.output
    return result.output.strip()


async def test_a_large_body_without_the_token_is_refused_before_it_is_read(
    sandbox: Sandbox,
) -> None:
    gateway = Recorder("g")
    port = await sandbox.expose(gateway, token="tok-1")
    before = peak_rss(reset=True)
    assert await stream(sandbox, port, 150 * MiB, "-") == "401"
    assert await stream(sandbox, port, 150 * MiB, "tok-2", chunked=True) == "401"
    # Here is where the host side runs: the 150 MiB never came (it was 742 MiB of this).
    assert peak_rss() - before < 50 * MiB
    assert gateway.calls == []
    # The token's own requests still go through, on a connection of their own.
    assert (await post(sandbox, port, "/v1/chat/completions"))["status"] == 200
    assert len(gateway.calls) == 1


async def test_a_body_over_the_cap_with_the_token_gets_a_413(sandbox: Sandbox) -> None:
    gateway = Recorder("g")
    port = await sandbox.expose(gateway, token="tok-1")  # the default cap
    assert await stream(sandbox, port, RELAY_MAX_BODY_BYTES + 1, "tok-1") == "413"
    port = await sandbox.expose(gateway, token="tok-1", max_body_bytes=MiB)
    assert await stream(sandbox, port, 3 * MiB, "tok-1", chunked=True) == "413"
    assert await stream(sandbox, port, MiB + 1, "tok-1") == "413"
    assert gateway.calls == []
    assert (await post(sandbox, port, "/v1/chat/completions", MiB))["status"] == 200


# Inside: POST {} to a path with the token as a key is sent: in a header (Anthropic's x-api-key,
# Google's x-goog-api-key) or, where the header's name is "-", in the query's key; print the
# status and the body.
KEYED = """
import json, sys, urllib.request, urllib.error
port, path, header, key = sys.argv[1:5]
headers = {"Content-Type": "application/json"}
if header == "-":
    path += "&key=" + key
else:
    headers[header] = key
req = urllib.request.Request("http://127.0.0.1:%s%s" % (port, path), data=b"{}",
    method="POST", headers=headers)
try:
    resp = urllib.request.urlopen(req, timeout=60)
    status, data = resp.status, resp.read()
except urllib.error.HTTPError as e:
    status, data = e.code, e.read()
print(json.dumps({"status": status, "body": json.loads(data)}))
"""


async def keyed(sandbox: Sandbox, port: int, path: str, header: str, key: str) -> Any:
    await sandbox.write_file("/tmp/keyed.py", KEYED)
    result = await sandbox.bash(f"python3 /tmp/keyed.py {port} '{path}' {header} {key}")
    return json.loads(result.output)


async def test_the_token_as_x_api_key_passes_the_relay_and_the_host(sandbox: Sandbox) -> None:
    gateway = Recorder("g")
    port = await sandbox.expose(gateway, token="tok-1")
    ok, refused = [
        await keyed(sandbox, port, "/v1/messages?beta=true", "x-api-key", key)
        for key in ("tok-1", "tok-2")
    ]
    assert ok["status"] == 200 and ok["body"]["model"] == "g"
    ((method, path, headers, _),) = gateway.calls
    assert (method, path, headers["x-api-key"]) == ("POST", "/v1/messages?beta=true", "tok-1")
    # Refused in the shape of the API it was sent to: Anthropic's.
    assert refused["status"] == 401 and refused["body"]["type"] == "error"
    assert refused["body"]["error"]["type"] == "authentication_error"


async def test_the_token_as_googles_key_passes_the_relay_and_the_host(sandbox: Sandbox) -> None:
    gateway = Recorder("g")
    port = await sandbox.expose(gateway, token="tok-1")
    path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    answers = {}
    for where, header in (("header", "x-goog-api-key"), ("query", "-")):
        for key in ("tok-1", "tok-2"):
            answers[where, key] = await keyed(sandbox, port, path, header, key)
    assert [a["status"] for a in answers.values()] == [200, 401, 200, 401]
    by_header, by_query = gateway.calls
    assert by_header[2]["x-goog-api-key"] == "tok-1"
    assert by_query[1].endswith("?alt=sse&key=tok-1") and "x-goog-api-key" not in by_query[2]
    # Refused in the shape of the API it was sent to: Google's.
    refused = answers["query", "tok-2"]["body"]["error"]
    assert (refused["code"], refused["status"]) == (401, "UNAUTHENTICATED")
    assert set(refused) == {"code", "message", "status"}
