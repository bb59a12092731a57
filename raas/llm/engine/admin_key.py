"""The engine's admin routes (those that change its state: ``/update_weights``) need its key.

A pure ASGI middleware, so the key is checked before a body is read or parsed: a process
without the key cannot make the engine read a large body, or a file. An engine started without
a key refuses the admin routes to everyone (it has no way to tell its trainer from any other
process of the machine).

Generation routes stay open, as on a vLLM server started without ``--api-key``: generating
changes nothing the engine holds, and raas's backend pool sends no key to any backend.
"""

from __future__ import annotations

import secrets

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from raas.helpers.tokens import bearer_token

ADMIN_PATHS = frozenset({"/update_weights"})
WRONG_KEY = "missing or wrong API key: send 'Authorization: Bearer <key>'"
NO_KEY = (
    "this engine was started without an API key, so it changes its weights for no one:"
    " start it with RAAS_API_KEY or --api-key-file"
)


class AdminKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        # Bytes: a header may hold any byte, and compare_digest refuses a str that is not ASCII.
        self.expected = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ADMIN_PATHS:
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        if (
            self.expected is not None
            and token is not None
            and secrets.compare_digest(token, self.expected)
        ):
            await self.app(scope, receive, send)
            return
        message = WRONG_KEY if self.expected is not None else NO_KEY
        body = {"error": {"message": message, "type": "AuthenticationError", "code": 401}}
        response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
