"""The gateway's HTTP face: OpenAI's chat completions, responses and models, Anthropic's
messages and Gemini's generateContent, per job token.

An agent program raas did not write gets ``OPENAI_BASE_URL=<raas>/v1`` and
``OPENAI_API_KEY=<its job's token>`` (or ``ANTHROPIC_BASE_URL=<raas>`` and
``ANTHROPIC_API_KEY``/``ANTHROPIC_AUTH_TOKEN``, or ``GOOGLE_GEMINI_BASE_URL=<raas>`` and
``GEMINI_API_KEY``); the token picks its job's gateway session (and is let through the server's
API key for these paths only, see raas.api.auth). Everything else is the session's: see
raas.agent.gateway.

The routes below are FastAPI's for the document; a request is served by ``GatewayLane`` before
FastAPI routes it (see there), through the same ``_serve``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from raas.agent.gateway import GEMINI, ROUTES, GatewaySession, route_of, unauthorized
from raas.api.errors import app_path
from raas.api.state import ServiceState
from raas.helpers.tokens import offered_tokens
from raas.llm.anthropic_messages import AnthropicErrorBody, AnthropicMessage, TokensCount
from raas.llm.gemini_content import CountTokensResponse, GenerateContentResponse, GoogleErrorBody
from raas.llm.openai_responses import ResponseObject
from raas.llm.openai_types import ChatCompletion, OpenAIErrorBody

router = APIRouter(tags=["gateway"])


def _openai_error(description: str) -> dict[str, Any]:
    return {"model": OpenAIErrorBody, "description": description}


# What the gateway answers, its errors in OpenAI's shape, as OpenAI's clients read them (a 403,
# 413 or 415 comes from the server's guards before the gateway sees the request: raas's own).
UNAUTHORIZED = _openai_error(
    "No job token, or one of no open job (`Authorization: Bearer <job token>`)."
)
POST_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _openai_error("The body is not JSON, or a field raas reads is wrong: `param` names it."),
    401: UNAUTHORIZED,
    503: _openai_error("No inference server answered (none registered, or all failing)."),
}


def _anthropic_error(description: str) -> dict[str, Any]:
    return {"model": AnthropicErrorBody, "description": description}


# Anthropic's clients read Anthropic's shape: its 529 is "overloaded" (retried by its clients).
ANTHROPIC_UNAUTHORIZED = _anthropic_error(
    "No job token, or one of no open job (`x-api-key: <job token>` or"
    " `Authorization: Bearer <job token>`)."
)
ANTHROPIC_BAD = _anthropic_error("The body is not JSON, or a field raas reads is wrong (named).")
COUNT_ERRORS: dict[int | str, dict[str, Any]] = {400: ANTHROPIC_BAD, 401: ANTHROPIC_UNAUTHORIZED}
MESSAGES_ERRORS: dict[int | str, dict[str, Any]] = {
    **COUNT_ERRORS,
    529: _anthropic_error("No inference server answered (none registered, or all failing)."),
}


def _google_error(description: str) -> dict[str, Any]:
    return {"model": GoogleErrorBody, "description": description}


# Google's clients read Google's shape: its 503 is UNAVAILABLE (retried by Gemini CLI).
GEMINI_COUNT_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _google_error("The body is not JSON, or a field raas reads is wrong (named)."),
    401: _google_error(
        "No job token, or one of no open job (`x-goog-api-key: <job token>`, `?key=<job token>`"
        " or `Authorization: Bearer <job token>`)."
    ),
    404: _google_error("No such route: a model name that a path cannot hold (a `?` or `/`)."),
}
GEMINI_ERRORS: dict[int | str, dict[str, Any]] = {
    **GEMINI_COUNT_ERRORS,
    503: _google_error("No inference server answered (none registered, or all failing)."),
}


def job_session(request: Request) -> GatewaySession | None:
    """The open session of the request's job token (``Authorization: Bearer``, ``x-api-key``,
    ``x-goog-api-key`` or the query's ``key``), if any."""
    state: ServiceState | None = getattr(request.app.state, "service", None)
    if state is None or state.gateway is None:
        return None
    for token in offered_tokens(request.headers, request.url.query):
        session = state.gateway.session(token)
        if session is not None:
            return session
    return None


