"""The backend pool: least-loaded assignment, sticky sessions, health, retries and failover.

A session (one job) is pinned to one backend for all its turns, so the backend's prefix cache
holds the conversation so far. New sessions go to the backend with the lowest current load
(sessions pinned / declared capacity), found with a min-heap whose stale entries are skipped;
ties go to the backend added earlier, so a backend that joins takes its share without being
flooded. Requests are token-in/token-out and stateless on the server side, so a session whose
backend dies moves to another and goes on with the same tokens; the move is recorded.

A weight sync is one pause of the whole pool (:meth:`BackendPool.pause`, then
:meth:`BackendPool.resume`): no request starts meanwhile (each waits for the resume), and each
backend is paused through its own route (``mode`` ``keep``: the generations in flight wait there
and go on under the new weights; ``abort``: they come back with the tokens so far), or, where it
has none, drained (the pool waits for its requests in flight to finish). A generation a backend
aborted, in a pause or not, is resumed from its prefix (the prompt and the tokens so far) once the
pool is open again, and its caller gets one generation of all the tokens: no turn fails or is cut
because the weights changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from raas.helpers.retries import wait_retry_after
from raas.llm.clients import LLMClient, PauseMode, base_url, make_client
from raas.llm.types import (
    STALL_TIMEOUT_S,
    BackendError,
    Generation,
    Heard,
    LiveCall,
    NoBackendAvailable,
    SamplingParams,
)

log = logging.getLogger(__name__)


@dataclass
class Backend:
    id: str
    url: str
    protocol: str
    capacity: int
    client: LLMClient
    order: int
    model: str | None = None
    healthy: bool = True
    sessions: int = 0
    requests: int = 0
    failures: int = 0
    missed_checks: int = 0
    last_error: str | None = None
    in_flight: int = 0  # requests sent and not answered
    # When it last sent anything to any session (an answer, a streamed token): see LiveCall.
    heard: Heard = field(default_factory=Heard)
    paused: bool = False  # paused through its own route by the pool's pause

    @property
    def load(self) -> float:
        return self.sessions / self.capacity


@dataclass
class Move:
    session: str
    from_backend: str
    to_backend: str
    reason: str


@dataclass
class PoolConfig:
    retries: int = 2  # on the same backend, for transient errors
    backoff_s: float = 0.2
    health_interval_s: float = 5.0
    # A busy backend can miss one check: it is taken out after this many misses in a row.
    misses_to_down: int = 2
    moves_per_request: int = 3
    moves_kept: int = 1000
    # Whether vllm-protocol servers are asked to stream, and how long a stream may send nothing
    # before it has stalled (raas.llm.clients).
    stream: bool = True
    stall_timeout_s: float = STALL_TIMEOUT_S
    # A generation aborted more often than this (by servers pausing, or anything else) fails.
    resumes_per_request: int = 8
    # How long a pause waits for a backend without a pause route to finish its requests.
    drain_timeout_s: float = 600.0


def _unknown_vocabulary() -> int | None:
    return None


def usable_url(address: str) -> str:
    """``address`` as a backend's base URL; a ValueError if the HTTP client cannot use it (such
    a backend would fail every request and every health check)."""
    url = base_url(address)
    try:
        host = httpx.URL(url).host
    except Exception as e:  # httpx.InvalidURL, or the idna package's own errors
        raise ValueError(f"not a usable URL: {e}") from None
    if not host:
        raise ValueError("not a usable URL: it has no host")
    return url


class NotInferenceServer(ValueError):
    """A backend's URL answers, but not as an inference server (a raas server, say)."""


async def not_inference_server(
    address: str, protocol: str = "vllm", model: str | None = None
) -> str | None:
    """Why ``address`` is no inference server, in one line, where its answers say so (see
    LLMClient.not_inference_server); None otherwise. A ValueError for a URL or protocol that
    cannot be used."""
    client = make_client(protocol, usable_url(address), model)
    try:
        return await client.not_inference_server()
    finally:
        await client.aclose()


