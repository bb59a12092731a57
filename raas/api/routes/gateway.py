"""The gateway's HTTP face: OpenAI's chat completions, responses and models, per job token.

An agent program raas did not write gets ``OPENAI_BASE_URL=<raas>/v1`` and
``OPENAI_API_KEY=<its job's token>``; the token picks its job's gateway session (and is let
through the server's API key for these paths only, see raas.api.auth). Everything else is the
session's: see raas.agent.gateway.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from raas.agent.gateway import GatewaySession, unauthorized
from raas.api.state import ServiceState

router = APIRouter(prefix="/v1", tags=["gateway"])


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
router.add_api_route(
    "/chat/completions", _serve, methods=["POST"], summary="Chat completions", description=_DOC
)
router.add_api_route("/responses", _serve, methods=["POST"], summary="Responses", description=_DOC)
router.add_api_route("/models", _serve, methods=["GET"], summary="Models", description=_DOC)
