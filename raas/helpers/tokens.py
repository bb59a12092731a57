"""The API keys and bearer tokens a request offers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs


def bearer_token(scope: Mapping[str, Any]) -> bytes | None:
    """The token of an ASGI request's ``Authorization: Bearer`` header, as the bytes sent."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = bytes(value).partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


# The headers that carry an API key as it is: Anthropic's clients', then Google's.
API_KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def api_keys_given(scope: Mapping[str, Any]) -> list[bytes]:
    """An ASGI request's keys given as they are, not as a bearer token: its ``x-api-key`` and
    ``x-goog-api-key`` headers, then its query's ``key`` (how Google's clients may send one)."""
    names = {n.encode() for n in API_KEY_HEADERS}
    out = [bytes(v).strip() for n, v in scope.get("headers", ()) if n in names]
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    return out + [k.encode() for k in query_keys(query)]


def query_keys(query: str) -> list[str]:
    """The ``key`` parameters of a query string (``key=<token>``, as Google's API takes one)."""
    return parse_qs(query, keep_blank_values=True).get("key", []) if "key=" in query else []


def offered_tokens(headers: Mapping[str, str], query: str = "") -> list[str]:
    """The tokens a request offers (header names in lower case): ``Authorization: Bearer``'s
    (OpenAI's clients, Anthropic's with an auth token), then ``x-api-key``'s (Anthropic's),
    ``x-goog-api-key``'s (Google's), and its ``query``'s ``key`` (Google's too)."""
    out = []
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        out.append(given.strip())
    out += [headers[name].strip() for name in API_KEY_HEADERS if name in headers]
    return out + query_keys(query)
