"""The relay: an HTTP server on 127.0.0.1 inside the sandbox that the host answers.

The sandbox has no network, but an agent program in it may call an OpenAI-style API. Once the
host asks (the ``expose_gateway`` action), the action server listens on ``127.0.0.1:PORT`` and
sends each HTTP request to the host over the action-server connection that asked, as
``{"relay": {"id": N, "method": ..., "path": ..., "headers": {...}, "body_b64": ...}}``; the
host answers ``{"relay_reply": {"id": N, "status": ..., "headers": {...}, "body_b64": ...}}``,
which is written back as the HTTP response. Header names reach the host in lower case (repeated
headers joined with ", "). HTTP/1.1 with Content-Length or chunked bodies, keep-alive, no
streaming of responses. A request the host does not answer within the deadline gets a 504; one
made while no host connection is attached, or whose connection is lost, a 502.

Authentication comes before the body. The host gives the relay, with ``expose_gateway``, the
job's token (``token``) and a cap (``max_body``, bytes). A request that carries the token neither
as ``Authorization: Bearer <token>`` (OpenAI's clients), ``x-api-key`` (Anthropic's),
``x-goog-api-key`` nor its query's ``key`` (Google's) is answered 401 as soon as its headers are
in, and one whose declared length
(or chunked body so far) is over the cap 413: neither body is read into memory (nor a
``100 Continue`` sent for it), and nothing of it goes to the host, so a large unauthenticated
body costs the host nothing. The connection then closes, after at most ``LINGER_BYTES`` of the
unread body are read and dropped (so that a client still sending sees the answer, not a reset).
The token is the job's own, which the agent holds anyway; the host checks it again (and the cap,
before decoding) in case this process was subverted. Checking here rather than forwarding the
headers first and waiting for the host's verdict costs no round trip per request.

Standard library only, Python 3.8+.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import itertools
import json
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Dict, Tuple
from urllib.parse import parse_qs

MAX_LINE = 64 * 1024
MAX_HEADERS = 100
# The cap until the host gives one (the host's default is the same).
MAX_BODY = 32 * 1024 * 1024
# After an early refusal: how much of an unread body is read and dropped, and for how long.
LINGER_BYTES = 1024 * 1024
LINGER_S = 2.0
# How long a kept-alive connection may sit idle, and how long one request may take to arrive.
IDLE_S = 75.0
REQUEST_S = 120.0
WRITE_S = 120.0
# Not passed on either way: they describe one hop, which the relay replaces.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}

Send = Callable[[Dict[str, Any]], Awaitable[None]]
Response = Tuple[int, Dict[str, str], bytes]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.path = ""  # the request's, once its request line is read


class RelayLost(Exception):
    pass


UNAUTHORIZED = "unknown or closed job token: send 'Authorization: Bearer <job token>'"


API_KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def offered_tokens(headers: dict[str, str], query: str = "") -> list[str]:
    """The tokens a request offers: ``Authorization: Bearer``'s, then ``x-api-key``'s,
    ``x-goog-api-key``'s and the ``query``'s ``key`` (as raas.helpers.tokens.offered_tokens,
    which this standard-library module cannot import)."""
    out = []
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        out.append(given.strip())
    out += [headers[name].strip() for name in API_KEY_HEADERS if name in headers]
    if "key=" in query:
        out += parse_qs(query, keep_blank_values=True).get("key", [])
    return out


def too_large(max_body: int) -> str:
    return f"the body is over the relay's {max_body} bytes"


# Anthropic's error types by status (raas.llm.anthropic_messages answers the same).
ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    413: "request_too_large",
}


def speaks_anthropic(path: str) -> bool:
    """Is ``path`` one of Anthropic's Messages API (with or without the /v1 a client adds)?"""
    path = "/" + path.split("?", 1)[0].strip("/")
    path = path[len("/v1") :] if path.startswith("/v1/") else path
    return path == "/messages" or path.startswith("/messages/")


# google.rpc's codes by HTTP status (raas.llm.gemini_content answers the same).
GOOGLE_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    502: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def speaks_gemini(path: str) -> bool:
    """Is ``path`` one of Gemini's API (``/v1beta/...``)?"""
    return path.startswith("/v1beta/")


def error_response(status: int, message: str, path: str = "") -> Response:
    """An error in the shape of the API of ``path``, so that its client reports the message:
    Anthropic's on its Messages API, Google's on Gemini's, else OpenAI's."""
    if speaks_gemini(path):
        code = GOOGLE_STATUSES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        error = {"error": {"code": status, "message": message, "status": code}}  # type: Any
    elif speaks_anthropic(path):
        kind = ANTHROPIC_ERRORS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        error = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        error = {"error": {"message": message, "type": "relay_error", "code": status}}
    return status, {"content-type": "application/json"}, json.dumps(error).encode()


