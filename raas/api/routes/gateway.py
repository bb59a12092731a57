"""The gateway's HTTP face: OpenAI's chat completions, responses and models, per job token.

An agent program raas did not write gets ``OPENAI_BASE_URL=<raas>/v1`` and
``OPENAI_API_KEY=<its job's token>``; the token picks its job's gateway session (and is let
through the server's API key for these paths only, see raas.api.auth). Everything else is the
session's: see raas.agent.gateway.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from raas.agent.gateway import GatewaySession, unauthorized
from raas.api.state import ServiceState
from raas.llm.openai_types import ChatCompletion, OpenAIErrorBody, ResponseObject

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


def job_session(request: Request) -> GatewaySession | None:
    """The session of the request's ``Authorization: Bearer <job token>``, if it is open."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    state: ServiceState | None = getattr(request.app.state, "service", None)
    if scheme.lower() != "bearer" or state is None or state.gateway is None:
        return None
    return state.gateway.session(token.strip())


async def _serve(request: Request) -> Response:
    session = job_session(request)
    if session is None:
        status, headers, body = await unauthorized()
        headers["WWW-Authenticate"] = "Bearer"
    else:
        status, headers, body = await session.handle(
            request.method, request.url.path, dict(request.headers), await request.body()
        )
    media = headers.pop("content-type", "application/json")
    return Response(body, status_code=status, headers=headers, media_type=media)


_DOC = "OpenAI-compatible, for agent programs: authenticated by the job's token."
for path, summary, answer in [
    ("/chat/completions", "Chat completions", ChatCompletion),
    ("/responses", "Responses", ResponseObject),
]:
    ok = {"model": answer, "description": "The answer (a chat completion may stream as events)."}
    router.add_api_route(
        path,
        _serve,
        methods=["POST"],
        summary=summary,
        description=_DOC,
        responses={200: ok, **POST_ERRORS},
    )
router.add_api_route(
    "/models",
    _serve,
    methods=["GET"],
    summary="Models",
    description=_DOC,
    responses={401: UNAUTHORIZED},
)
