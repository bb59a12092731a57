"""The trainer's client for one or many raas servers.

Jobs go to the server with the most free capacity (from ``/v1/status``: jobs in flight per RUN
worker, counting what this client sent since); a job whose instance names an image
(``raas.images.refs.image_of``: a SWE row's) goes to the least loaded of the servers whose node
already holds that image (``/v1/images``, read again when its version in the status changes),
since a server without it would fail the job. Each job keeps its server, and a server that
stops answering is set aside: its jobs are submitted again elsewhere under the same ids, so no
rollout is lost. The server a job left is still asked for it: if it comes back (restarted on the
same database, or after a network blip) with the job finished before it died, that result is
taken and the copy elsewhere cancelled, so finished work is read back rather than run again.
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

from raas.client.single_server import (
    AsyncRolloutClient,
    RaasHTTPError,
    Submission,
    server_url,
    with_job_id,
)
from raas.images.refs import stored_name_of
from raas.wire import FINAL_STATES, RolloutRequest, RolloutResult, ServiceStatus

log = logging.getLogger(__name__)


@dataclass
class Server:
    url: str
    client: AsyncRolloutClient
    status: ServiceStatus | None = None
    sent_since_status: int = 0
    down_until: float = 0.0
    last_error: Exception | None = None  # why it was last set aside
    images: frozenset[str] = frozenset()  # what its node's image store holds
    images_version: str | None = None

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
    """No server can take a job; ``errors`` holds each server's last error (by URL): a server
    that answered with an error (a 401, a 404) is not one that is down."""

    def __init__(self, message: str, errors: dict[str, Exception] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or {}


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
            Server(
                server_url(u),
                AsyncRolloutClient(
                    u, api_key=api_key, transport=transport, max_connections=max_waiting
                ),
            )
            for u in urls
        ]
        self.status_every_s = status_every_s
        self.down_for_s = down_for_s
        self._status_at = 0.0
        self._refreshing: asyncio.Future[None] | None = None
        self._where: dict[str, Server] = {}
        self._requests: dict[str, RolloutRequest] = {}
        self._left: dict[str, list[Server]] = {}  # job -> servers it moved away from
        self.read_back_every_s = 1.0
        # How long a moved job's old server is watched for, to cancel the job there once it is
        # back (a restarted server runs its unfinished jobs again).
        self.cancel_left_for_s = 600.0
        self._cancelling: set[asyncio.Task[None]] = set()
        self._gate = asyncio.Semaphore(max_waiting)

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for task in self._cancelling:
            task.cancel()
        await asyncio.gather(*self._cancelling, return_exceptions=True)
        for server in self.servers:
            await server.client.aclose()

    # -- choosing a server -----------------------------------------------------------------------

    async def refresh(self) -> None:
        """Read every server's status; callers that come while it is read share the reading."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._read_statuses())
        await asyncio.shield(self._refreshing)

    async def _read_statuses(self) -> None:
        async def one(server: Server) -> None:
            sent = server.sent_since_status  # these are in the status's in_flight
            try:
                server.status = await server.client.status()
                server.sent_since_status -= sent  # keep what was sent while it was read
                version = server.status.images_version
                if version is not None and version != server.images_version:
                    listed = await server.client.images()
                    server.images = frozenset(listed.images)
                    server.images_version = listed.version
            except (httpx.TransportError, RaasHTTPError) as e:
                self._set_aside(server, e)

        await asyncio.gather(*(one(s) for s in self.servers if s.up))
        self._status_at = time.monotonic()

    def _set_aside(self, server: Server, error: Exception) -> None:
        if server.up:
            log.warning("server %s is not answering (%s); setting it aside", server.url, error)
        server.down_until = time.monotonic() + self.down_for_s
        server.last_error = error

    async def _pick(self, exclude: set[str] | None = None, image: str | None = None) -> Server:
        """The least loaded server up; of those whose node holds ``image``, if any does."""
        await self._fresh()
        candidates = [s for s in self.servers if s.up and s.url not in (exclude or set())]
        if not candidates:
            raise ServerDown(
                "no raas server is answering: " + ", ".join(s.url for s in self.servers),
                {s.url: s.last_error for s in self.servers if s.last_error is not None},
            )
        holders = [s for s in candidates if image is not None and image in s.images]
        return min(holders or candidates, key=lambda s: s.load)

    async def _fresh(self) -> None:
        if time.monotonic() - self._status_at > self.status_every_s:
            await self.refresh()

    def _held_image(self, request: RolloutRequest) -> str | None:
        """The image the job runs in, if a server's node holds it (else placement is by load
        alone, and the jobs of any number of images go in one batch)."""
        up = [s for s in self.servers if s.up]
        if len(up) < 2:
            return None  # nothing to choose: one batch
        image = stored_name_of(request.instance)
        return image if any(image in s.images for s in up) else None

    # -- jobs ------------------------------------------------------------------------------------

    async def submit(self, request: Submission) -> str:
        """Submit one job: a RolloutRequest, its dict, or a bare instance dict."""
        (job_id,) = await self.submit_batch([request])
        return job_id

    async def submit_batch(self, submissions: Sequence[Submission]) -> list[str]:
        """Submit, every job with an id: one batch for the jobs of each image some server holds
        (to such a server), one for the rest; a server that fails is skipped for the next one.
        A branch goes to the server its job was sent to (the snapshots are there alone)."""
        requests = [with_job_id(r) for r in submissions]
        await self._fresh()
        by_image: dict[str | None, list[RolloutRequest]] = {}
        branches: dict[str, tuple[Server, list[RolloutRequest]]] = {}
        for request in requests:
            parent = self._where.get(request.branch.job_id) if request.branch else None
            if parent is not None:
                branches.setdefault(parent.url, (parent, []))[1].append(request)
            else:
                by_image.setdefault(self._held_image(request), []).append(request)
        await asyncio.gather(
            *(self._submit_to_one(i, batch) for i, batch in by_image.items()),
            *(self._send(server, batch) for server, batch in branches.values()),
        )
        return [str(r.job_id) for r in requests]

    async def _send(self, server: Server, requests: list[RolloutRequest]) -> None:
        """Submit ``requests`` to ``server``, where they must go (its error is the caller's)."""
        self._record(server, requests)
        await server.client.submit_batch(requests)

    def _record(self, server: Server, requests: list[RolloutRequest]) -> None:
        """Say where ``requests`` go, before they are sent: counted, so that concurrent
        submits spread out, and known, so that cancel() finds jobs whose answer was lost."""
        server.sent_since_status += len(requests)
        for request in requests:
            self._where[str(request.job_id)] = server
            self._requests[str(request.job_id)] = request

    async def _submit_to_one(self, image: str | None, requests: list[RolloutRequest]) -> None:
        tried: set[str] = set()
        while True:
            server = await self._pick(tried, image)
            self._record(server, requests)
            try:
                await server.client.submit_batch(requests)
            except httpx.TransportError as e:
                server.sent_since_status -= len(requests)
                self._set_aside(server, e)
                tried.add(server.url)
                continue
            return

    async def wait(self, job_id: str, poll_s: float = 30.0) -> RolloutResult:
        """The job's result; if its server stops answering, the job runs again elsewhere."""
        async with self._gate:
            while True:
                server = self._where[job_id]
                try:
                    if job_id in self._left:
                        return await self._first_of(job_id, server, poll_s)
                    return await server.client.wait(job_id, poll_s)
                except httpx.TransportError as e:
                    self._set_aside(server, e)
                    await self._move(job_id, server)

    async def _move(self, job_id: str, dead: Server) -> None:
        request = self._requests[job_id]
        new = await self._pick({dead.url}, stored_name_of(request.instance))
        log.warning("job %s moves from %s to %s", job_id, dead.url, new.url)
        await new.client.submit(request)
        new.sent_since_status += 1
        self._where[job_id] = new
        self._left.setdefault(job_id, []).append(dead)

    async def _first_of(self, job_id: str, server: Server, poll_s: float) -> RolloutResult:
        """The job's result from its new server or, first if it comes back, one it left."""
        here = asyncio.ensure_future(server.client.wait(job_id, poll_s))
        back: dict[asyncio.Future[RolloutResult | None], Server] = {
            asyncio.ensure_future(self._read_back(job_id, s, poll_s)): s for s in self._left[job_id]
        }
        pending: set[asyncio.Future[Any]] = {here, *back}
        try:
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if here in done:
                    answer = here.result()  # a TransportError moves the job once more
                    for left in self._left.pop(job_id, []):
                        self._cancel_when_back(job_id, left)
                    return answer
                for task in done:
                    result: RolloutResult | None = task.result()
                    if result is not None:
                        await self._take_back(job_id, back[task])
                        return result
        finally:
            for task in pending:
                task.cancel()

    async def _read_back(self, job_id: str, server: Server, poll_s: float) -> RolloutResult | None:
        """The job's result from a server it left, once that answers; None if it has none."""
        while True:
            try:
                status = await server.client.get(job_id, wait_s=poll_s)
            except httpx.TransportError:
                await asyncio.sleep(self.read_back_every_s)  # down: ask again until it is back
                continue
            except RaasHTTPError:
                return None
            if status.state not in FINAL_STATES or status.result is None:
                continue  # it still runs there (the server was only out of reach)
            error = status.result.error
            return None if error is not None and error.type == "server_restart" else status.result

    def _cancel_when_back(self, job_id: str, server: Server) -> None:
        """Cancel the job on a server it left, once that answers (for ``cancel_left_for_s``):
        a server restarted on its database would run it again, for nothing."""

        async def cancel() -> None:
            deadline = time.monotonic() + self.cancel_left_for_s
            while time.monotonic() < deadline:
                try:
                    await server.client.cancel(job_id)
                    return
                except httpx.TransportError:
                    await asyncio.sleep(self.read_back_every_s)
                except RaasHTTPError:
                    return  # it does not know the job (a new database): nothing runs there

        task = asyncio.ensure_future(cancel())
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)

    async def _take_back(self, job_id: str, origin: Server) -> None:
        log.warning("job %s: its result is back from %s; cancelling its copy", job_id, origin.url)
        with contextlib.suppress(httpx.TransportError, RaasHTTPError):
            await self._where[job_id].client.cancel(job_id)
        origin.down_until = 0.0
        self._where[job_id] = origin
        del self._left[job_id]

    async def cancel(self, job_id: str) -> None:
        server = self._where.get(job_id)
        if server is None:
            return
        # A server the job left may still run it (it was only out of reach): cancel it there too.
        left = [s for s in self._left.get(job_id, []) if s.up]
        for where in (server, *left):
            with contextlib.suppress(httpx.TransportError, RaasHTTPError):
                await where.client.cancel(job_id)

    async def cancel_all(self, job_ids: Sequence[str], timeout_s: float = 30.0) -> None:
        """Cancel the jobs on their servers, all at once, for ``timeout_s`` at most: every
        cancel is sent (its task started) and awaited or, past the deadline, stopped and
        awaited."""
        if not job_ids:
            return
        cancels = [asyncio.ensure_future(self.cancel(j)) for j in job_ids]
        try:
            await asyncio.wait(cancels, timeout=timeout_s)
        finally:
            for task in cancels:
                task.cancel()
            await asyncio.gather(*cancels, return_exceptions=True)

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
        """n samples of every task (different seeds when a seed is given); groups in task order.
        The n samples of a task are one group: the server sets the task up once and forks it."""
        requests, owners = [], []
        for t, task in enumerate(tasks):
            key = uuid.uuid4().hex[:12]
            for k in range(n):
                job_id = f"g-{key}-{k}"
                requests.append(
                    sample_request(task, k, sampling_params, timeout_s, job_id, f"g-{key}")
                )
                owners.append(t)
        ids = await self.submit_batch(requests)
        groups = [Group(task=dict(task)) for task in tasks]
        waits = [asyncio.ensure_future(self.wait(j)) for j in ids]
        try:
            results = await asyncio.gather(*waits)
        except BaseException:
            # Cancelled (Ctrl-C) or failed: the jobs not finished would run on for nobody.
            for wait in waits:
                wait.cancel()
            unfinished = [
                job_id
                for job_id, wait in zip(ids, waits, strict=True)
                if not wait.done() or wait.cancelled() or wait.exception() is not None
            ]
            await self.cancel_all(unfinished)
            raise
        for owner, result in zip(owners, results, strict=True):
            groups[owner].results.append(result)
        return groups


def sample_request(
    task: dict[str, Any],
    k: int,
    sampling_params: dict[str, Any] | None,
    timeout_s: float | None,
    job_id: str | None = None,
    group: str | None = None,
) -> RolloutRequest:
    """The k-th sample of a task (job id ``<group>-<k>``): seeds differ per sample; ``group``
    names the samples' group, so that the server runs the task's set-up once for all of them
    and forks it (``RolloutRequest.group``)."""
    params = dict(sampling_params or {})
    if params.get("seed") is not None:
        params["seed"] = int(params["seed"]) + k
    return RolloutRequest(
        instance=task, sampling_params=params, timeout_s=timeout_s, job_id=job_id, group=group
    )


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

    def __enter__(self) -> SyncRolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, request: Submission) -> str:
        return str(self._call(self._client.submit(request)))

    def submit_batch(self, requests: Sequence[Submission]) -> list[str]:
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
