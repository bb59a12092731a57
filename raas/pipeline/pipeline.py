"""Jobs through three stage pools: INIT (set up), RUN (the agent loop), EVAL (the reward).

Each stage has its own workers and its own bounded queue. A worker holds a job only while the
stage's work runs, so a slow test suite in EVAL never holds a RUN slot, and RUN never waits for
a sandbox to be created. A worker takes a job only when the next stage's queue has room for it
(backpressure: the place is reserved as it takes it), so a full queue holds jobs back in the
queue before it, where fair share orders the tenants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from raas.pipeline.config import PipelineConfig
from raas.pipeline.errors import (
    Draining,
    InitQueueFull,
    JobIdConflict,
    QuotaExceeded,
    RequestRejected,
    StoreUnavailable,
)
from raas.pipeline.groups import Groups
from raas.pipeline.job import Ending, Job, JobRequest, new_job_id
from raas.pipeline.queue import StageQueue
from raas.pipeline.result import build_result, restart_ending, unfinished_result
from raas.pipeline.slots import StageSlots
from raas.pipeline.states import ENDED, JobState, Phase, Stage
from raas.pipeline.stored import as_stored, request_of
from raas.pipeline.tenants import TenantPolicies, TokenMeter, token_budgets, token_ceiling
from raas.store.records import JobRecord
from raas.store.sqlite import ResultStore, StoreWriteError
from raas.tasks.protocol import (
    InvalidInstance,
    PolicyError,
    RewardInfo,
    TaskContext,
    TaskHandler,
    TaskJob,
    error_kind,
    validate_request,
)
from raas.tasks.registry import TaskRegistry, UnknownTask
from raas.tenants import job_key, own_id, tenant_of
from raas.wire import Branch, ErrorInfo, ErrorKind, RolloutResult, Trajectory

log = logging.getLogger(__name__)


class PipelineObserver(Protocol):
    """Hooks for metrics; called on the event loop, so they must not block."""

    def job_submitted(self, job: Job) -> None: ...

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None: ...

    def job_finished(self, job: Job, state: JobState) -> None: ...


@dataclass(frozen=True)
class JobView:
    """What a caller may see of a job, alive or long finished."""

    job_id: str
    state: JobState
    stage: Stage | None
    result: RolloutResult | None
    created: bool = False  # True when this submission created the job (not a resubmission)


def _view(job: Job, created: bool = False) -> JobView:
    return JobView(job.id, job.state, job.stage, job.result, created)


def _record_view(record: JobRecord) -> JobView:
    return JobView(record.job_id, JobState(record.state), None, record.result)


class Pipeline:
    def __init__(
        self,
        registry: TaskRegistry,
        store: ResultStore,
        config: PipelineConfig | None = None,
        observers: Iterable[PipelineObserver] = (),
        services: Any = None,
    ) -> None:
        self.registry = registry
        self.services = services
        self.store = store
        self.config = config or PipelineConfig()
        self.observers = list(observers)
        self.accepting = True
        self.stopping = False  # draining for shutdown: infra failures are not run again
        self.started_at = time.time()
        self.finished_counts: Counter[JobState] = Counter()
        self._jobs: dict[str, Job] = {}
        self._slots: dict[Stage, StageSlots] = {}
        for stage in Stage:  # each keeps slots for the jobs in the stage before, made first
            before = None if stage.previous is None else self._slots[stage.previous]
            self._slots[stage] = StageSlots(self.config.workers[stage], self._weight, before)
        self._queues: dict[Stage, StageQueue[Job]] = {}
        for stage in reversed(Stage):  # each hands on to the next stage's, made first
            self._queues[stage] = StageQueue(
                self.config.queue_size[stage],
                weight=self._weight,
                may_take=self._may_take_init
                if stage is Stage.INIT
                else self._slots[stage].may_take,
                hands_to=self._queues[stage.next] if stage.next is not None else None,
            )
        # Per tenant: jobs accepted and not finished (or being recorded), sandboxes held, and
        # the LLM tokens of its finished jobs, for its quotas.
        self._tenant_jobs: Counter[str] = Counter()
        self._sandboxes: Counter[str] = Counter()
        self._tokens: dict[str, TokenMeter] = {}
        # A kept snapshot is a live sandbox of its job's tenant: counted in its max_sandboxes,
        # bounded by its max_snapshots, evicted for its own new ones only (raas.agent.snapshots).
        self._snapshots = getattr(services, "snapshots", None)
        if not hasattr(self._snapshots, "bind"):
            self._snapshots = None
        if self._snapshots is not None:
            self._snapshots.bind(tenant_of, self._snapshots_allowed, self._snapshot_freed)
        self._busy: dict[Stage, int] = {stage: 0 for stage in Stage}
        self._workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        # The job_ids whose records are being written, and the future that says when.
        self._recording: dict[str, asyncio.Future[None]] = {}
        # Set when the service stops for good: a result the store still refuses is left to the
        # next start (the job's record says it is unfinished, so it runs again).
        self._abandon = asyncio.Event()
        self._held: set[str] = set()  # jobs finished whose results wait for the store
        self._groups = Groups(
            lambda handler, template: self._spawn(self._release(handler, template))
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the stage workers, then run again the jobs a previous process left unfinished."""
        for stage in Stage:
            # RUN's slots are not taken back from a job in its loop, so RUN has as many workers
            # again, for a tenant under its share while others hold every slot (StageSlots).
            for i in range(self.config.workers[stage] * (2 if stage is Stage.RUN else 1)):
                self._workers.append(
                    asyncio.create_task(self._worker(stage), name=f"raas-{stage}-{i}")
                )
        rerun, failed = await self.recover()
        if rerun or failed:
            log.warning(
                "%d jobs were in flight when the service last stopped: %d run again, %d failed"
                " (no attempts left, or no longer valid)",
                rerun + failed,
                rerun,
                failed,
            )

    async def recover(self) -> tuple[int, int]:
        """Queue again, under their ids, the jobs that were in flight when the service died.

        Each such job that had started counts an attempt; one that has used ``max_attempts``
        fails with ``server_restart``. Returns how many were queued again and how many failed.
        """
        rerun = failed = 0
        for rec in await self.store.unfinished():
            ending = restart_ending(rec.state)
            errors = list(rec.attempt_errors)
            if rec.state != JobState.QUEUED.value:  # a job that never started lost no attempt
                errors.append(ending.error)
            job = None
            if len(errors) < self.config.max_attempts:
                job = self._revive(rec, errors)
                if job is None:
                    ending = Ending(
                        JobState.FAILED,
                        None,
                        "invalid_after_restart",
                        "the job's task or instance is no longer accepted by this service",
                        "policy",
                    )
            if job is None:
                instance = rec.request.get("instance", {})
                source = str(instance.get("data_source", ""))
                task = self.registry.resolve(source) if source in self.registry else None
                result = unfinished_result(
                    rec.job_id, ending, instance, rec.created_at, rec.attempt_errors, task
                )
                await self.store.save_result(rec.job_id, result)
                failed += 1
                continue
            self.store.note_attempt(job.id, job.attempts, job.attempt_errors)
            self._jobs[job.id] = job
            self._tenant_jobs[job.tenant] += 1
            self._meter(job.tenant).reserve(job.tokens_reserved)  # admitted before: not refused
            self._idle.clear()
            self._spawn(self._enqueue(job))
            rerun += 1
        return rerun, failed

    def _revive(self, rec: JobRecord, errors: list[ErrorInfo]) -> Job | None:
        """A stored job as a new attempt, or None when its request is no longer valid here."""
        try:
            request = request_of(rec)
            task = self.registry.resolve(str(request.rollout.instance.get("data_source", "")))
            handler = self.registry.get(task)
            validate_request(handler, self._checked_job(request))
            ceiling = token_ceiling(handler, self._checked_job(request)) or 0
        except (InvalidInstance, UnknownTask, ValidationError):
            return None
        job = Job(rec.job_id, request, handler, self.services, task)
        job.timeout_cap = self.config.tenants(job.tenant).quotas.max_timeout_s
        job.tokens_reserved = ceiling
        job.timing.submitted_at = rec.created_at
        job.attempt_errors = errors
        job.attempts = len(errors) + 1
        job.stage = Stage.INIT
        self._join_group(job)
        for obs in self.observers:
            obs.job_submitted(job)
        return job

    async def drain(self, grace_s: float) -> None:
        """Stop accepting, let jobs in flight finish for ``grace_s``, then cancel the rest.

        Returns once every job has a persisted result.
        """
        self.accepting = False
        self.stopping = True
        if self._jobs:
            log.info("draining: %d jobs in flight, grace period %.1f s", len(self._jobs), grace_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        self._abandon.set()  # results the store still refuses are left to the next start
        if self._jobs:
            log.warning("grace period over: cancelling %d jobs", len(self._jobs))
            for job in list(self._jobs.values()):
                self._end(
                    job,
                    JobState.CANCELLED,
                    "shutdown",
                    f"the service shut down; the job was not finished within the {grace_s:g} s"
                    " grace period",
                )
            await self._idle.wait()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def stop(self, grace_s: float = 0.0) -> None:
        await self.drain(grace_s)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()

    def set_tenants(self, policies: TenantPolicies) -> None:
        """Use ``policies`` from now on (the settings were read again): weights apply at the
        next job a stage takes, quotas at the next submission."""
        self.config.tenants = policies
        self._queues[Stage.INIT].wake()  # a raised sandbox quota lets waiting jobs go

    def pause(self) -> None:
        """Stop accepting new jobs; jobs in flight go on (ProRL's ``/stop``)."""
        self.accepting = False

    def resume(self) -> None:
        """Accept new jobs again after pause() (ProRL's ``/start``); Draining once the service
        is shutting down (drain()), which no request undoes."""
        if self.stopping:
            raise Draining(shutting_down=True)
        self.accepting = True

    # -- submission ----------------------------------------------------------------------------

    async def submit(self, requests: Sequence[JobRequest]) -> list[JobView]:
        """Accept all of ``requests`` or none of them.

        A request whose ``job_id`` is already known (in flight or finished, even before a
        restart) returns that job instead of a new one. Raises InvalidInstance / UnknownTask for
        bad input (nothing accepted), InitQueueFull when the INIT queue lacks room, QuotaExceeded
        when a tenant would go over its jobs in flight or has spent its LLM tokens, Draining, and
        StoreUnavailable when the jobs cannot be recorded: a job is queued only once its record
        is written, so one that is turned away never runs.
        """
        if not self.accepting:
            raise Draining(self.stopping)
        ceilings: list[int] = []  # each request's LLM tokens at most, reserved if admitted
        for i, request in enumerate(requests):
            try:
                handler = self.registry.get(str(request.rollout.instance.get("data_source", "")))
                if (branch := request.keyed_branch) is not None:
                    await self._check_branch_parent(branch)
                validate_request(handler, self._checked_job(request))
                ceilings.append(self._check_limits(request, handler))
            except (InvalidInstance, UnknownTask) as e:
                raise RequestRejected(i, e) from e
        while True:
            stored = await self._stored(requests)
            # A job_id whose record another submission is writing now: its outcome decides.
            recording = {f for r in requests if r.key and (f := self._recording.get(r.key))}
            if not recording:
                break
            await asyncio.wait(recording)
        # Past the last await before the record is written: nothing else runs until then, so
        # the checks hold.
        if not self.accepting:
            raise Draining(self.stopping)
        views: list[JobView | None] = []
        fresh: dict[str, Job] = {}
        for request, ceiling in zip(requests, ceilings, strict=True):
            job_id = request.key
            known = (self._jobs.get(job_id) or fresh.get(job_id)) if job_id else None
            if known is not None:
                if not request.same_job(known.request):
                    raise JobIdConflict(own_id(known.id))
                views.append(_view(known))
            elif job_id and job_id in stored:
                if not _same_as_stored(request, stored[job_id]):
                    raise JobIdConflict(own_id(job_id))
                views.append(_record_view(stored[job_id]))
            else:
                job_id = job_id or job_key(request.tenant, new_job_id())
                task = self.registry.resolve(str(request.rollout.instance.get("data_source", "")))
                job = Job(job_id, request, self.registry.get(task), self.services, task)
                job.timeout_cap = self.config.tenants(job.tenant).quotas.max_timeout_s
                job.tokens_reserved = ceiling
                fresh[job_id] = job
                views.append(None)
        if fresh:
            tenants = Counter(job.tenant for job in fresh.values())
            tokens: Counter[str] = Counter()
            for job in fresh.values():
                tokens[job.tenant] += job.tokens_reserved
            self._check_quotas(tenants, tokens)
            queue = self._queues[Stage.INIT]
            for tenant, n in tenants.items():
                if not queue.has_room(tenant, n):
                    raise InitQueueFull(self.config.retry_after_s, queue.room(tenant), n)
            for tenant, n in tenants.items():
                queue.reserve(tenant, n)
            self._tenant_jobs.update(tenants)  # counted from here: a submission meanwhile sees
            for tenant, n in tokens.items():  # and their tokens, until each job settles
                self._meter(tenant).reserve(n)
            # Said before the first await: a submission of the same job_id meanwhile waits.
            written = asyncio.get_running_loop().create_future()
            for job_id in fresh:
                self._recording[job_id] = written
            # Shielded: once the record is on its way, the jobs are queued whatever becomes of
            # the request (a client that hangs up finds its job under its id).
            admitted = await asyncio.shield(self._admit(list(fresh.values()), written))
        fresh_views = iter(admitted if fresh else [])
        return [v if v is not None else next(fresh_views) for v in views]

    def _check_quotas(self, wanted: Counter[str], tokens: Counter[str]) -> None:
        """QuotaExceeded when a tenant's ``wanted`` new jobs would take it over its jobs in
        flight, or their ``tokens`` (ceilings) would take it over an LLM token budget beside
        what it used and what is reserved: the whole submission is refused."""
        for tenant, n in wanted.items():
            policy = self.config.tenants(tenant)
            cap = policy.quotas.max_jobs_in_flight
            if cap is not None and self._tenant_jobs[tenant] + n > cap:
                raise QuotaExceeded(
                    tenant,
                    "max_jobs_in_flight",
                    self.config.retry_after_s,
                    f"{self._tenant_jobs[tenant]} in flight, {n} more asked, at most {cap}",
                )
            meter = self._meter(tenant)
            spent = meter.over(policy, tokens[tenant])
            if spent is not None:
                quota, wait_s = spent
                asked = f"{tokens[tenant]} LLM tokens asked (the jobs' ceilings)"
                if wait_s is None:
                    raise QuotaExceeded(
                        tenant,
                        quota,
                        self.config.retry_after_s,
                        f"{asked}, {meter.reserved} reserved for its jobs in flight till they end",
                    )
                raise QuotaExceeded(
                    tenant,
                    quota,
                    max(1, math.ceil(wait_s)),
                    f"{asked}; its window frees in {wait_s:.0f} s",
                )

    def _check_limits(self, request: JobRequest, handler: TaskHandler) -> int:
        """Refuse (InvalidInstance: a 422 naming the field) what the tenant's limits never
        admit: a ``timeout_s`` over its ``max_timeout_s``, a job whose token ceiling alone is
        over a token quota. Returns the job's token ceiling (0 where its task says none)."""
        policy = self.config.tenants(request.tenant)
        cap = policy.quotas.max_timeout_s
        asked = request.rollout.timeout_s
        if cap is not None and asked is not None and asked > cap:
            raise InvalidInstance(
                ("timeout_s",),
                f"{asked:g} s is over this tenant's max_timeout_s of {cap:g} s (ask"
                " at most that, or none: a job that asks none gets it at most)",
                "less_than_equal",
            )
        ceiling = token_ceiling(handler, self._checked_job(request)) or 0
        for quota, limit, _ in token_budgets(policy):
            if ceiling > limit:
                raise InvalidInstance(
                    ("sampling_params",),
                    f"the job may use {ceiling} LLM tokens (its ceiling: max_turns times"
                    f" max_context_tokens), more than this tenant's whole {quota} quota allows"
                    f" ({limit:g} in its window): lower max_turns or max_context_tokens",
                    "token_quota",
                )
        return ceiling

    def _meter(self, tenant: str) -> TokenMeter:
        return self._tokens.setdefault(tenant, TokenMeter())

    def _settle_tokens(self, job: Job) -> None:
        """The job ended: what it used replaces the ceiling reserved for it (once)."""
        self._meter(job.tenant).settle(job.tokens_reserved, sum(job.llm_tokens()))
        job.tokens_reserved = 0

    def _weight(self, tenant: str) -> float:
        return self.config.tenants(tenant).weight

    def _may_take_init(self, tenant: str) -> bool:
        # INIT's slots keep none (no stage comes before it): the sandbox quota alone decides.
        cap = self.config.tenants(tenant).quotas.max_sandboxes
        return cap is None or self._held_sandboxes(tenant) < cap

    def _held_sandboxes(self, tenant: str) -> int:
        """``tenant``'s sandboxes: its jobs' from INIT to cleanup, and its kept snapshots."""
        kept = self._snapshots.held(tenant) if self._snapshots is not None else 0
        return self._sandboxes[tenant] + kept

    def _snapshots_allowed(self, tenant: str) -> int | None:
        """How many snapshots ``tenant`` may keep now (None: as many as the server's): its
        max_snapshots, and what its max_sandboxes leaves beside its jobs' own sandboxes."""
        quotas = self.config.tenants(tenant).quotas
        caps = [quotas.max_snapshots]
        if quotas.max_sandboxes is not None:
            caps.append(quotas.max_sandboxes - self._sandboxes[tenant])
        return min((c for c in caps if c is not None), default=None)

    def _snapshot_freed(self, tenant: str) -> None:
        self._queues[Stage.INIT].wake()  # a job of the tenant held back at its cap may go

    def _hold_sandbox(self, job: Job) -> None:
        job.sandbox_since = time.monotonic()
        self._sandboxes[job.tenant] += 1

    def _release_sandbox(self, job: Job) -> None:
        if job.sandbox_since is None:
            return
        job.sandbox_s += time.monotonic() - job.sandbox_since
        job.sandbox_since = None
        self._sandboxes[job.tenant] -= 1
        self._queues[Stage.INIT].wake()  # a job of the tenant held back at its cap may go

    def _checked_job(self, request: JobRequest) -> TaskJob:
        """What a handler's ``validate`` is given of a request: a branch's with the services,
        so it is checked against the snapshots kept (after a restart there are none)."""
        rollout, branch = request.rollout, request.keyed_branch
        services = self.services if branch is not None else None
        return TaskJob("", rollout.instance, rollout.sampling_params, services, branch)

    async def _check_branch_parent(self, branch: Branch) -> None:
        """A branch names a job this server knows (in flight or stored); the task checks the
        rest (its snapshot of the turn)."""
        if branch.job_id in self._jobs or await self.store.get(branch.job_id) is not None:
            return
        raise InvalidInstance(
            ("branch", "job_id"),
            f"no job {own_id(branch.job_id)} is known to this server",
            "not_found",
        )

    async def _stored(self, requests: Sequence[JobRequest]) -> dict[str, JobRecord]:
        """The stored records of the requests' job_ids that are not in flight."""
        stored: dict[str, JobRecord] = {}
        for request in requests:
            key = request.key
            if key and key not in self._jobs:
                record = await self.store.get(key)
                if record is not None:
                    stored[key] = record
        return stored

    async def _admit(self, jobs: list[Job], written: asyncio.Future[None]) -> list[JobView]:
        """Record ``jobs`` (their places in the INIT queue reserved), then queue them: durable
        before acknowledged. A record the store cannot write is StoreUnavailable, and nothing of
        the jobs is left behind. ``written`` is set once the write is over, either way. Returns
        the jobs' views as they were queued."""
        queue = self._queues[Stage.INIT]
        records = [
            JobRecord(
                job.id,
                job.state.value,
                job.data_source,
                job.instance_id,
                as_stored(job.request),
                job.timing.submitted_at,
                tenant=job.request.tenant,
            )
            for job in jobs
        ]
        try:
            await self.store.add_jobs(records)
        except BaseException as e:
            for tenant, n in Counter(job.tenant for job in jobs).items():
                queue.unreserve(tenant, n)
            self._tenant_jobs.subtract(job.tenant for job in jobs)
            for job in jobs:
                self._settle_tokens(job)  # nothing used
            if isinstance(e, StoreWriteError):
                raise StoreUnavailable(self._store_retry_after(), str(e)) from e
            raise
        finally:
            for job in jobs:
                del self._recording[job.id]
            written.set_result(None)
        self._idle.clear()
        for job in jobs:
            job.stage = Stage.INIT
            self._jobs[job.id] = job
            self._join_group(job)
            job.start_waiting()
            queue.put_nowait(job, reserved=True)
            for obs in self.observers:
                obs.job_submitted(job)
        # Before anything else runs: the workers move the jobs on from here.
        return [_view(job, created=True) for job in jobs]

    def _store_retry_after(self) -> int:
        return max(1, math.ceil(self.config.store_retry_s))

    # -- looking up, waiting, cancelling -------------------------------------------------------

    def active(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def in_flight(self) -> list[Job]:
        """Every job not finished yet, oldest first."""
        return sorted(self._jobs.values(), key=lambda job: job.timing.submitted_at)

    async def lookup(self, job_id: str) -> JobView | None:
        job = self._jobs.get(job_id)
        if job is not None:
            return _view(job)
        record = await self.store.get(job_id)
        return _record_view(record) if record is not None else None

    async def wait(self, job_id: str, timeout_s: float) -> JobView | None:
        """The job's view once it has finished, or after ``timeout_s``, whichever is first."""
        job = self._jobs.get(job_id)
        if job is not None and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.done.wait(), timeout=timeout_s)
            return _view(job)
        return await self.lookup(job_id)

    def cancel(self, job_id: str) -> Job | None:
        """Ask a job in flight to stop; its result says ``cancelled`` once cleanup has run."""
        job = self._jobs.get(job_id)
        if job is not None:
            self._end(job, JobState.CANCELLED, "cancelled", "cancelled by request")
        return job

    def _end(self, job: Job, state: JobState, error_type: str, message: str) -> None:
        """End ``job`` as ``state``: whoever holds it finishes it (see Phase)."""
        ending = Ending(
            state, None if job.state is JobState.QUEUED else job.stage, error_type, message
        )
        match job.phase:
            case Phase.FINISHING | Phase.FINISHED:
                pass  # too late: it ends as it ends
            case Phase.RETRYING:
                job.ending = ending  # the retry sees the new ending and finishes the job
            case _ if job.ending is not None:
                pass  # ending already: its holder finishes it
            case Phase.QUEUED:
                job.ending = ending
                if job.stage is not None:
                    self._queues[job.stage].discard(job)
                job.stop_waiting()
                self._spawn(self._finish(job))
            case Phase.HELD:
                job.ending = ending
                if job.work is not None:
                    job.work.cancel()  # the worker that awaits it finishes the job
                elif job.stage is not None:
                    self._queues[job.stage].wake()  # a rerun waits for room there: it gives up

    # -- the stage workers ---------------------------------------------------------------------

    async def _worker(self, stage: Stage) -> None:
        queue = self._queues[stage]
        slots = self._slots[stage]
        while True:
            job = await queue.get()
            job.move(Phase.HELD)
            job.stop_waiting()
            slots.take(job.tenant)
            if stage is Stage.INIT:
                self._hold_sandbox(job)
            try:
                await self._process(job, stage)
            except Exception as e:  # a bug of ours: fail the job, keep the worker
                log.exception("internal error on job %s in %s", job.id, stage)
                if job.ending is None:
                    job.ending = Ending(JobState.FAILED, stage, "internal_error", repr(e), "infra")
                self._spawn(self._finish(job))
            finally:
                slots.give_back(job.tenant)
                # A slot freed here, and one the next stage kept for this job no longer kept.
                queue.wake()
                if stage.next is not None:
                    self._queues[stage.next].wake()

    async def _process(self, job: Job, stage: Stage) -> None:
        """Run ``stage`` of ``job``, then hand it on into the place the next queue reserved for
        it when it was taken; a job that ends here gives the place back and finishes."""
        nxt = stage.next
        handed_on = False
        try:
            if job.ending is None:
                await self._run_stage(job, stage)
            if job.ending is None and nxt is not None:
                job.stage = nxt
                job.state = JobState(nxt.value)
                job.start_waiting()
                self._queues[nxt].put_nowait(job, reserved=True)
                handed_on = True
                job.move(Phase.QUEUED)
                return
        finally:
            if nxt is not None and not handed_on:
                self._queues[nxt].unreserve(job.tenant)
        self._spawn(self._finish(job))

    async def _run_stage(self, job: Job, stage: Stage) -> None:
        limits = [job.budget_left(self.config.job_timeout_s), self.config.stage_timeout_s[stage]]
        limit = min((x for x in limits if x is not None), default=None)
        job.stage = stage
        job.state = JobState(stage.value)
        # A sandbox too slow to start is the infrastructure's doing; later, the model's.
        timeout_kind: ErrorKind = "infra" if stage is Stage.INIT else "policy"
        if limit is not None and limit <= 0:
            job.ending = Ending(
                JobState.TIMEOUT,
                stage,
                "timeout",
                f"the time budget was spent before {stage}",
                timeout_kind,
            )
            return
        self.store.note_state(job.id, job.state.value)
        self._busy[stage] += 1
        started = time.monotonic()
        work = asyncio.create_task(self._call(job, stage), name=f"raas-job-{job.id}-{stage}")
        job.work = work
        try:
            timeout = None if limit is None else max(limit, 0.0)
            done, _ = await asyncio.wait({work}, timeout=timeout)
            if not done and job.ending is None:
                job.ending = Ending(
                    JobState.TIMEOUT,
                    stage,
                    "timeout",
                    f"{stage} did not finish within its time limit of {limit:.3g} s",
                    timeout_kind,
                )
            if not work.done():
                work.cancel()
                done, _ = await asyncio.wait({work}, timeout=self.config.cancel_grace_s)
                if not done:
                    log.warning(
                        "job %s: %s ignored cancellation for %.1f s; abandoned",
                        job.id,
                        stage,
                        self.config.cancel_grace_s,
                    )
        finally:
            seconds = time.monotonic() - started
            job.timing.stage_s[stage] += seconds
            job.work = None
            self._busy[stage] -= 1
            for obs in self.observers:
                obs.stage_ended(job, stage, seconds)
        if job.ending is None and work.done():
            if work.cancelled():
                job.ending = Ending(JobState.FAILED, stage, "CancelledError", "stage was cancelled")
            elif (exc := work.exception()) is not None:
                job.ending = Ending(
                    JobState.FAILED,
                    stage,
                    type(exc).__name__,
                    str(exc) or repr(exc),
                    error_kind(exc),
                    exc.metrics if isinstance(exc, PolicyError) else {},
                    retry=getattr(exc, "retry", True) is not False,
                )

    async def _call(self, job: Job, stage: Stage) -> None:
        handler = job.handler
        if stage is Stage.INIT:
            context = await self._groups.init_context(job.group, handler, job.task_job)
            job.context = context
            if job.phase in ENDED:  # the job ended while init ignored its cancellation
                await self._cleanup(job)
            if not isinstance(getattr(context, "trajectory", None), Trajectory):
                raise TypeError(
                    f"{handler.name}.init returned {type(context).__name__}, which has no"
                    " Trajectory in .trajectory (subclass raas.tasks.TaskContext)"
                )
        elif stage is Stage.RUN:
            assert job.context is not None
            trajectory = await handler.run(job.context)
            if not isinstance(trajectory, Trajectory):
                raise TypeError(
                    f"{handler.name}.run returned {type(trajectory).__name__}, not a Trajectory"
                )
            job.trajectory = trajectory
        else:
            assert job.context is not None and job.trajectory is not None
            reward = await handler.eval(job.context, job.trajectory)
            if not isinstance(reward, RewardInfo):
                raise TypeError(
                    f"{handler.name}.eval returned {type(reward).__name__}, not a RewardInfo"
                )
            job.reward = reward

    # -- the end of a job ----------------------------------------------------------------------

    async def _cleanup(self, job: Job) -> None:
        """Release what init acquired: exactly once per context, whatever else happened."""
        context: TaskContext | None = job.context
        if context is None or context is job.released:
            self._release_sandbox(job)
            return
        job.released = context
        try:
            await asyncio.wait_for(
                job.handler.cleanup(context), timeout=self.config.cleanup_timeout_s
            )
        except Exception as e:
            log.exception("job %s: cleanup failed", job.id)
            job.cleanup_error = f"{type(e).__name__}: {e}"
        self._release_sandbox(job)

    def _may_retry(self, job: Job) -> bool:
        ending = job.ending
        return (
            ending is not None
            and ending.kind == "infra"
            and ending.retry
            and ending.state in (JobState.FAILED, JobState.TIMEOUT)
            and job.attempts < self.config.max_attempts
            and not self.stopping
        )

    async def _retry(self, job: Job) -> None:
        """Release what the failed attempt held, then queue the job for INIT again."""
        failed = job.ending
        assert failed is not None
        job.move(Phase.RETRYING)
        await self._cleanup(job)
        if job.ending is not failed or self.stopping:  # cancelled meanwhile, or shutting down
            await self._finish(job, retry=False)
            return
        log.warning(
            "job %s: attempt %d failed in %s (%s: %s); running it again",
            job.id,
            job.attempts,
            failed.stage,
            failed.error_type,
            failed.message,
        )
        # What the failed attempt used is spent; the job's ceiling stays reserved for the next.
        self._meter(job.tenant).add(sum(job.llm_tokens()))
        job.next_attempt(failed.error)
        self.store.note_attempt(job.id, job.attempts, job.attempt_errors)
        await self._enqueue(job)

    async def _enqueue(self, job: Job) -> None:
        """Put a job that runs again into the INIT queue, waiting for room; a cancel ends it."""
        job.move(Phase.HELD)  # as a worker handing a job on: a cancel wakes the put, we finish it
        job.start_waiting()
        if await self._queues[Stage.INIT].put(job, give_up=lambda: job.ending is not None):
            job.move(Phase.QUEUED)
            return
        job.stop_waiting()
        await self._finish(job)

    async def _finish(self, job: Job, retry: bool = True) -> None:
        if job.phase in ENDED:
            return
        _check_trajectory(job)
        if retry and self._may_retry(job):
            await self._retry(job)
            return
        job.move(Phase.FINISHING)
        await self._cleanup(job)
        state = job.ending.state if job.ending is not None else JobState.DONE
        job.timing.finished_at = time.time()
        result = await self._persist(job, build_result(job, state))
        if result is None:
            log.error(
                "job %s: the service stopped before its result could be written; its record"
                " says it is unfinished, so it runs again at the next start",
                job.id,
            )
            self._settle_tokens(job)
            self._forget(job)
            job.move(Phase.FINISHED)
            job.done.set()  # whoever waits sees it unfinished
            return
        if result.state != state.value and result.error is not None:
            # Stored as failed: the result would not have read back (raas.store.records).
            state = JobState(result.state)
            job.ending = Ending(state, None, result.error.type, result.error.message, "infra")
        job.state = state
        job.result = result
        job.move(Phase.FINISHED)
        job.done.set()
        self._settle_tokens(job)
        self._forget(job)
        self.finished_counts[state] += 1
        for obs in self.observers:
            obs.job_finished(job, state)
        _log_finished(job, state, result)

    async def _persist(self, job: Job, result: RolloutResult) -> RolloutResult | None:
        """Write the job's result, again every ``store_retry_s`` while the store cannot: till
        then the job stays in flight and is never reported finished. Returns the result as
        written, or None when the service stopped first."""
        while True:
            try:
                written = await self.store.save_result(job.id, result)
            except Exception as e:
                if job.id not in self._held:
                    self._held.add(job.id)
                    log.warning(
                        "job %s: finished %s, but its result cannot be written (%s); it is held"
                        " and written once the store can",
                        job.id,
                        result.state,
                        e,
                        exc_info=not isinstance(e, StoreWriteError),  # a bug of ours: in full
                    )
                if self._abandon.is_set():
                    self._held.discard(job.id)
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._abandon.wait(), self.config.store_retry_s)
                continue
            if job.id in self._held:
                self._held.discard(job.id)
                log.info("job %s: its held result is written", job.id)
            return written

    def _join_group(self, job: Job) -> None:
        request = job.request
        job.group = self._groups.join(
            request.group_key, job.task, request.rollout.instance, job.handler
        )

    async def _release(self, handler: TaskHandler, template: TaskContext) -> None:
        """Clean up a finished group's template (a context no job holds)."""
        try:
            await asyncio.wait_for(handler.cleanup(template), self.config.cleanup_timeout_s)
        except Exception:
            log.exception("%s: the cleanup of a group's template failed", handler.name)

    def _forget(self, job: Job) -> None:
        if self._jobs.pop(job.id, None) is not None:
            self._tenant_jobs[job.tenant] -= 1
        if job.group is not None:
            self._groups.leave(job.group)
            job.group = None
        if not self._jobs:
            self._idle.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- introspection -------------------------------------------------------------------------

    async def store_problem(self) -> str | None:
        """Why results cannot be made durable now, or None. Where the last write failed, the
        store is tried again first, so that the answer is never stale."""
        if self.store.write_error is not None:
            await self.store.probe()
        problem = self.store.write_error
        if problem is None:
            return None
        return (
            f"the result store {problem}: submissions are refused (503) and"
            f" {len(self._held)} finished results are held until it can"
        )

    def stats(self) -> dict[str, Any]:
        return {
            "accepting": self.accepting,
            "store_writable": self.store.write_error is None,
            "results_held": len(self._held),
            "unreadable_rows": self.store.unreadable_rows,
            "uptime_s": time.time() - self.started_at,
            "in_flight": len(self._jobs),
            "stages": {
                stage.value: {
                    "workers": self.config.workers[stage],
                    "active": self._busy[stage],
                    "queued": len(self._queues[stage]),
                    "queue_capacity": self._queues[stage].maxsize,
                }
                for stage in Stage
            },
            "finished": {
                state.value: self.finished_counts[state] for state in JobState if state.finished
            },
            "tenants": {  # every tenant that has submitted since the start
                tenant: {"in_flight": n, "sandboxes": self._held_sandboxes(tenant)}
                for tenant, n in sorted(self._tenant_jobs.items())
            },
        }


