"""The dashboard's files: hand-written HTML, JS and CSS shipped as package data (no build step,
no CDN: it works offline), and the answers that carry them.

The plots are drawn by uPlot (MIT; ``uPlot.LICENSE`` says which release and where from), its
minified file vendored unchanged: about 50 kB, no dependencies, time series on a canvas, and
nothing it does needs more than the page's policy allows (no inline script or style sheet).
"""

from __future__ import annotations

import functools
import html
from importlib import resources

from starlette.responses import HTMLResponse, Response

# Each file the page may load, and its type: nothing else under this folder is served.
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
# The page loads its own script and style and talks to its own server, nothing else.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
    " img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
LOGIN_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none';"
    " frame-ancestors 'none'"
)
HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


@functools.cache
def asset(name: str) -> bytes:
    return (resources.files(__name__) / name).read_bytes()


def page() -> Response:
    return HTMLResponse(
        asset("index.html"), headers={**HEADERS, "Content-Security-Policy": PAGE_POLICY}
    )


def login_page(wrong: bool = False) -> Response:
    """The 401 a browser gets at /ui without the key: a form that asks for it."""
    message = "That key is not the server's." if wrong else ""
    body = asset("login.html").decode().replace("{message}", html.escape(message, quote=False))
    headers = {**HEADERS, "Content-Security-Policy": LOGIN_POLICY, "WWW-Authenticate": "Bearer"}
    return HTMLResponse(body, status_code=401, headers=headers)
