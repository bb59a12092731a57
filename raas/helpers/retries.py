"""Retries that honour a server's ``Retry-After``."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

from tenacity import RetryCallState
from tenacity.wait import wait_base


def retry_after_s(headers: Mapping[str, str], default: float | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``default``."""
    value = headers.get("retry-after") or headers.get("Retry-After")
    if value is None:
        return default
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(when.timestamp() - time.time(), 0.0)


class wait_retry_after(wait_base):
    """Wait what the server asked for (the exception's ``retry_after_s``), else ``fallback``."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        asked = getattr(exc, "retry_after_s", None)
        if isinstance(asked, int | float):
            return float(asked)
        return float(self.fallback(retry_state))