class BackendPool:
    def __init__(
        self,
        config: PoolConfig | None = None,
        vocab_size: Callable[[], int | None] = _unknown_vocabulary,
    ) -> None:
        """``vocab_size()``: the served model's tokenizer size where it is known now (token ids
        a backend answers must be below it), None where not; asked on every request, so that a
        tokenizer loaded after the pool was made is used from then on."""
        self.config = config or PoolConfig()
        self.vocab_size = vocab_size
        self._backends: dict[str, Backend] = {}
        self._heap: list[tuple[float, int, int, str]] = []
        self._versions: dict[str, int] = {}
        self._order = itertools.count()
        self._pinned: dict[str, str] = {}
        self._live: dict[str, LiveCall] = {}  # each session's model call in flight
        # Each session's last token, and how many of its calls are in flight (overlapping).
        self._heard: dict[str, tuple[Heard, int]] = {}
        # The latest moves, for inspection; bounded, as a long-lived service makes many.
        self.moves: deque[Move] = deque(maxlen=self.config.moves_kept)
        self._health_task: asyncio.Task[None] | None = None
        # Set while requests may start (cleared by pause); made on first use, on the loop that
        # uses it. A condition told of every answer, for draining.
        self._open_event: asyncio.Event | None = None
        self._answered_cond: asyncio.Condition | None = None
        self._pauses = 0  # pauses not yet resumed (nested pauses resume at the last)
        self._auto_resume: asyncio.Task[None] | None = None

    # -- registry ----------------------------------------------------------------------------

    def add(
        self, address: str, protocol: str = "vllm", capacity: int = 8, model: str | None = None
    ) -> Backend:
        """Register a backend; the same URL again returns the one already there.

        A ValueError if ``address`` is no URL the HTTP client can use: such a backend would
        fail every request and every health check.
        """
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        url = usable_url(address)
        for backend in self._backends.values():
            if backend.url == url:
                return backend
        client = make_client(protocol, url, model, self.config.stall_timeout_s, self.config.stream)
        backend = Backend(
            uuid.uuid4().hex[:8], url, protocol, capacity, client, next(self._order), model
        )
        self._backends[backend.id] = backend
        self._push(backend)
        log.info("backend %s added: %s (%s, capacity %d)", backend.id, url, protocol, capacity)
        return backend

    async def add_checked(
        self, address: str, protocol: str = "vllm", capacity: int = 8, model: str | None = None
    ) -> Backend:
        """:meth:`add`, but a URL whose answers say it is no inference server (a raas server;
        see LLMClient.not_inference_server) is a ValueError saying what it is, and not added."""
        url = usable_url(address)
        if all(b.url != url for b in self._backends.values()):  # asked before a job may use it
            why = await not_inference_server(url, protocol, model)
            if why is not None:
                raise NotInferenceServer(why)
        return self.add(address, protocol, capacity, model)

    async def remove(self, backend_id: str) -> bool:
        backend = self._backends.pop(backend_id, None)
        if backend is None:
            return False
        self._versions.pop(backend_id, None)
        # Sessions pinned to it move on their next request.
        await backend.client.aclose()
        return True

    async def clear(self) -> None:
        for backend_id in list(self._backends):
            await self.remove(backend_id)

    def backends(self) -> list[Backend]:
        return sorted(self._backends.values(), key=lambda b: b.order)

    def get(self, backend_id: str) -> Backend | None:
        return self._backends.get(backend_id)

    # -- assignment ---------------------------------------------------------------------------

    def _push(self, backend: Backend) -> None:
        version = self._versions.get(backend.id, 0) + 1
        self._versions[backend.id] = version
        heapq.heappush(self._heap, (backend.load, backend.order, version, backend.id))

    def _least_loaded(self, exclude: set[str]) -> Backend | None:
        skipped = []
        chosen = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            _, _, version, backend_id = entry
            backend = self._backends.get(backend_id)
            if backend is None or self._versions.get(backend_id) != version:
                continue  # stale
            if not backend.healthy or backend_id in exclude:
                skipped.append(entry)
                continue
            chosen = backend
            skipped.append(entry)
            break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return chosen

    def _pin(self, session: str, backend: Backend) -> None:
        self._pinned[session] = backend.id
        backend.sessions += 1
        self._push(backend)

    def _unpin(self, session: str) -> None:
        backend_id = self._pinned.pop(session, None)
        backend = self._backends.get(backend_id) if backend_id else None
        if backend is not None:
            backend.sessions -= 1
            self._push(backend)

    def backend_for(self, session: str, exclude: set[str] | None = None) -> Backend:
        """The session's backend: its pinned one while healthy, else the least loaded."""
        exclude = exclude or set()
        pinned = self._backends.get(self._pinned.get(session, ""))
        if pinned is not None and pinned.healthy and pinned.id not in exclude:
            return pinned
        backend = self._least_loaded(exclude)
        if backend is None:
            raise NoBackendAvailable(self._down_message())
        if pinned is not None or session in self._pinned:
            self._unpin(session)
        self._pin(session, backend)
        return backend

    def release(self, session: str) -> None:
        """The session is over: its backend's load goes down."""
        self._unpin(session)

    def _down_message(self) -> str:
        if not self._backends:
            return "no LLM backend is registered (POST /v1/backends or /add_llm_server)"
        states = ", ".join(
            f"{b.url} ({'healthy' if b.healthy else 'down'}: {b.last_error or 'no error recorded'})"
            for b in self.backends()
        )
        return f"every LLM backend is down or failed this request: {states}"

    # -- generation ---------------------------------------------------------------------------

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation:
        """Generate on the session's backend (retried, then moved to another if it fails); a
        generation a backend aborts goes on from its prefix, and comes back whole."""
        heard, overlapping = self._heard.get(session, (Heard(), 0))
        self._heard[session] = (heard, overlapping + 1)
        live = self._live[session] = LiveCall("", time.monotonic(), heard=heard)
        try:
            generation = await self._generate_parts(session, prompt_ids, params, live)
            if not live.streaming:  # a whole answer's tokens came as it did
                live.count(len(generation.token_ids))
            return generation
        finally:
            if self._live.get(session) is live:  # (a gateway's calls may overlap)
                del self._live[session]
            heard, overlapping = self._heard[session]
            if overlapping == 1:
                del self._heard[session]
            else:
                self._heard[session] = (heard, overlapping - 1)

    def live_call(self, session: str) -> LiveCall | None:
        """The session's model call in flight: its backend, since when, the tokens so far."""
        return self._live.get(session)

    async def _generate_parts(
        self, session: str, prompt_ids: list[int], params: SamplingParams, live: LiveCall
    ) -> Generation:
        parts: list[Generation] = []
        done: list[int] = []
        for _ in range(self.config.resumes_per_request + 1):
            left = params
            if done:  # (the usual first try copies nothing: this runs on every turn)
                left = params.model_copy(update={"max_tokens": params.max_tokens - len(done)})
            part = await self._generate_once(session, prompt_ids + done, left, live)
            parts.append(part)
            done += part.token_ids
            if part.finish_reason != "abort":
                return _joined(parts, part.finish_reason)
            if len(done) >= params.max_tokens:
                return _joined(parts, "length")
            log.info(
                "session %s: generation aborted by %s after %d tokens; resuming from its prefix",
                session,
                part.backend,
                len(done),
            )
        raise BackendError(
            parts[-1].backend,
            f"the generation was aborted {len(parts)} times",
            transient=False,
        )

    async def _generate_once(
        self, session: str, prompt_ids: list[int], params: SamplingParams, live: LiveCall
    ) -> Generation:
        tried: set[str] = set()
        for _ in range(self.config.moves_per_request + 1):
            await self._opened()
            backend = self.backend_for(session, exclude=tried)
            try:
                return await self._on(backend, prompt_ids, params, live)
            except BackendError as e:
                if not e.transient:
                    raise
                tried.add(backend.id)
                backend.healthy = False  # the health check brings it back
                self._push(backend)
                nxt = self._least_loaded(tried)
                if nxt is None:
                    break
                self.moves.append(Move(session, backend.url, nxt.url, str(e)))
                log.warning("session %s moves from %s to %s: %s", session, backend.url, nxt.url, e)
        raise NoBackendAvailable(self._down_message())

    async def _on(
        self, backend: Backend, prompt_ids: list[int], params: SamplingParams, live: LiveCall
    ) -> Generation:
        # The first try goes straight through: it nearly always succeeds, and tenacity's
        # bookkeeping costs about 45 us a call, on every turn of every rollout.
        try:
            return await self._request(backend, prompt_ids, params, live)
        except BackendError as e:
            if not e.transient or self.config.retries == 0:
                raise
            first = e
        backoff = self.config.backoff_s
        await asyncio.sleep(backoff if first.retry_after_s is None else first.retry_after_s)
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, BackendError) and e.transient),
            stop=stop_after_attempt(self.config.retries),
            # Doubling from the second retry on (the first waited ``backoff`` above).
            wait=wait_retry_after(wait_exponential(multiplier=2 * backoff)),
            reraise=True,
        )
        return await retrying(self._request, backend, prompt_ids, params, live)

    async def _request(
        self, backend: Backend, prompt_ids: list[int], params: SamplingParams, live: LiveCall
    ) -> Generation:
        await self._opened()  # a retry waits out a pause too
        backend.requests += 1
        backend.in_flight += 1
        # This request's tokens count from those of the parts before it (an aborted generation
        # resumed); a request that fails takes back what it had streamed.
        live.backend, live.streaming, counted = backend.url, False, live.tokens
        live.backend_heard = backend.heard
        try:
            generation = await backend.client.generate(prompt_ids, params, self.vocab_size(), live)
            backend.heard.at = time.monotonic()
            return generation
        except BackendError as e:
            live.tokens = counted
            backend.failures += 1
            backend.last_error = str(e)
            raise
        finally:
            backend.in_flight -= 1
            if self._pauses:  # a pause may be draining this backend
                async with self._answered():
                    self._answered().notify_all()

    # -- pause and resume (a weight sync) -----------------------------------------------------

    def _open(self) -> asyncio.Event:
        if self._open_event is None:
            self._open_event = asyncio.Event()
            self._open_event.set()
        return self._open_event

    def _answered(self) -> asyncio.Condition:
        if self._answered_cond is None:
            self._answered_cond = asyncio.Condition()
        return self._answered_cond

    async def _opened(self) -> None:
        opened = self._open()
        if not opened.is_set():
            await opened.wait()

    @property
    def paused(self) -> bool:
        return self._pauses > 0

    async def pause(
        self, mode: PauseMode = "keep", resume_after_s: float | None = None
    ) -> dict[str, str]:
        """Pause the pool for a weight sync: no request starts until :meth:`resume`, and every
        backend is paused through its own route, or drained (its requests in flight answered)
        where it has none. Returns each backend's URL with how: ``"paused"`` or ``"drained"``.

        A backend that fails its pause route is drained too, and a drain that does not end
        within ``drain_timeout_s`` raises TimeoutError (the pool stays paused: resume it).
        ``resume_after_s``: the pool resumes by itself after that long, if no one has (a
        trainer that died between its pause and its resume stops no rollout for long)."""
        self._pauses += 1
        self._open().clear()
        backends = self.backends()
        try:
            how = await asyncio.gather(*(self._pause_one(b, mode) for b in backends))
        finally:
            # Armed once the backends are paused (or the drain gave up): a resume that ran
            # while a server's pause was still asked found it not yet paused, and left it so.
            if resume_after_s is not None:
                if self._auto_resume is not None:
                    self._auto_resume.cancel()
                self._auto_resume = asyncio.create_task(self._resume_after(resume_after_s))
        out = {b.url: h for b, h in zip(backends, how, strict=True)}
        log.info("pool paused (%s): %s", mode, out)
        return out

    async def _pause_one(self, backend: Backend, mode: PauseMode) -> str:
        try:
            backend.paused = await backend.client.pause(mode)
        except BackendError as e:
            log.warning("backend %s did not pause (%s): draining it", backend.url, e)
        if backend.paused:
            return "paused"
        deadline = time.monotonic() + self.config.drain_timeout_s
        async with self._answered():
            while backend.in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{backend.url} still has {backend.in_flight} requests in flight after"
                        f" {self.config.drain_timeout_s:g} s"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._answered().wait(), left)
        return "drained"

    async def _resume_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        log.error("pool paused for %g s with no resume: resuming it", delay_s)
        self._auto_resume = None  # (not cancelled by the resume it makes)
        self._pauses = 1
        await self.resume()

    async def resume(self) -> None:
        """End a :meth:`pause`: the backends paused through their routes resume, and requests
        start again (the generations aborted meanwhile go on from their prefixes). A backend
        that fails its resume route is logged and left to the health check."""
        self._pauses = max(self._pauses - 1, 0)
        if self._pauses:
            return
        if self._auto_resume is not None:
            self._auto_resume.cancel()
            self._auto_resume = None
        for backend in self.backends():
            if backend.paused:
                try:
                    await backend.client.resume()
                    backend.paused = False
                except BackendError as e:
                    log.error("backend %s did not resume: %s", backend.url, e)
        self._open().set()
        log.info("pool resumed")

    # -- health -------------------------------------------------------------------------------

    async def check_health(self) -> None:
        if self._pauses:  # a server paused or loading weights may not answer: not a failure
            return
        backends = self.backends()
        results = await asyncio.gather(*(self._healthy(b) for b in backends))
        for backend, ok in zip(backends, results, strict=True):
            backend.missed_checks = 0 if ok else backend.missed_checks + 1
            if not ok and backend.healthy and backend.missed_checks < self.config.misses_to_down:
                continue
            if ok != backend.healthy:
                log.warning("backend %s is %s", backend.url, "back" if ok else "down")
                backend.healthy = ok
                if ok:
                    backend.last_error = None
                self._push(backend)

    async def unanswered(self) -> dict[str, str]:
        """The backends that fail a health check now, with why (a start-up report; the health
        loop, not this, decides who is down)."""
        backends = self.backends()
        results = await asyncio.gather(*(self._healthy(b) for b in backends))
        return {
            b.url: b.last_error or "no answer"
            for b, ok in zip(backends, results, strict=True)
            if not ok
        }

    @staticmethod
    async def _healthy(backend: Backend) -> bool:
        """One backend's check; whatever it raises counts against that backend alone."""
        try:
            why_not = await backend.client.health()
        except Exception as e:
            why_not = f"{type(e).__name__}: {e}"
        if why_not is not None:
            backend.last_error = f"health check: {why_not}"
        return why_not is None

    def start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self.check_health()
            except Exception:
                log.exception("health check failed")

    async def stop(self) -> None:
        if self._auto_resume is not None:
            self._auto_resume.cancel()
            self._auto_resume = None
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        await self.clear()


def _joined(parts: list[Generation], finish_reason: str) -> Generation:
    """One generation of the parts a resumed generation came back in."""
    last = parts[-1]
    if len(parts) == 1:
        return replace(last, finish_reason=finish_reason)
    versions = [p.policy_versions for p in parts]
    return replace(
        last,
        token_ids=[t for p in parts for t in p.token_ids],
        logprobs=[x for p in parts for x in p.logprobs],
        finish_reason=finish_reason,
        cached_tokens=parts[0].cached_tokens,
        latency_s=sum(p.latency_s for p in parts),
        policy_versions=None
        if any(v is None for v in versions)
        else [x for v in versions for x in v or ()],
    )
