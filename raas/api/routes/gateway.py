"""The gateway's HTTP face: OpenAI's chat completions, responses and models, and Anthropic's
messages, per job token.

An agent program raas did not write gets ``OPENAI_BASE_URL=<raas>/v1`` and
``OPENAI_API_KEY=<its job's token>`` (or ``ANTHROPIC_BASE_URL=<raas>`` and
``ANTHROPIC_API_KEY``/``ANTHROPIC_AUTH_TOKEN``); the token picks its job's gateway session (and is
let through the server's API key for these paths only, see raas.api.auth). Everything else is the
session's: see raas.agent.gateway.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from raas.agent.gateway import GatewaySession, unauthorized
from raas.api.state import ServiceState
from raas.helpers import offered_tokens
from raas.llm.anthropic_messages import AnthropicErrorBody, AnthropicMessage, TokensCount
from raas.llm.openai_responses import ResponseObject
from raas.llm.openai_types import ChatCompletion, OpenAIErrorBody

router = APIRouter(prefix="/v1", tags=["gateway"])


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


def job_session(request: Request) -> GatewaySession | None:
    """The open session of the request's job token (``Authorization: Bearer`` or
    ``x-api-key``), if any."""
    state: ServiceState | None = getattr(request.app.state, "service", None)
    if state is None or state.gateway is None:
        return None
    for token in offered_tokens(request.headers):
        session = state.gateway.session(token)
        if session is not None:
            return session
    return None


async def _serve(request: Request) -> Response:
    session = job_session(request)
    if session is None:
        status, headers, body = await unauthorized(request.url.path)
        headers["WWW-Authenticate"] = "Bearer"
    else:
        status, headers, body = await session.handle(
            request.method, request.url.path, dict(request.headers), await request.body()
        )
    media = headers.pop("content-type", "application/json")
    return Response(body, status_code=status, headers=headers, media_type=media)


# With `stream: true` the answer is that object as the API's server-sent events, sent at once.
EVENTS = {"text/event-stream": {"schema": {"type": "string"}}}
_DOC = "OpenAI-compatible, for agent programs: authenticated by the job's token."
for path, summary, answer in [
    ("/chat/completions", "Chat completions", ChatCompletion),
    ("/responses", "Responses", ResponseObject),
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
    ("/messages", "Messages", {200: _MESSAGE, **MESSAGES_ERRORS}),
    ("/messages/count_tokens", "Count tokens", {200: _COUNT, **COUNT_ERRORS}),
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
    "/models",
    _serve,
    methods=["GET"],
    summary="Models",
    description=_DOC,
    responses={401: UNAUTHORIZED},
)
