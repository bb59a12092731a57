"""What a web page in a browser can make the server do: nothing, unless it is the server's own.

Any page a person opens can send requests to ``http://127.0.0.1:8000``: a form or a ``no-cors``
fetch reaches the server without the browser asking it first (a "simple" request), and DNS
rebinding (a name of the attacker's that answers with 127.0.0.1) even lets the page read the
answers, as its own origin. A server with an API key is safe from both (a page has no key, and
the dashboard's cookie opens reads only, on the server's own name); a server without one is
guarded here, the way Jupyter's and Ray's dashboards guard theirs:

- the ``Host`` of a request must name this server: ``localhost``, ``127.0.0.1``, ``::1``, the
  bound address, or a name of the ``allowed_hosts`` setting (checked without an API key only: a
  keyed server is reached by whatever name leads to it, and a rebound page has no key);
- a request that changes something (POST, PUT, PATCH, DELETE, a websocket) from a browser must
  come from the server's own pages: a browser names the page's origin in ``Origin`` (on every
  such request, and ``null`` where it hides it) and in ``Sec-Fetch-Site``, and always sends a
  ``User-Agent`` of ``Mozilla/...``, which a page cannot drop without the browser asking first;
  a request with another origin, or a browser's without any, is refused. The page's origin is
  the server's own when it is the ``Host`` the request names, or a name of ``allowed_hosts``
  (behind a proxy that sends its own ``Host``, the page's name is not the one the server sees);
- a form body (``application/x-www-form-urlencoded``, ``multipart/form-data``, ``text/plain``:
  what a page may post without asking) is no API request: a 415, but on the dashboard's sign-in
  form, which a browser posts and which is guarded by its origin like the rest.

Programs (raas's own clients, ProRL's, curl) send no ``Origin`` and no ``Sec-Fetch-*``, so they
pass as they are, ProRL's bodyless POSTs (``/start``, ``/stop``, ``/clear_llm_server``) too.
A pure ASGI middleware, first of all: nothing is read or routed before it has decided.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from raas.api.errors import app_path, not_json_message

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# What a page may send without a CORS preflight: never an API request.
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})
# Sec-Fetch-Site values of a request the server's own page (or the person) made.
OWN_SITE = frozenset({"same-origin", "none"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def host_names(names: Iterable[str]) -> frozenset[str]:
    """Names as a Host header's are compared: lower case, no brackets, no final dot."""
    return frozenset(name.strip("[]").rstrip(".").lower() for name in names if name)


def guard_policy(
    api_key: str | None, bind_host: str, allowed: Iterable[str], form_paths: Iterable[str]
) -> GuardPolicy:
    """A server with ``api_key`` answers any Host; one without answers its loopback names, the
    address it binds and the ``allowed`` names. Pages of ``allowed`` names are its own."""
    allowed = host_names(allowed)
    hosts = None if api_key else host_names([*LOOPBACK_NAMES, bind_host]) | allowed
    return GuardPolicy(hosts, allowed, frozenset(form_paths))


def host_name(authority: str) -> str | None:
    """The name of a ``Host`` header (``[::1]:8000`` is ``::1``); None if it is not one."""
    try:
        name = urlsplit("//" + authority).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def _address(authority: str, scheme: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit("//" + authority)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    return parts.hostname.rstrip("."), port if port is not None else DEFAULT_PORTS[scheme]


def same_origin(origin: str, host: str) -> bool:
    """Is the page of ``origin`` (an ``Origin`` header) on the server the request names in
    ``Host``? The scheme is left out: behind a proxy that ends TLS, the page is https and the
    server sees http."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or parts.path not in ("", "/"):
        return False
    page = _address(parts.netloc, parts.scheme)
    return page is not None and page == _address(host, parts.scheme)


@dataclass(frozen=True)
class GuardPolicy:
    hosts: frozenset[str] | None  # the Host names answered; None: any (a server with a key)
    page_names: frozenset[str] = frozenset()  # names of pages that are the server's own
    form_paths: frozenset[str] = frozenset()  # where a browser posts a form (the sign-in)


def own_page(origin: str, host: str, names: frozenset[str]) -> bool:
    if same_origin(origin, host):
        return True
    try:
        name = urlsplit(origin).hostname
    except ValueError:
        return False
    return name is not None and name.rstrip(".") in names


def refusal(scope: Scope, headers: Headers, policy: GuardPolicy) -> tuple[int, str] | None:
    """Why this request is refused (a status and one line), or None."""
    host = headers.get("host", "")
    if policy.hosts is not None and host_name(host) not in policy.hosts:
        return 403, (
            f"Host {host!r} is not a name of this server: without an API key it answers to"
            f" {', '.join(sorted(policy.hosts))} (more: the allowed_hosts setting,"
            " --allowed-hosts)"
        )
    websocket = scope["type"] == "websocket"
    if not websocket and scope.get("method") not in UNSAFE_METHODS:
        return None
    origin = headers.get("origin")
    site = headers.get("sec-fetch-site")
    browser = (
        origin is not None
        or site is not None
        or headers.get("user-agent", "").startswith("Mozilla/")
    )
    if browser and (
        origin is None
        or not own_page(origin, host, policy.page_names)
        or site not in (None, *OWN_SITE)
    ):
        return 403, (
            f"a request from another web page is refused (Origin {origin or 'not sent'}, this"
            f" server {host}): a program sends no Origin, Sec-Fetch-* or Mozilla/ User-Agent;"
            " a page must be this server's own"
        )
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if not websocket and media in FORM_TYPES and app_path(scope) not in policy.form_paths:
        return 415, not_json_message(headers.get("content-type", ""))
    return None


class BrowserGuardMiddleware:
    def __init__(self, app: ASGIApp, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = refusal(scope, Headers(scope=scope), self.policy)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message = refused
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
            return
        await JSONResponse({"detail": message}, status_code=status)(scope, receive, send)
