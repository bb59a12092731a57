"""A weight sync's pause of raas's routing: every raas server's backend pool paused around it.

``POST /v1/backends:pause`` makes a server start no generation until ``POST
/v1/backends:resume``, and pause each of its inference servers through that server's own route
(vLLM's ``/pause``, SGLang's ``/pause_generation``, raas's engine), or drain it where it has
none. With ``mode="keep"`` the generations in flight wait in their servers and go on under the
new weights (each token tagged with the version that sampled it, where the server says); with
``"abort"`` the servers end them and raas resumes each from the tokens it had. Either way no
rollout fails or is cut because the weights changed::

    with backends_paused(raas_urls):
        push_new_weights_to_the_inference_servers()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import httpx

from raas.client.auth import auth_headers


def post_json(url: str, path: str, body: Any, api_key: str | None, timeout_s: float) -> Any:
    """POST ``body`` to a raas server; its JSON answer, or a RuntimeError naming the route."""
    headers = auth_headers(api_key)
    response = httpx.post(url.rstrip("/") + path, json=body, headers=headers, timeout=timeout_s)
    if response.is_error:
        raise RuntimeError(f"{url}{path}: {response.status_code} {response.text}")
    return response.json()


@contextmanager
def backends_paused(
    raas_url: str | Sequence[str],
    mode: Literal["keep", "abort"] = "keep",
    api_key: str | None = None,
    timeout_s: float = 600.0,
    resume_after_s: float = 600.0,
) -> Iterator[dict[str, dict[str, str]]]:
    """Each raas server's backend pool paused inside the block, and resumed after it whatever
    happened inside. Yields each raas server's answer: its backends' URLs, each ``"paused"``
    (through its own route) or ``"drained"``. ``timeout_s`` bounds each call (a drain waits
    for the generations in flight); ``resume_after_s``: a server resumes by itself after that
    long, should this process die inside the block."""
    urls = [raas_url] if isinstance(raas_url, str) else list(raas_url)
    body = {"mode": mode, "resume_after_s": resume_after_s}
    paused: dict[str, dict[str, str]] = {}
    try:
        for url in urls:
            paused[url] = post_json(url, "/v1/backends:pause", body, api_key, timeout_s)["backends"]
        yield paused
    finally:
        for url in urls:  # also one whose pause timed out: it stays paused until resumed
            post_json(url, "/v1/backends:resume", None, api_key, timeout_s)
