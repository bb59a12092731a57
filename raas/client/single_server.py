"""An async client for the raas HTTP API."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from raas.client.auth import auth_headers
from raas.helpers.retries import retry_after_s, wait_retry_after
from raas.wire import (
    FINAL_STATES,
    BackendOut,
    BatchSubmitted,
    ExportedResult,
    JobStatus,
    NodeImages,
    RolloutRequest,
    RolloutResult,
    RunningJob,
    RunningPage,
    ServiceStatus,
    Submitted,
    UsageReport,
)

Submission = RolloutRequest | dict[str, Any]


# What a bare instance may set of its request: a line of tasks.jsonl with ``"timeout_s": 60``
# means the job's limit (no task reads such a field of its instance; it was dropped unsaid).
REQUEST_KEYS = frozenset(RolloutRequest.model_fields) - {"instance"}


def request_body(item: dict[str, Any]) -> dict[str, Any]:
    """A request's dict from its dict (``{"instance": ..., "job_id": ...}``), or from a bare
    instance (any other dict, as a line of tasks.jsonl may hold), whose request keys
    (``timeout_s``, ``sampling_params``, ``job_id``...) are the request's."""
    if "instance" in item:
        return item
    own = {k: v for k, v in item.items() if k in REQUEST_KEYS}
    return {"instance": {k: v for k, v in item.items() if k not in REQUEST_KEYS}, **own}


def as_request(item: Submission) -> RolloutRequest:
    """A RolloutRequest from one, or from a dict as ``request_body`` reads it."""
    if isinstance(item, RolloutRequest):
        return item
    return RolloutRequest.model_validate(request_body(item))


def with_job_id(item: Submission) -> RolloutRequest:
    """The request with a job id, so that resubmitting it (a retry) names the same job."""
    request = as_request(item)
    if request.job_id:
        return request
    return request.model_copy(update={"job_id": uuid.uuid4().hex})


class Overloaded(Exception):
    """A 429 (the server's INIT queue is full): worth retrying after ``retry_after_s``."""

    def __init__(self, response: httpx.Response, retry_after_s: float | None) -> None:
        super().__init__("the server is overloaded")
        self.response = response
        self.retry_after_s = retry_after_s


def _last_answer(state: RetryCallState) -> httpx.Response:
    """Out of patience with 429s: the last one is the answer (raised as RaasHTTPError)."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, Overloaded):
        return exc.response
    assert exc is not None
    raise exc


class RaasHTTPError(RuntimeError):
    def __init__(self, status_code: int, detail: Any, server: str | None = None) -> None:
        super().__init__(f"raas answered {status_code}: {explain(detail)}")
        self.status_code = status_code
        self.detail = detail
        self.server = server  # the base URL the client was given, when known


def explain(detail: Any) -> str:
    """A server's error detail as one readable line: a 422's first field (``jobs.0.instance.
    data_source: no task handler...``, and how many more), or the message as it is."""
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        loc = ".".join(str(x) for x in first.get("loc", []) if x != "body")
        more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
        return f"{loc}: {first.get('msg', '')}{more}"
    return str(detail)


def server_url(url: str) -> str:
    """A server's base URL, without a trailing slash. One without ``http://`` (``127.0.0.1:8002``)
    is an httpx.InvalidURL that says so here, not a server that seems down at the first call."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise httpx.InvalidURL(f"{url!r} is not a server URL: give it as http://HOST:PORT")
    return url.rstrip("/")


