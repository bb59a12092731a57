"""The server list a deployment writes for the trainer, and reading it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from raas.helpers.files import write_atomic


class ServerListError(RuntimeError):
    pass


def write_server_list(path: Path, urls: Sequence[str]) -> None:
    """The list a deployment writes for the trainer, one ``http://host:port`` a line."""
    write_atomic(path, "".join(u.rstrip("\n") + "\n" for u in urls))


def read_server_list(path: str | Path, wait: float = 0.0, poll_s: float = 0.5) -> list[str]:
    """The URLs in ``path``; with ``wait`` > 0, wait up to that many seconds for it to appear.

    Deployments write the file in one rename once every server answers, so a file that exists
    is complete. Blank lines and ``#`` comments are skipped.
    """
    path = Path(path)
    deadline = time.monotonic() + wait
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                waited = f" after waiting {wait:g} s" if wait > 0 else ""
                raise ServerListError(f"no server list at {path}{waited}") from None
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
            continue
        urls = []
        for n, line in enumerate(text.splitlines(), 1):
            url = line.strip()
            if not url or url.startswith("#"):
                continue
            if not url.startswith(("http://", "https://")):
                raise ServerListError(f"{path}: line {n} is not an http(s) URL: {url!r}")
            urls.append(url)
        if not urls:
            raise ServerListError(f"{path} lists no servers")
        return [u.rstrip("/") for u in urls]
