"""The header that carries a server's API key."""

from __future__ import annotations


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer KEY``, or no header at all for no key: an empty (or blank) key
    is no key, never ``Bearer `` (a header value HTTP refuses, so a request would fail)."""
    key = (api_key or "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}