def _same_as_stored(request: JobRequest, record: JobRecord) -> bool:
    try:
        return request.same_job(request_of(record))
    except ValidationError:  # no longer a valid request: no request is the same
        return False


def _check_trajectory(job: Job) -> None:
    """A job whose trajectory breaks the token invariant is not done: it fails with the reason.

    The tokens are what raas and the backend recorded, not what the model chose, so it is an
    infra failure (run again while attempts are left). A job that ends for another reason keeps
    that one; its result's metrics say how its trajectory is broken all the same.
    """
    job.trajectory_error = job.broken_trajectory()
    if job.trajectory_error is not None and job.ending is None:
        job.ending = Ending(
            JobState.FAILED, Stage.RUN, "broken_trajectory", job.trajectory_error, "infra"
        )


def _log_finished(job: Job, state: JobState, result: RolloutResult) -> None:
    t = result.timing
    summary = (
        f"job {job.id} [{job.data_source}] {state}"
        f" reward={result.reward} queue={t.queue_s:.3f}s init={t.init_s:.3f}s"
        f" run={t.run_s:.3f}s eval={t.eval_s:.3f}s"
    )
    if job.ending is not None:
        where = f" in {job.ending.stage}" if job.ending.stage else ""
        summary += f"{where}: {job.ending.error_type}: {job.ending.message}"
    # A cancel someone asked for is no warning: a Ctrl-C of raas run or raas demo would print
    # one for each job over its own last line.
    asked = job.ending is not None and job.ending.error_type == "cancelled"
    log.log(logging.INFO if state is JobState.DONE or asked else logging.WARNING, summary)
