"""The gateway's calls skip FastAPI's routing (raas.api.routes.gateway.GatewayLane): what the
lane answers must be what FastAPI's route answers, and the server's guards still run first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from starlette.types import ASGIApp

from raas.agent.gateway import GEMINI, ROUTES
from raas.api.app import create_app
from raas.api.routes.gateway import GatewayLane
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry


def paths() -> list[tuple[str, str]]:
    """Every gateway route as a request's path, with its method."""
    return [
        (path.replace(GEMINI, "/v1beta/models/gemini-2.5:x"), method)
        for path, (method, _) in ROUTES.items()
    ]


async def call(
    app: FastAPI, asgi: ASGIApp, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], Any]:
    """One request to ``asgi`` (the whole app, or a part of it) as uvicorn makes it."""
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw += [(b"host", b"localhost"), (b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 1),
        "server": ("localhost", 80),
        "app": app,  # (Starlette's own entry sets it; FastAPI's router alone needs it given)
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asgi(scope, receive, send)
    start = sent[0]
    answer = b"".join(m.get("body", b"") for m in sent[1:])
    got = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], got, json.loads(answer)


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    # No lifespan: no service, so every gateway call is answered as one of no open job.
    return create_app(ServeSettings(db=tmp_path / "lane.db", llm=[]), TaskRegistry())


@pytest.mark.parametrize(("path", "method"), paths())
async def test_the_lane_answers_as_fastapis_route_to_the_gateway(
    app: FastAPI, path: str, method: str
) -> None:
    headers = {"authorization": "Bearer raas-nobody", "content-type": "application/json"}
    via_lane = await call(app, app, method, path, headers, b"{}")
    # FastAPI's routing alone (no middleware, no lane) reaches the same route: no other route
    # of the app takes a gateway path, so the lane serves nothing FastAPI would send elsewhere.
    routing = AsyncExitStackMiddleware(app.router)  # (what FastAPI puts before its routes)
    via_fastapi = await call(app, routing, method, path, headers, b"{}")
    status, got, body = via_lane
    assert (status, body) == (via_fastapi[0], via_fastapi[2])
    assert status == 401 and got["www-authenticate"] == "Bearer"
    assert got["content-type"] == via_fastapi[1]["content-type"]


async def test_another_method_goes_on_to_fastapi(app: FastAPI) -> None:
    status, got, body = await call(app, app, "GET", "/v1/chat/completions", {})
    assert status == 405 and got["allow"] == "POST"
    assert "is not served here" in body["detail"]


async def test_the_guards_run_before_the_lane(tmp_path: Path) -> None:
    settings = ServeSettings(db=tmp_path / "g.db", llm=[], api_key="k", max_body_mb=0.001)
    app = create_app(settings, TaskRegistry())
    path = "/v1/chat/completions"
    status, _, body = await call(app, app, "POST", path, {"authorization": "Bearer wrong"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    big = b"{" + b" " * 2000 + b"}"
    status, _, body = await call(app, app, "POST", path, {"authorization": "Bearer k"}, big)
    assert status == 413 and "max_body_mb" in body["detail"]
    form = {"authorization": "Bearer k", "content-type": "text/plain"}
    status, _, _ = await call(app, app, "POST", path, form, b"{}")
    assert status == 415


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions/",
        "//v1/chat/completions",
        "/v1/./chat/completions",
        "/V1/chat/completions",
        "/v1/chat/completions/../../rollouts",
        "/v1/rollouts",
        "/v1beta/models/a/b:generateContent",
    ],
)
async def test_a_path_that_is_not_a_gateway_routes_takes_no_job_token(
    tmp_path: Path, path: str
) -> None:
    # (The server's path is the decoded one; these are what a sandboxed agent could send.) Not
    # a gateway route's: the key's 401 in raas's own shape, never the lane's answer.
    settings = ServeSettings(db=tmp_path / "p.db", llm=[], api_key="k")
    app = create_app(settings, TaskRegistry())
    status, _, body = await call(app, app, "POST", path, {"authorization": "Bearer raas-job"})
    assert status == 401 and "error" not in body and "API key" in body["detail"]


async def test_the_app_serves_gateway_calls_through_the_lane_not_the_router(app: FastAPI) -> None:
    # The test above passes as well without the lane (FastAPI's routes answer the same): this
    # one holds that the lane is installed and answers with no router behind it.
    assert any(m.cls is GatewayLane for m in app.user_middleware)

    async def no_router(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"routed: {scope['path']}")

    headers = {"authorization": "Bearer raas-nobody", "content-type": "application/json"}
    status, got, _ = await call(
        app, GatewayLane(no_router), "POST", "/v1/chat/completions", headers, b"{}"
    )
    assert status == 401 and got["www-authenticate"] == "Bearer"
    with pytest.raises(AssertionError, match="routed: /v1/status"):  # the control
        await call(app, GatewayLane(no_router), "GET", "/v1/status", headers)
