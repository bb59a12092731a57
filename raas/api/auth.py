"""Optional bearer-token auth: when an API key is set, every path but /healthz needs it.

The gateway's paths (``job_path``) also take a job's own token (what its agent program gets as
OPENAI_API_KEY), as a bearer token or, as Anthropic's and Google's clients send a key,
``x-api-key``, ``x-goog-api-key`` or the query's ``key``; a job token opens no other path.

With a tenants file (raas.tenants) a tenant's key opens the same paths as the API key, and the
request's ``Caller`` (raas.api.tenants) says which tenant it is, for the routes to show it only
its own jobs; the API key is the admin's, who sees all.

A browser cannot send the header on a page load, so the dashboard (/ui) has a session cookie:
given the key once (the login form's POST /ui/login, or ``/ui?key=KEY``), the server sets
``raas_ui``, HttpOnly and SameSite=Strict, holding a digest of the key (never the key itself;
changing the key ends every session; a tenant's is keyed by the API key too, so that the
digests in the tenants file, which need not be secret, cannot make one). The cookie opens GET
and HEAD only, so a page elsewhere can make the browser change nothing (and SameSite=Strict keeps
it off cross-site requests).

A pure ASGI middleware, so the key is checked before anything else happens: before a body is
read or parsed, before routing (an unknown path without the key is a 401, not a 404), and on
FastAPI's own pages (/docs, /redoc, /openapi.json) as on the routes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from raas.agent.gateway import error_answer
from raas.api.errors import app_path
from raas.api.tenants import ADMIN, NOBODY, SCOPE_KEY, Caller
from raas.api.ui import login_page
from raas.helpers.tokens import api_keys_given, bearer_token
from raas.llm.openai_types import OpenAIError
from raas.tenants import Tenants, key_digest

UI_PATH = "/ui"
LOGIN_PATH = "/ui/login"  # checks the key itself (raas.api.routes.dashboard)
OPEN_PATHS = frozenset({"/healthz", LOGIN_PATH})
UNAUTHORIZED = "missing or wrong API key: send 'Authorization: Bearer <key>'"
COOKIE = "raas_ui"
COOKIE_METHODS = frozenset({"GET", "HEAD"})
JOB_UNAUTHORIZED = "unknown or closed job token: send 'Authorization: Bearer <job token>'"


def session_token(api_key: bytes) -> bytes:
    """The dashboard cookie's value for ``api_key``: a digest, so the cookie does not hold the
    key (which also opens the routes that change things)."""
    return hmac.new(api_key, b"raas dashboard session v1", hashlib.sha256).hexdigest().encode()


def tenant_session_token(api_key: bytes, digest: str) -> bytes:
    """The dashboard cookie's value for the tenant key of ``digest``: keyed by the server's own
    key, as the digests are no secret."""
    message = b"raas dashboard tenant session v1:" + digest.encode()
    return hmac.new(api_key, message, hashlib.sha256).hexdigest().encode()


def cookie_token(scope: Scope) -> bytes | None:
    """The value of the request's ``raas_ui`` cookie."""
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            try:
                morsel = SimpleCookie(bytes(value).decode("latin-1")).get(COOKIE)
            except CookieError:
                continue
            if morsel is not None:
                return morsel.value.encode("latin-1")
    return None


def logged_in(token: bytes, scope: Scope, root: str) -> Response:
    """Where a right key given to the dashboard leads: the page, with the session cookie
    ``token`` (``session_token``'s or ``tenant_session_token``'s)."""
    response = RedirectResponse(root + UI_PATH, status_code=303)
    response.set_cookie(
        COOKIE,
        token.decode(),
        path=root or "/",
        httponly=True,
        samesite="strict",
        secure=scope.get("scheme") == "https",
    )
    return response


def session_cookie(key: bytes, api_key: bytes, tenants: Tenants | None) -> bytes | None:
    """The dashboard's session cookie for ``key`` (the API key, or a tenant's), or None when
    the key is nobody's."""
    if secrets.compare_digest(key, api_key):
        return session_token(api_key)
    if tenants is None or tenants.of_key(key) is None:
        return None
    return tenant_session_token(api_key, key_digest(key))