class Relay:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.send: Send | None = None
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.timeout_s = 600.0
        self.token: str | None = None
        self.max_body = MAX_BODY

    async def expose(
        self,
        send: Send,
        port: int,
        timeout_s: float,
        token: str | None = None,
        max_body: int = MAX_BODY,
    ) -> int:
        """Listen (once; later calls re-attach to ``send``) and return the port. Only requests
        that carry ``token`` (when given) and a body of at most ``max_body`` bytes are relayed.
        """
        if self.server is None:
            self.server = await asyncio.start_server(
                self.http_connection, "127.0.0.1", port, limit=MAX_LINE
            )
            self.port = int(self.server.sockets[0].getsockname()[1])
        elif port and port != self.port:
            raise ValueError(f"the relay already listens on port {self.port}")
        self.send = send
        self.timeout_s = timeout_s
        self.token = token
        self.max_body = max_body
        return self.port

    def admit(self, headers: dict[str, str], path: str = "") -> None:
        """Refuse a request by its headers (and its path's query) alone: HttpError 401 without
        the token, 413 when its declared length is over the cap."""
        query = path.partition("?")[2]
        if self.token is not None and not any(
            hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())
            for given in offered_tokens(headers, query)
        ):
            raise HttpError(401, UNAUTHORIZED)
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise HttpError(400, "bad Content-Length") from None
        if length < 0:
            raise HttpError(400, "bad Content-Length")
        if length > self.max_body:
            raise HttpError(413, too_large(self.max_body))

    def detach(self, send: Send) -> None:
        """The host connection ``send`` writes to is gone: its relay calls get a 502."""
        if self.send is not send:
            return
        self.send = None
        for future in self.pending.values():
            if not future.done():
                future.set_exception(RelayLost("the host connection closed"))
        self.pending.clear()

    def reply(self, message: Any) -> None:
        """A ``relay_reply`` from the host; one nobody waits for (any more) is dropped."""
        req_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(req_id, int):
            return
        future = self.pending.pop(req_id, None)
        if future is not None and not future.done():
            future.set_result(message)

    async def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> Response:
        send = self.send
        if send is None:
            return error_response(502, "no host is attached to the relay", path)
        req_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()  # type: asyncio.Future[Dict[str, Any]]
        self.pending[req_id] = future
        request = {
            "id": req_id,
            "method": method,
            "path": path,
            "headers": headers,
            "body_b64": base64.b64encode(body).decode(),
        }

        async def exchange() -> dict[str, Any]:
            await send({"relay": request})
            return await future

        try:
            reply = await asyncio.wait_for(exchange(), self.timeout_s)
        except asyncio.TimeoutError:
            return error_response(504, f"the host did not answer within {self.timeout_s:g} s", path)
        except (RelayLost, ConnectionError) as e:
            return error_response(502, f"the relay lost the host: {e}", path)
        finally:
            self.pending.pop(req_id, None)
        try:
            status = int(reply.get("status", 502))
            raw_headers = reply.get("headers") or {}
            out = {str(k): str(v) for k, v in dict(raw_headers).items()}
            data = base64.b64decode(reply.get("body_b64") or "")
        except (TypeError, ValueError) as e:
            return error_response(502, f"the host's answer was malformed: {e}", path)
        if not 100 <= status <= 599:
            return error_response(502, f"the host answered status {status}", path)
        return status, out, data

    async def http_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                try:
                    first = await asyncio.wait_for(reader.readline(), IDLE_S)
                    if not first.strip():
                        break  # end of stream (or a stray blank line: not worth more)
                    request = await asyncio.wait_for(
                        read_request(first, reader, writer, self), REQUEST_S
                    )
                except HttpError as e:
                    answer = error_response(e.status, str(e), e.path)
                    await write_response(writer, answer, False)
                    await linger(reader, writer)
                    break
                except ValueError:  # a line over the reader's limit
                    await write_response(writer, error_response(431, "a line is too long"), False)
                    break
                method, path, version, headers, body = request
                response = await self.forward(method, path, headers, body)
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                await write_response(writer, response, keep)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()


async def read_request(
    first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, relay: Relay
) -> tuple[str, str, str, dict[str, str], bytes]:
    """One request; its headers pass ``relay.admit`` before any of its body is read."""
    parts = first.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "bad request line")
    method, path, version = parts
    try:
        headers, body = await read_rest(reader, writer, relay, path)
    except HttpError as e:
        e.path = path  # answered in the shape of the API it was sent to
        raise
    return method, path, version, headers, body


async def read_rest(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, relay: Relay, path: str
) -> tuple[dict[str, str], bytes]:
    """A request's headers and, once they (and its path) pass ``relay.admit``, its body."""
    headers = {}  # type: Dict[str, str]
    for _ in range(MAX_HEADERS + 1):
        line = await reader.readline()
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        if line in (b"\r\n", b"\n"):
            break
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name.strip():
            raise HttpError(400, "bad header line")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = headers[key] + ", " + value if key in headers else value
    else:
        raise HttpError(431, "too many headers")
    relay.admit(headers, path)
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await read_chunked(reader, relay.max_body)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    for name in HOP_BY_HOP | {"expect"}:
        headers.pop(name, None)
    return headers, body


async def read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readline()
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise HttpError(400, "bad chunk size") from None
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers: dropped
            return bytes(body)
        if len(body) + size > max_body:
            raise HttpError(413, too_large(max_body))
        body += await reader.readexactly(size)
        await reader.readline()


async def linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Before closing on a refused request: read and drop what the client still sends, up to
    ``LINGER_BYTES`` or ``LINGER_S``, so that closing with it unread (a reset) does not destroy
    the answer before the client reads it. Nothing is kept."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        left = LINGER_BYTES
        loop = asyncio.get_running_loop()
        end = loop.time() + LINGER_S
        while left > 0:
            chunk = await asyncio.wait_for(reader.read(min(left, 65536)), end - loop.time())
            if not chunk:
                return
            left -= len(chunk)
    except (OSError, asyncio.TimeoutError, ValueError):
        pass


async def write_response(writer: asyncio.StreamWriter, response: Response, keep: bool) -> None:
    status, headers, body = response
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name, value in headers.items():
        if name.lower() in HOP_BY_HOP or any(c in name + value for c in "\r\n"):
            continue
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: {}".format("keep-alive" if keep else "close"))
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body)
    await asyncio.wait_for(writer.drain(), WRITE_S)
