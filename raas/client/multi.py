"""The trainer's client for one or many raas servers.

Jobs go to the server with the most free capacity (from ``/v1/status``: jobs in flight per RUN
worker, counting what this client sent since), each job keeps its server, and a server that
stops answering is set aside: its unfinished jobs are submitted again elsewhere under the same
ids, so no rollout is lost or run twice by this client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from raas.api.schemas import RolloutRequest, RolloutResult, ServiceStatus
from raas.client.http import AsyncRolloutClient, RaasHTTPError, with_job_id

log = logging.getLogger(__name__)


@dataclass
class Server:
    url: str
    client: AsyncRolloutClient
    status: ServiceStatus | None = None
    sent_since_status: int = 0
    down_until: float = 0.0

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until

    @property
    def load(self) -> float:
        if self.status is None:
            return float(self.sent_since_status)
        workers = max(self.status.stages["run"].workers, 1)
        return (self.status.in_flight + self.sent_since_status) / workers


@dataclass
class Group:
    """The n samples of one task."""

    task: dict[str, Any]
    results: list[RolloutResult] = field(default_factory=list)
    policy_version: int | None = None

    @property
    def rewards(self) -> list[float]:
        return [r.reward if r.reward is not None else 0.0 for r in self.results]


class ServerDown(Exception):
    pass


class RolloutClient:
    """Async client over one or more servers (``servers``: a URL or a list of URLs)."""

    def __init__(
        self,
        servers: str | Sequence[str],
        api_key: str | None = None,
        status_every_s: float = 1.0,
        down_for_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_waiting: int = 256,
    ) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls:
            raise ValueError("give at least one server URL")
        self.servers = [
            Server(u.rstrip("/"), AsyncRolloutClient(u, api_key=api_key, transport=transport,
                                                     max_connections=max_waiting))
            for u in urls
        ]  # fmt: skip
        self.status_every_s = status_every_s
        self.down_for_s = down_for_s
        self._status_at = 0.0
        self._where: dict[str, Server] = {}
        self._requests: dict[str, RolloutRequest] = {}
        self._gate = asyncio.Semaphore(max_waiting)

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for server in self.servers:
            await server.client.aclose()

    # -- choosing a server -----------------------------------------------------------------------

    async def refresh(self) -> None:
        async def one(server: Server) -> None:
            try:
                server.status = await server.client.status()
                server.sent_since_status = 0
            except (httpx.TransportError, RaasHTTPError) as e:
                self._set_aside(server, e)

        await asyncio.gather(*(one(s) for s in self.servers if s.up))
        self._status_at = time.monotonic()

    def _set_aside(self, server: Server, error: Exception) -> None:
        if server.up:
            log.warning("server %s is not answering (%s); setting it aside", server.url, error)
        server.down_until = time.monotonic() + self.down_for_s

    async def _pick(self, exclude: set[str] | None = None) -> Server:
        if time.monotonic() - self._status_at > self.status_every_s:
            await self.refresh()
        candidates = [s for s in self.servers if s.up and s.url not in (exclude or set())]
        if not candidates:
            raise ServerDown(
                "no raas server is answering: " + ", ".join(s.url for s in self.servers)
            )
        return min(candidates, key=lambda s: s.load)

    # -- jobs ------------------------------------------------------------------------------------

    async def submit(self, request: RolloutRequest) -> str:
        (job_id,) = await self.submit_batch([request])
        return job_id

    async def submit_batch(self, requests: Sequence[RolloutRequest]) -> list[str]:
        """Submit, every job with an id; a server that fails is skipped for the next one."""
        requests = [with_job_id(r) for r in requests]
        tried: set[str] = set()
        while True:
            server = await self._pick(tried)
            try:
                await server.client.submit_batch(requests)
            except httpx.TransportError as e:
                self._set_aside(server, e)
                tried.add(server.url)
                continue
            server.sent_since_status += len(requests)
            ids = [str(r.job_id) for r in requests]
            for job_id, request in zip(ids, requests, strict=True):
                self._where[job_id] = server
                self._requests[job_id] = request
            return ids

    async def wait(self, job_id: str, poll_s: float = 30.0) -> RolloutResult:
        """The job's result; if its server stops answering, the job runs again elsewhere."""
        async with self._gate:
            while True:
                server = self._where[job_id]
                try:
                    return await server.client.wait(job_id, poll_s)
                except httpx.TransportError as e:
                    self._set_aside(server, e)
                    await self._move(job_id, server)

    async def _move(self, job_id: str, dead: Server) -> None:
        request = self._requests[job_id]
        new = await self._pick({dead.url})
        log.warning("job %s moves from %s to %s", job_id, dead.url, new.url)
        await new.client.submit(request)
        new.sent_since_status += 1
        self._where[job_id] = new

    async def cancel(self, job_id: str) -> None:
        server = self._where.get(job_id)
        if server is None:
            return
        with contextlib.suppress(httpx.TransportError, RaasHTTPError):
            await server.client.cancel(job_id)

    async def as_completed(self, job_ids: Sequence[str]) -> AsyncIterator[RolloutResult]:
        """Results in the order they finish."""
        queue: asyncio.Queue[RolloutResult | BaseException] = asyncio.Queue()

        async def collect(job_id: str) -> None:
            try:
                queue.put_nowait(await self.wait(job_id))
            except Exception as e:
                queue.put_nowait(e)

        tasks = [asyncio.create_task(collect(j)) for j in job_ids]
        try:
            for _ in job_ids:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in tasks:
                task.cancel()

    async def generate_groups(
        self,
        tasks: Sequence[dict[str, Any]],
        n: int,
        sampling_params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[Group]:
        """n samples of every task (different seeds when a seed is given); groups in task order."""
        requests, owners = [], []
        for t, task in enumerate(tasks):
            key = uuid.uuid4().hex[:12]
            for k in range(n):
                requests.append(sample_request(task, k, sampling_params, timeout_s, f"g-{key}-{k}"))
                owners.append(t)
        ids = await self.submit_batch(requests)
        groups = [Group(task=dict(task)) for task in tasks]
        results = await asyncio.gather(*(self.wait(j) for j in ids))
        for owner, result in zip(owners, results, strict=True):
            groups[owner].results.append(result)
        return groups


def sample_request(
    task: dict[str, Any],
    k: int,
    sampling_params: dict[str, Any] | None,
    timeout_s: float | None,
    job_id: str | None = None,
) -> RolloutRequest:
    """The k-th sample of a task (job id ``<group>-<k>``): seeds differ per sample."""
    params = dict(sampling_params or {})
    if params.get("seed") is not None:
        params["seed"] = int(params["seed"]) + k
    return RolloutRequest(instance=task, sampling_params=params, timeout_s=timeout_s, job_id=job_id)


class SyncRolloutClient:
    """The same client for code that is not async (its own event loop on a thread)."""

    def __init__(self, servers: str | Sequence[str], **kwargs: Any) -> None:
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = self._call(_make(servers, kwargs))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, request: RolloutRequest) -> str:
        return str(self._call(self._client.submit(request)))

    def submit_batch(self, requests: Sequence[RolloutRequest]) -> list[str]:
        return list(self._call(self._client.submit_batch(requests)))

    def wait(self, job_id: str) -> RolloutResult:
        result: RolloutResult = self._call(self._client.wait(job_id))
        return result

    def cancel(self, job_id: str) -> None:
        self._call(self._client.cancel(job_id))

    def generate_groups(
        self, tasks: Sequence[dict[str, Any]], n: int, **kwargs: Any
    ) -> list[Group]:
        return list(self._call(self._client.generate_groups(tasks, n, **kwargs)))

    def close(self) -> None:
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def _make(servers: str | Sequence[str], kwargs: dict[str, Any]) -> RolloutClient:
    return RolloutClient(servers, **kwargs)