def _query_key(scope: Scope) -> bytes | None:
    """``key`` of the query string; the query is then blanked in ``scope``, so that uvicorn's
    access log (which reads it after the answer) does not write the key down."""
    query: bytes = scope.get("query_string", b"")
    if b"key=" not in query:
        return None
    keys = parse_qs(query.decode("latin-1"), keep_blank_values=True).get("key")
    if not keys:
        return None
    scope["query_string"] = b"key=(redacted)"
    # parse_qs decodes %-escapes as UTF-8: the key is compared as its UTF-8 bytes (latin-1
    # cannot encode what a %F3%90%B5%86 decodes to: a 500 where a 401 is due).
    return keys[0].encode()


class ApiKeyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        job_path: Callable[[str], bool] = lambda _: False,
        job_token: Callable[[bytes], bool] | None = None,
        tenants: Callable[[], Tenants | None] = lambda: None,
    ) -> None:
        self.app = app
        # The gateway's paths also take a job's own token (an agent's OPENAI_API_KEY), and
        # only those paths: a job token opens nothing else.
        self.job_path = job_path
        self.job_token = job_token
        # Compared as bytes: a header may hold any byte, and compare_digest refuses a str
        # that is not ASCII (a 500 where a 401 is due).
        self.expected = api_key.encode() if api_key else None
        self.session = session_token(self.expected) if self.expected else None
        self.tenants = tenants  # as last read (the file may change while the server runs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = app_path(scope)
        root = scope.get("root_path", "")
        token = bearer_token(scope)
        given = _query_key(scope) if path == UI_PATH and scope["type"] == "http" else None
        tenants = self.tenants()
        cookie = session_cookie(given, self.expected, tenants) if given is not None else None
        if cookie is not None:
            await logged_in(cookie, scope, root)(scope, receive, send)
            return
        who = self._caller(token, tenants) if token is not None else None
        if who is None:
            who = self._session(scope, tenants)
        if who is not None:
            scope[SCOPE_KEY] = who
            await self.app(scope, receive, send)
            return
        if path in OPEN_PATHS or self._job(path, scope, token):
            scope[SCOPE_KEY] = NOBODY
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": UNAUTHORIZED})
            return
        if path == UI_PATH:
            await login_page(wrong=given is not None)(scope, receive, send)
            return
        status, body = 401, {"detail": UNAUTHORIZED}
        if self.job_path(path):  # an API's clients read its own error shape
            kind, code = "authentication_error", "invalid_api_key"
            status, body = error_answer(path, OpenAIError(401, JOB_UNAUTHORIZED, None, kind, code))
        response = JSONResponse(body, status_code=status, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _job(self, path: str, scope: Scope, bearer: bytes | None) -> bool:
        """Does a gateway path carry a job's token (a bearer token, ``x-api-key``,
        ``x-goog-api-key`` or the query's ``key``)?"""
        if self.job_token is None or not self.job_path(path):
            return False
        return any(t is not None and self.job_token(t) for t in (bearer, *api_keys_given(scope)))

    def _caller(self, key: bytes, tenants: Tenants | None) -> Caller | None:
        """Whose key ``key`` is: the admin's, a tenant's, or nobody's (None)."""
        assert self.expected is not None
        if secrets.compare_digest(key, self.expected):
            return ADMIN
        tenant = tenants.of_key(key) if tenants is not None else None
        return Caller(tenant.name) if tenant is not None else None

    def _session(self, scope: Scope, tenants: Tenants | None) -> Caller | None:
        """Whose dashboard session cookie a reading request (GET, HEAD) carries, if any."""
        if self.session is None or scope.get("method") not in COOKIE_METHODS:
            return None
        cookie = cookie_token(scope)
        if cookie is None:
            return None
        if secrets.compare_digest(cookie, self.session):
            return ADMIN
        assert self.expected is not None
        found = None
        for digest, tenant in tenants.digests() if tenants is not None else ():
            if hmac.compare_digest(cookie, tenant_session_token(self.expected, digest)):
                found = Caller(tenant.name)
        return found
