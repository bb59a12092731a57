"""Keeping the API key out of the logs: uvicorn's access log writes every query string
(``/ui?key=KEY``, or the key sent on any other path by mistake), and a message may quote it.

A filter on every handler replaces a ``key=`` (or ``api_key=``, ``token=``) query value,
whatever key it holds (a wrong one may be another server's), and the server's key itself.
"""

from __future__ import annotations

import logging
import re
from typing import Any

REDACTED = "(redacted)"
QUERY_SECRET = re.compile(r"(?<=[?&])((?:api_)?key|token)=[^&#\s\"']*", re.IGNORECASE)
# A key this short would blank letters all over the log, and guards nothing anyway.
MIN_LITERAL = 4
LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


class RedactKey(logging.Filter):
    def __init__(self, key: str | None) -> None:
        super().__init__()
        self.key = key if key is not None and len(key) >= MIN_LITERAL else None

    def redact(self, text: str) -> str:
        text = QUERY_SECRET.sub(rf"\1={REDACTED}", text)
        return text.replace(self.key, REDACTED) if self.key else text

    def _value(self, value: Any) -> Any:
        return self.redact(value) if isinstance(value, str) else value

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._value(record.msg)
        # Each argument on its own: uvicorn's access formatter unpacks them.
        if isinstance(record.args, tuple):
            record.args = tuple(self._value(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self._value(v) for k, v in record.args.items()}
        return True


def redact_logs(key: str | None) -> RedactKey:
    """Put the filter on every handler of the root logger and uvicorn's (set up by now)."""
    redactor = RedactKey(key)
    for name in LOGGERS:
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(redactor)
    return redactor
