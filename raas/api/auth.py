"""Optional bearer-token auth: when an API key is set, every route but /healthz needs it."""

from __future__ import annotations

import secrets

from fastapi import HTTPException, Request, status


async def require_api_key(request: Request) -> None:
    expected: str | None = request.app.state.service.settings.api_key
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), expected):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