class AsyncRolloutClient:
    """Submit, look up, wait for and cancel rollouts on one raas server.

    A 429 (INIT queue full) is retried after the server's Retry-After, up to ``overload_wait_s``
    in all. A connection error is retried ``retries`` times with backoff: every submission
    carries a job id (one is made here when the request has none), and the server treats a
    known id as the same job, so a retried submission never runs twice. Other errors raise
    RaasHTTPError with the server's explanation.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_connections: int = 128,
        overload_wait_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        retries: int = 3,
        backoff_s: float = 0.2,
    ) -> None:
        base_url = server_url(base_url)
        headers = auth_headers(api_key)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_connections),
            transport=transport,
        )
        self.url = base_url
        self.timeout_s = timeout_s
        self.overload_wait_s = overload_wait_s
        self.retries = retries
        self.backoff_s = backoff_s

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        transport_failures = 0

        def give_up(state: RetryCallState) -> bool:
            nonlocal transport_failures
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, Overloaded):
                return (state.seconds_since_start or 0.0) >= self.overload_wait_s
            transport_failures += 1
            return transport_failures > self.retries

        retrying = AsyncRetrying(
            retry=retry_if_exception_type((httpx.TransportError, Overloaded)),
            stop=give_up,
            wait=wait_retry_after(wait_exponential(multiplier=self.backoff_s)),
            retry_error_callback=_last_answer,
            reraise=True,
        )
        response: httpx.Response = await retrying(self._send, method, path, **kwargs)
        self._raise_for(response)
        return response.json()

    def _raise_for(self, response: httpx.Response) -> None:
        """An error answer (its body read) as RaasHTTPError with the server's explanation."""
        if not response.is_error:
            return
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise RaasHTTPError(response.status_code, detail, self.url)

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._http.request(method, path, **kwargs)
        if response.status_code == 429:
            raise Overloaded(response, retry_after_s(response.headers, 1.0))
        return response

    async def submit(self, request: Submission) -> Submitted:
        body = with_job_id(request).model_dump(exclude_none=True)
        return Submitted.model_validate(await self._request("POST", "/v1/rollouts", json=body))

    async def submit_batch(self, requests: Sequence[Submission]) -> list[Submitted]:
        body = {"jobs": [with_job_id(r).model_dump(exclude_none=True) for r in requests]}
        data = await self._request("POST", "/v1/rollouts:batch", json=body)
        return BatchSubmitted.model_validate(data).jobs

    async def get(self, job_id: str, wait_s: float = 0.0) -> JobStatus:
        # The HTTP timeout must outlast the server's long-poll.
        data = await self._request(
            "GET",
            f"/v1/rollouts/{job_id}",
            params={"wait": wait_s},
            timeout=wait_s + self.timeout_s,
        )
        return JobStatus.model_validate(data)

    async def wait(self, job_id: str, poll_s: float = 60.0) -> RolloutResult:
        """Long-poll until the job has finished; returns its result."""
        while True:
            status = await self.get(job_id, wait_s=poll_s)
            if status.state in FINAL_STATES and status.result is not None:
                return status.result

    async def cancel(self, job_id: str) -> JobStatus:
        data = await self._request("POST", f"/v1/rollouts/{job_id}/cancel")
        return JobStatus.model_validate(data)

    async def status(self) -> ServiceStatus:
        return ServiceStatus.model_validate(await self._request("GET", "/v1/status"))

    async def images(self) -> NodeImages:
        """The images the image store of the server's node holds."""
        return NodeImages.model_validate(await self._request("GET", "/v1/images"))

    async def usage(self, since_s: float) -> UsageReport:
        """Each tenant's use of the server over the last ``since_s`` seconds."""
        data = await self._request("GET", "/v1/usage", params={"since_s": since_s})
        return UsageReport.model_validate(data)

    async def export(
        self,
        state: str | None = None,
        *,
        data_source: str | None = None,
        error_type: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        search: str | None = None,
    ) -> AsyncGenerator[ExportedResult, None]:
        """Every result that had finished on the server when asked (a tenant's key: its own;
        the admin's: every job's) and that the filters take (the dashboard's: its state,
        data_source, error type, reward at least and at most, ``search`` a text in its ids,
        task, error or judge's note), in finish order, read as the server streams them. Not
        retried: a connection lost midway raises (httpx.TransportError)."""
        filters = {
            "state": state,
            "data_source": data_source,
            "error_type": error_type,
            "min_reward": min_reward,
            "max_reward": max_reward,
            "q": search,
        }
        params = {"format": "jsonl", **{k: v for k, v in filters.items() if v is not None}}
        async with self._http.stream("GET", "/v1/rollouts:export", params=params) as response:
            if response.is_error:
                await response.aread()
                self._raise_for(response)
            async for line in response.aiter_lines():
                if line:
                    yield ExportedResult.model_validate_json(line)

    async def running(self) -> list[RunningJob]:
        """The server's jobs in flight, oldest first."""
        data = await self._request("GET", "/v1/rollouts:running")
        return RunningPage.model_validate(data).jobs

    async def backends(self) -> list[BackendOut]:
        """The server's LLM backends, with their health."""
        return [BackendOut.model_validate(b) for b in await self._request("GET", "/v1/backends")]
