"""The host side of the action-server protocol: one connection per sandbox, typed and async."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROTOCOL = 1
MAX_MESSAGE = 512 * 1024 * 1024
CLOSE_WAIT_S = 5.0


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
class IPythonResult:
    stdout: str
    result: str | None
    error: dict[str, str] | None
    timed_out: bool
    kernel_restarted: bool = False


class ActionClient:
    """Requests over one Unix-socket connection; several may be in flight at once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reading: asyncio.Task[None] | None = None

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
        client = cls(reader, writer)
        client._reading = asyncio.create_task(client._read_answers())
        return client

    async def _read_answers(self) -> None:
        error: Exception = SandboxError("the action server closed the connection")
        try:
            while line := await self._reader.readline():
                answer = json.loads(line)
                future = self._pending.pop(answer.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except (ConnectionError, ValueError) as e:
            error = SandboxError(f"lost the action server: {e}")
        finally:  # also when cancelled by close(): nobody may wait forever
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()

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
        if not answer.get("ok"):
            err = answer.get("error") or {}
            raise ToolError(str(err.get("type", "Error")), str(err.get("message", "")))
        result: dict[str, Any] = answer.get("result") or {}
        return result

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), timeout=CLOSE_WAIT_S)


async def _hello(socket_path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=MAX_MESSAGE)
    try:
        return reader, writer, await reader.readline()
    except BaseException:  # the deadline passed, or the server hung up mid-line
        writer.close()
        raise