async def _serve(request: Request) -> Response:
    session = job_session(request)
    if session is None:
        status, headers, body = await unauthorized(app_path(request.scope))
        headers["WWW-Authenticate"] = "Bearer"
    else:
        # The path as routed (request.url would cut a model's name at a decoded "#").
        path, query = app_path(request.scope), request.url.query
        path = f"{path}?{query}" if query else path
        status, headers, body = await session.handle(
            request.method, path, dict(request.headers), await request.body()
        )
    media = headers.pop("content-type", "application/json")
    return Response(body, status_code=status, headers=headers, media_type=media)


class GatewayLane:
    """The gateway's routes, served as soon as the server's guards (installed outside this
    middleware: browser, key, body size) have let a request through, without FastAPI's routing.

    Every model call of every agent comes this way, and FastAPI's way to ``_serve`` (matching
    the path against each of the app's routes in turn, then its endpoint machinery) cost about
    as much CPU as the session's own work on a call. A request of a gateway route's path and
    method is what FastAPI routes to ``_serve`` (no other route takes those paths): it is
    answered here by ``_serve`` as it is there; any other request (another method, a path with
    a trailing slash) goes on to FastAPI, which answers it as before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            route = ROUTES.get(route_of(app_path(scope)))
            if route is not None and route[0] == scope["method"]:
                response = await _serve(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# With `stream: true` the answer is that object as the API's server-sent events, sent at once.
EVENTS = {"text/event-stream": {"schema": {"type": "string"}}}
_DOC = "OpenAI-compatible, for agent programs: authenticated by the job's token."
for path, summary, answer in [
    ("/v1/chat/completions", "Chat completions", ChatCompletion),
    ("/v1/responses", "Responses", ResponseObject),
]:
    ok = {
        "model": answer,
        "description": "The answer; with `stream: true`, as the API's server-sent events.",
        "content": EVENTS,
    }
    router.add_api_route(
        path,
        _serve,
        methods=["POST"],
        summary=summary,
        description=_DOC,
        responses={200: ok, **POST_ERRORS},
    )
_ANTHROPIC_DOC = "Anthropic-compatible, for agent programs: authenticated by the job's token."
_MESSAGE = {
    "model": AnthropicMessage,
    "description": "The answer; with `stream: true`, as the API's server-sent events.",
    "content": EVENTS,
}
_COUNT = {"model": TokensCount, "description": "The rendered prompt's length in tokens."}
for path, summary, responses in [
    ("/v1/messages", "Messages", {200: _MESSAGE, **MESSAGES_ERRORS}),
    ("/v1/messages/count_tokens", "Count tokens", {200: _COUNT, **COUNT_ERRORS}),
]:
    router.add_api_route(
        path,
        _serve,
        methods=["POST"],
        summary=summary,
        description=_ANTHROPIC_DOC,
        responses=responses,
    )
router.add_api_route(
    "/v1/models",
    _serve,
    methods=["GET"],
    summary="Models",
    description=_DOC,
    responses={401: UNAUTHORIZED},
)


# Documented, not declared: FastAPI would check them (a 422), and the session reads them itself.
_GEMINI_PARAMETERS = [
    {
        "name": "model",
        "in": "path",
        "required": True,
        # A "/" would be another path, and a "?" (sent as %3F) the start of a query.
        "schema": {"type": "string", "pattern": "^[^/?]+$"},
        "description": "Any model's name: the gateway answers with the job's.",
    },
    {
        "name": "key",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "The job's token, where no header carries it.",
    },
    {
        "name": "alt",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "`sse`, as the SDK sends it (the stream is server-sent events anyway).",
    },
]
_GEMINI_DOC = "Gemini-compatible, for agent programs: authenticated by the job's token."
_CONTENT: dict[str, Any] = {"model": GenerateContentResponse, "description": "The answer."}
_STREAMED: dict[str, Any] = {
    "description": "The answer as one server-sent event: `data: <a GenerateContentResponse>`.",
    "content": EVENTS,
}
_TOTAL: dict[str, Any] = {
    "model": CountTokensResponse,
    "description": "The rendered prompt's length in tokens.",
}
for method, summary, given, errors in [
    ("generateContent", "Generate content", _CONTENT, GEMINI_ERRORS),
    ("streamGenerateContent", "Stream generated content", _STREAMED, GEMINI_ERRORS),
    ("countTokens", "Count Gemini tokens", _TOTAL, GEMINI_COUNT_ERRORS),
]:
    router.add_api_route(
        f"{GEMINI}:{method}",
        _serve,
        methods=["POST"],
        summary=summary,
        description=_GEMINI_DOC,
        responses={200: given, **errors},
        openapi_extra={"parameters": _GEMINI_PARAMETERS},
        response_class=JSONResponse,
    )
