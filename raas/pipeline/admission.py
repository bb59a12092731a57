"""The admission side of the pipeline: a submission accepted whole or refused (bad input, its
tenant's limits and quotas, the INIT queue's room, a job_id already known), recorded before it
is queued; and, at a start, the jobs a previous process left unfinished queued again."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from raas.pipeline.config import PipelineConfig
from raas.pipeline.errors import (
    Draining,
    InitQueueFull,
    JobIdConflict,
    RequestRejected,
    StoreUnavailable,
)
from raas.pipeline.events import restart_event
from raas.pipeline.job import Ending, Job, JobRequest, new_job_id
from raas.pipeline.observer import PipelineObserver
from raas.pipeline.result import restart_ending, unfinished_result
from raas.pipeline.stages import Stages
from raas.pipeline.states import JobState, Stage
from raas.pipeline.stored import as_stored, request_of
from raas.pipeline.tenants import TenantBooks, token_budgets, token_ceiling
from raas.pipeline.views import JobView, record_view, view_of
from raas.store.records import JobRecord
from raas.store.sqlite import ResultStore, StoreWriteError
from raas.tasks.protocol import (
    InvalidInstance,
    Submission,
    TaskHandler,
    TaskJob,
    prepare_instance,
    validate_request,
)
from raas.tasks.registry import TaskRegistry, UnknownTask
from raas.tenants import job_key, own_id
from raas.wire import Branch, ErrorInfo

log = logging.getLogger(__name__)


class Admission:
    """Which submissions become jobs, and the jobs a restart runs again."""

    def __init__(
        self,
        registry: TaskRegistry,
        store: ResultStore,
        config: PipelineConfig,
        observers: list[PipelineObserver],
        services: Any,
        books: TenantBooks,
        stages: Stages,
    ) -> None:
        self.registry = registry
        self.store = store
        self.config = config
        self.observers = observers
        self.services = services
        self.books = books
        self.stages = stages
        self.accepting = True
        # The job_ids whose records are being written, and the future that says when.
        self._recording: dict[str, asyncio.Future[None]] = {}

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
                written = await self.store.save_result(rec.job_id, result)
                self.stages.ledger.record(restart_event(rec.tenant, written))
                failed += 1
                continue
            self.store.note_attempt(job.id, job.attempts, job.attempt_errors)
            self.stages.jobs[job.id] = job
            self.books.jobs[job.tenant] += 1
            self.books.meter(job.tenant).reserve(
                job.tokens_reserved
            )  # admitted before: not refused
            self.stages.idle.clear()
            self.stages.spawn(self.stages.enqueue(job))
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
        job.recovered = True
        job.stage = Stage.INIT
        self.stages.join_group(job)
        for obs in self.observers:
            obs.job_submitted(job)
        return job

    async def submit(self, requests: Sequence[JobRequest]) -> list[JobView]:
        """Accept all of ``requests`` or none of them.

        A request whose ``job_id`` is already known (in flight or finished, even before a
        restart) returns that job instead of a new one. Raises InvalidInstance / UnknownTask for
        bad input (nothing accepted), InitQueueFull when the INIT queue lacks room, QuotaExceeded
        when a tenant would go over its jobs in flight or has spent its LLM tokens, Draining, and
        StoreUnavailable when the jobs cannot be recorded: a job is queued only once its record
        is written, so one that is turned away never runs. Each instance is its task's prepared
        one from the first check on (``prepare_instance``: a Harbor task named by its path read
        into its files): that is what is compared with a known job's and recorded.
        """
        if not self.accepting:
            raise Draining(self.stages.stopping)
        ceilings: list[int] = []  # each request's LLM tokens at most, reserved if admitted
        submission = Submission(self.services, getattr(self.services, "prepared_bytes", 0))
        prepared: list[JobRequest] = []
        for i, request in enumerate(requests):
            try:
                handler = self.registry.get(str(request.rollout.instance.get("data_source", "")))
                request = await _prepared(handler, request, submission)
                if (branch := request.keyed_branch) is not None:
                    await self._check_branch_parent(branch)
                validate_request(handler, self._checked_job(request))
                ceilings.append(self._check_limits(request, handler))
            except (InvalidInstance, UnknownTask) as e:
                raise RequestRejected(i, e) from e
            prepared.append(request)
        requests = prepared
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
            raise Draining(self.stages.stopping)
        views: list[JobView | None] = []
        fresh: dict[str, Job] = {}
        for request, ceiling in zip(requests, ceilings, strict=True):
            job_id = request.key
            known = (self.stages.jobs.get(job_id) or fresh.get(job_id)) if job_id else None
            if known is not None:
                if not request.same_job(known.request):
                    raise JobIdConflict(own_id(known.id))
                views.append(view_of(known))
            elif job_id and job_id in stored:
                if not _same_as_stored(request, stored[job_id]):
                    raise JobIdConflict(own_id(job_id))
                views.append(record_view(stored[job_id]))
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
            self.books.check_quotas(tenants, tokens, self.config.retry_after_s)
            queue = self.stages.queues[Stage.INIT]
            for tenant, n in tenants.items():
                if not queue.has_room(tenant, n):
                    raise InitQueueFull(self.config.retry_after_s, queue.room(tenant), n)
            for tenant, n in tenants.items():
                queue.reserve(tenant, n)
            self.books.jobs.update(tenants)  # counted from here: a submission meanwhile sees
            for tenant, n in tokens.items():  # and their tokens, until each job settles
                self.books.meter(tenant).reserve(n)
            # Said before the first await: a submission of the same job_id meanwhile waits.
            written = asyncio.get_running_loop().create_future()
            for job_id in fresh:
                self._recording[job_id] = written
            # Shielded: once the record is on its way, the jobs are queued whatever becomes of
            # the request (a client that hangs up finds its job under its id).
            admitted = await asyncio.shield(self._admit(list(fresh.values()), written))
        fresh_views = iter(admitted if fresh else [])
        return [v if v is not None else next(fresh_views) for v in views]

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

    def _checked_job(self, request: JobRequest) -> TaskJob:
        """What a handler's ``validate`` is given of a request: with the services, so that it
        is checked against what this server offers (a branch's against the snapshots kept,
        none after a restart; a Harbor task's network against the egress allowed)."""
        rollout, branch = request.rollout, request.keyed_branch
        return TaskJob("", rollout.instance, rollout.sampling_params, self.services, branch)

    async def _check_branch_parent(self, branch: Branch) -> None:
        """A branch names a job this server knows (in flight or stored); the task checks the
        rest (its snapshot of the turn)."""
        if branch.job_id in self.stages.jobs or await self.store.get(branch.job_id) is not None:
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
            if key and key not in self.stages.jobs:
                record = await self.store.get(key)
                if record is not None:
                    stored[key] = record
        return stored

    async def _admit(self, jobs: list[Job], written: asyncio.Future[None]) -> list[JobView]:
        """Record ``jobs`` (their places in the INIT queue reserved), then queue them: durable
        before acknowledged. A record the store cannot write is StoreUnavailable, and nothing of
        the jobs is left behind. ``written`` is set once the write is over, either way. Returns
        the jobs' views as they were queued."""
        queue = self.stages.queues[Stage.INIT]
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
            self.books.jobs.subtract(job.tenant for job in jobs)
            for job in jobs:
                self.books.settle_tokens(job)  # nothing used
            if isinstance(e, StoreWriteError):
                raise StoreUnavailable(self._store_retry_after(), str(e)) from e
            raise
        finally:
            for job in jobs:
                del self._recording[job.id]
            written.set_result(None)
        self.stages.idle.clear()
        for job in jobs:
            job.stage = Stage.INIT
            self.stages.jobs[job.id] = job
            self.stages.join_group(job)
            job.start_waiting()
            queue.put_nowait(job, reserved=True)
            for obs in self.observers:
                obs.job_submitted(job)
        # Before anything else runs: the workers move the jobs on from here.
        return [view_of(job, created=True) for job in jobs]

    def _store_retry_after(self) -> int:
        return max(1, math.ceil(self.config.store_retry_s))


async def _prepared(
    handler: TaskHandler, request: JobRequest, submission: Submission
) -> JobRequest:
    """``request`` with its instance as its task prepares it (``prepare_instance``): what the
    job's record keeps and what runs, whatever a restart or a later change elsewhere."""
    instance = request.rollout.instance
    ready = await prepare_instance(handler, instance, submission)
    if ready is instance:
        return request
    return JobRequest(request.rollout.model_copy(update={"instance": ready}), request.tenant)


def _same_as_stored(request: JobRequest, record: JobRecord) -> bool:
    try:
        return request.same_job(request_of(record))
    except ValidationError:  # no longer a valid request: no request is the same
        return False
