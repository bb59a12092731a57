"""The host side of the action-server protocol: one connection per sandbox, typed and async.

Protocol 3 (see inside/server.py, inside/relay.py and inside/tunnel.py): besides the answers to
its requests, the server may send ``{"relay": {...}}``, an HTTP request made inside the sandbox to
the relay that ``expose_gateway`` opened; the client runs the handler registered with
``set_relay`` on it and sends back ``{"relay_reply": {...}}``. It may also send ``{"tunnel":
{"id": N}}``, a connection made inside to the proxy's door (``expose_proxy``): the client runs
the handler registered with ``set_tunnels`` on it, which opens the tunnel's own stream
(``open_tunnel``) or refuses it (``refuse_tunnel``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raas.helpers.tokens import offered_tokens
from raas.sandbox.inside.relay import error_response

PROTOCOL = 3
MAX_MESSAGE = 512 * 1024 * 1024
CLOSE_WAIT_S = 5.0
# How long sending one relay reply back may take (the server reads all the time).
RELAY_SEND_S = 30.0
# The largest body the relay takes (a 413 above). Smaller than the API's 128 MiB: an agent's
# chat request of a million tokens of text is about 4 MiB of JSON, so 32 MiB leaves room for
# images, while one relayed body costs the host four to five times its size (the JSON line,
# its base64 text, the bytes, the parsed request): about 150 MiB at this cap, not 600.
RELAY_MAX_BODY_BYTES = 32 * 1024 * 1024

# An HTTP request made inside the sandbox: (method, path, headers with lower-case names, body)
# -> (status, headers, body).
RelayHandler = Callable[
    [str, str, dict[str, str], bytes], Awaitable[tuple[int, dict[str, str], bytes]]
]
# A connection made inside to the proxy's door, by its id: carried or refused (see set_tunnels).
TunnelHandler = Callable[[int], Awaitable[None]]
# A tunnel's stream: the reader's limit (asyncio stops reading past twice it) bounds what the
# host holds of a sandbox's bytes.
TUNNEL_BUFFER = 64 * 1024
# Announced tunnels being carried or refused at once: the inside announces no more than the
# proxy's cap (16 by default), but a subverted action server can announce without end, and each
# announcement is a task here (and, refused, a line it need not read): past this, one is dropped.
MAX_TUNNEL_WORK = 64

log = logging.getLogger(__name__)


class SandboxError(Exception):
    """The sandbox or its action server failed (not the agent's mistake)."""


class ToolError(Exception):
    """The action was refused or went wrong in a way the agent should hear about.

    ``kind`` is the server's error type (``ToolError``, ``BadRequest``, ``KernelUnavailable``...).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class BashResult:
    output: str
    exit_code: int
    timed_out: bool
    output_cut_bytes: int
    shell_restarted: bool = False
    note: str | None = None


@dataclass(frozen=True)
class ExecResult:
    """A fresh process's end: its exit status from the kernel, its output through pipes."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    stdout_cut_bytes: int
    stderr_cut_bytes: int


@dataclass(frozen=True)
class IPythonResult:
    stdout: str
    result: str | None
    error: dict[str, str] | None
    timed_out: bool
    kernel_restarted: bool = False
    note: str | None = None


class ActionClient:
    """Requests over one Unix-socket connection; several may be in flight at once."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        socket_path: Path | None = None,
    ) -> None:
        self._socket_path = socket_path
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading: asyncio.Task[None] | None = None
        self._relay: RelayHandler | None = None
        self._relay_timeout_s = 600.0
        self._relay_token: str | None = None
        self._relay_max_body = RELAY_MAX_BODY_BYTES
        self._working: set[asyncio.Task[None]] = set()
        self._tunnel_work = 0  # announcements being carried or refused (MAX_TUNNEL_WORK)
        self._tunnels: TunnelHandler | None = None

    @classmethod
    async def connect(cls, socket_path: Path, timeout_s: float) -> ActionClient:
        """Connect and read the server's hello; SandboxError if that takes over ``timeout_s``."""
        try:
            # wait_for, not asyncio.timeout: this module is also type-checked as Python 3.10.
            reader, writer, line = await asyncio.wait_for(_hello(socket_path), timeout_s)
        except TimeoutError:
            raise SandboxError(
                f"the action server at {socket_path} sent no hello within {timeout_s:g} s"
            ) from None
        try:
            hello = json.loads(line).get("hello") if line else None
        except (ValueError, AttributeError):
            hello = None
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            writer.close()
            raise SandboxError(f"the action server spoke an unknown protocol: {line[:200]!r}")
        client = cls(reader, writer, socket_path)
        client._reading = asyncio.create_task(client._read_answers())
        return client

    async def _read_answers(self) -> None:
        error: Exception = SandboxError("the action server closed the connection")
        try:
            while line := await self._reader.readline():
                answer = json.loads(line)
                if not isinstance(answer, dict):  # a subverted server's: no answer of ours
                    continue
                if "relay" in answer:
                    self._spawn(self._answer_relay(answer["relay"]))
                    continue
                if "tunnel" in answer:
                    if self._tunnel_work < MAX_TUNNEL_WORK:  # else dropped: see the cap
                        self._tunnel_work += 1
                        self._spawn(self._carry(answer["tunnel"]))
                    continue
                ident: Any = answer.get("id")
                future = self._pending.pop(ident, None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except (ConnectionError, ValueError) as e:
            error = SandboxError(f"lost the action server: {e}")
        finally:  # also when cancelled by close(): nobody may wait forever
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()

    def _spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` (a relay's answer, a tunnel) beside the reading; ``close`` ends it."""
        task = asyncio.ensure_future(work)
        self._working.add(task)
        task.add_done_callback(self._working.discard)

    async def _send(self, message: bytes, future: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        self._writer.write(message)
        await self._writer.drain()
        return await future

    async def call(self, action: str, args: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """Run one action: ToolError if it was refused, SandboxError if the server is gone or
        does not answer within ``deadline_s``.
        """
        if self._reading is None or self._reading.done():
            raise SandboxError("the action server connection is closed")
        req_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = future
        message = json.dumps({"id": req_id, "action": action, "args": args}).encode() + b"\n"
        try:
            answer = await asyncio.wait_for(self._send(message, future), deadline_s)
        except ConnectionError as e:
            raise SandboxError(f"lost the action server: {e}") from e
        except TimeoutError:
            raise SandboxError(
                f"the action server did not answer {action} within {deadline_s:g} s"
            ) from None
        finally:  # an answer that comes after all finds no one waiting and is dropped
            self._pending.pop(req_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # the connection's loss, set there too once the send failed
        if not answer.get("ok"):
            err = answer.get("error") or {}
            raise ToolError(str(err.get("type", "Error")), str(err.get("message", "")))
        result: dict[str, Any] = answer.get("result") or {}
        return result

    def set_relay(
        self,
        handler: RelayHandler | None,
        timeout_s: float = 600.0,
        *,
        token: str | None = None,
        max_body_bytes: int = RELAY_MAX_BODY_BYTES,
    ) -> None:
        """Answer the sandbox's relayed HTTP requests with ``handler``, each within
        ``timeout_s`` (504 after that; 502 when the handler raises or none is set). With
        ``token``, a request that does not carry it (:func:`token_matches`) gets a 401, one
        whose body is over ``max_body_bytes`` a 413, before its body is decoded: the relay inside
        refuses them first, and this holds if the action server was subverted.
        """
        self._relay = handler
        self._relay_timeout_s = timeout_s
        self._relay_token = token
        self._relay_max_body = max_body_bytes

    async def _answer_relay(self, request: Any) -> None:
        req_id = request.get("id") if isinstance(request, dict) else None
        path = str(request.get("path") or "") if isinstance(request, dict) else ""
        try:
            if self._relay is None:
                raise LookupError("no relay handler is set")
            headers = {str(k): str(v) for k, v in dict(request.get("headers") or {}).items()}
            body_b64 = str(request.get("body_b64") or "")
            query = path.partition("?")[2]
            if self._relay_token is not None and not token_matches(
                headers, self._relay_token, query
            ):
                status, headers, body = error_response(401, UNAUTHORIZED, path)
            elif len(body_b64) > 4 * (self._relay_max_body // 3 + 1):  # checked before decoding
                status, headers, body = error_response(413, too_large(self._relay_max_body), path)
            else:
                status, headers, body = await asyncio.wait_for(
                    self._relay(
                        str(request["method"]),
                        str(request["path"]),
                        headers,
                        base64.b64decode(body_b64),
                    ),
                    self._relay_timeout_s,
                )
        except TimeoutError:
            message = f"the handler did not answer within {self._relay_timeout_s:g} s"
            status, headers, body = error_response(504, message, path)
        except Exception as e:  # the handler's failure is the caller's 502, never a hang
            log.warning("relay handler failed on %r", request, exc_info=True)
            status, headers, body = error_response(502, f"{type(e).__name__}: {e}", path)
        reply = {"id": req_id, "status": status, "headers": headers}
        reply["body_b64"] = base64.b64encode(body).decode()
        line = json.dumps({"relay_reply": reply}).encode() + b"\n"
        with contextlib.suppress(ConnectionError, TimeoutError):
            self._writer.write(line)
            await asyncio.wait_for(self._writer.drain(), RELAY_SEND_S)

    def set_tunnels(self, handler: TunnelHandler | None) -> None:
        """Carry the connections made inside to the proxy's door with ``handler`` (by their
        id); without one, each is refused."""
        self._tunnels = handler

    async def _carry(self, message: Any) -> None:
        try:
            tunnel_id = message.get("id") if isinstance(message, dict) else None
            if not isinstance(tunnel_id, int):
                return
            if self._tunnels is None:
                await self.refuse_tunnel(tunnel_id)
            else:
                await self._tunnels(tunnel_id)
        except Exception:  # one tunnel's failure ends it alone
            log.warning("tunnel %r failed", message, exc_info=True)
        finally:
            self._tunnel_work -= 1

    async def open_tunnel(
        self, tunnel_id: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The byte stream of the connection ``tunnel_id`` made inside: a connection of its own
        to the action server (SandboxError if it cannot be had)."""
        if self._socket_path is None:
            raise SandboxError("this connection knows no socket to open a tunnel on")
        reader, writer = await asyncio.open_unix_connection(
            str(self._socket_path), limit=TUNNEL_BUFFER
        )
        try:
            line = await reader.readline()
            hello = json.loads(line).get("hello") if line else None
            if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
                raise SandboxError(f"the action server spoke an unknown protocol: {line[:200]!r}")
            writer.write(json.dumps({"tunnel_attach": tunnel_id}).encode() + b"\n")
            await writer.drain()
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def refuse_tunnel(self, tunnel_id: int) -> None:
        """Close the connection ``tunnel_id`` made inside, unopened."""
        line = json.dumps({"tunnel_close": {"id": tunnel_id}}).encode() + b"\n"
        with contextlib.suppress(ConnectionError, TimeoutError):
            self._writer.write(line)
            await asyncio.wait_for(self._writer.drain(), RELAY_SEND_S)

    async def close(self) -> None:
        working = list(self._working)
        for task in working:
            task.cancel()
        # Their own closing (a tunnel's sockets) is done before the sandbox's is.
        if working:
            await asyncio.wait(working, timeout=CLOSE_WAIT_S)
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), timeout=CLOSE_WAIT_S)


UNAUTHORIZED = "unknown or closed job token: send 'Authorization: Bearer <job token>'"


def too_large(max_body: int) -> str:
    return f"the body is over the relay's {max_body} bytes"


def token_matches(headers: dict[str, str], token: str, query: str = "") -> bool:
    """Whether a request holds ``token``: in ``headers`` (names in lower case) as
    ``Authorization: Bearer`` (OpenAI's clients, Anthropic's with an auth token), ``x-api-key``
    (Anthropic's) or ``x-goog-api-key`` (Google's), or as ``key`` in its ``query`` (Google's)."""
    return any(
        secrets.compare_digest(given.encode("utf-8", "replace"), token.encode())
        for given in offered_tokens(headers, query)
    )


async def _hello(socket_path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=MAX_MESSAGE)
    try:
        return reader, writer, await reader.readline()
    except BaseException:  # the deadline passed, or the server hung up mid-line
        writer.close()
        raise
