"""The stages' side of the pipeline: the workers of the three stage pools, a stage's run under
its time limits, and a job's end (cleanup, a run again after an infra failure, its result
persisted).

Each stage has its own workers and its own bounded queue. A worker holds a job only while the
stage's work runs, so a slow test suite in EVAL never holds a RUN slot, and RUN never waits for
a sandbox to be created. A worker takes a job only when the next stage's queue has room for it
(backpressure: the place is reserved as it takes it), so a full queue holds jobs back in the
queue before it, where fair share orders the tenants. Who holds a job, so who finishes it, is
its Phase (raas.pipeline.states).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from raas.pipeline.config import PipelineConfig
from raas.pipeline.events import job_event
from raas.pipeline.groups import Groups
from raas.pipeline.job import Ending, Job
from raas.pipeline.ledger import Ledger
from raas.pipeline.observer import PipelineObserver
from raas.pipeline.queue import StageQueue
from raas.pipeline.result import build_result
from raas.pipeline.slots import StageSlots
from raas.pipeline.states import ENDED, BadTransition, JobState, Phase, Stage
from raas.pipeline.tenants import TenantBooks
from raas.store.sqlite import ResultStore, StoreWriteError
from raas.tasks.protocol import PolicyError, RewardInfo, TaskContext, TaskHandler, error_kind
from raas.wire import ErrorKind, RolloutResult, Trajectory

log = logging.getLogger(__name__)


class Stages:
    """The stage queues and their workers, and every job in flight (``jobs``)."""

    def __init__(
        self,
        config: PipelineConfig,
        store: ResultStore,
        observers: list[PipelineObserver],
        books: TenantBooks,
        ledger: Ledger,
    ) -> None:
        self.config = config
        self.store = store
        self.observers = observers  # the pipeline's own list: one appended later is told too
        self.books = books
        self.stopping = False  # draining for shutdown: infra failures are not run again
        self.ledger = ledger
        self.jobs: dict[str, Job] = {}
        self._slots: dict[Stage, StageSlots] = {}
        for stage in Stage:  # each keeps slots for the jobs in the stage before, made first
            before = None if stage.previous is None else self._slots[stage.previous]
            self._slots[stage] = StageSlots(config.workers[stage], books.weight, before)
        self.queues: dict[Stage, StageQueue[Job]] = {}
        for stage in reversed(Stage):  # each hands on to the next stage's, made first
            self.queues[stage] = StageQueue(
                config.queue_size[stage],
                weight=books.weight,
                may_take=books.may_take_init
                if stage is Stage.INIT
                else self._slots[stage].may_take,
                hands_to=self.queues[stage.next] if stage.next is not None else None,
            )
        self.busy: dict[Stage, int] = {stage: 0 for stage in Stage}
        self.workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self.idle = asyncio.Event()  # set while no job is in flight
        self.idle.set()
        # Set when the service stops for good: a result the store still refuses is left to the
        # next start (the job's record says it is unfinished, so it runs again).
        self.abandon = asyncio.Event()
        self.held: set[str] = set()  # jobs finished whose results wait for the store
        self.groups = Groups(lambda handler, template: self.spawn(self._release(handler, template)))

    def start(self) -> None:
        for stage in Stage:
            # RUN's slots are not taken back from a job in its loop, so RUN has as many workers
            # again, for a tenant under its share while others hold every slot (StageSlots).
            for i in range(self.config.workers[stage] * (2 if stage is Stage.RUN else 1)):
                self.workers.append(
                    asyncio.create_task(self._worker(stage), name=f"raas-{stage}-{i}")
                )

    async def stop(self) -> None:
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        self.workers.clear()

    async def settle(self) -> None:
        """Wait for every task spawned (a finish, a group's cleanup) to be over."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def end(self, job: Job, state: JobState, error_type: str, message: str) -> None:
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
                    self.queues[job.stage].discard(job)
                job.stop_waiting()
                self.spawn(self._finish(job))
            case Phase.HELD:
                job.ending = ending
                if job.work is not None:
                    job.work.cancel()  # the worker that awaits it finishes the job
                elif job.stage is not None:
                    self.queues[job.stage].wake()  # a rerun waits for room there: it gives up

    async def _worker(self, stage: Stage) -> None:
        queue = self.queues[stage]
        slots = self._slots[stage]
        while True:
            job = await queue.get()
            try:
                job.move(Phase.HELD)
            except BadTransition:  # a bug of ours: the job is another's; keep the worker
                log.exception("a worker of %s took job %s, not queued", stage, job.id)
                continue
            job.stop_waiting()
            slots.take(job.tenant)
            if stage is Stage.INIT:
                self.books.hold_sandbox(job)
            try:
                await self._process(job, stage)
            except Exception as e:  # a bug of ours: fail the job, keep the worker
                log.exception("internal error on job %s in %s", job.id, stage)
                if job.ending is None:
                    job.ending = Ending(JobState.FAILED, stage, "internal_error", repr(e), "infra")
                self.spawn(self._finish(job))
            finally:
                slots.give_back(job.tenant)
                # A slot freed here, and one the next stage kept for this job no longer kept.
                queue.wake()
                if stage.next is not None:
                    self.queues[stage.next].wake()

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
                self.queues[nxt].put_nowait(job, reserved=True)
                handed_on = True
                job.move(Phase.QUEUED)
                return
        finally:
            if nxt is not None and not handed_on:
                self.queues[nxt].unreserve(job.tenant)
        self.spawn(self._finish(job))

    async def _run_stage(self, job: Job, stage: Stage) -> None:
        left, stage_limit = (
            job.budget_left(self.config.job_timeout_s),
            self.config.stage_timeout_s[stage],
        )
        limit = min((x for x in (left, stage_limit) if x is not None), default=None)
        if left is not None and limit == left:  # the job's budget, not the stage's, bounds it
            budget = job.budget(self.config.job_timeout_s)
            why = f"the job's time budget of {budget:.3g} s ran out in {stage}"
            if budget is not None and budget - left >= max(1.0, budget / 20):  # time went before
                why += f", which began with {left:.3g} s of it left"
        else:
            why = f"{stage} did not finish within its time limit of {limit or 0:.3g} s"
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
        self.busy[stage] += 1
        started = time.monotonic()
        work = asyncio.create_task(self._call(job, stage), name=f"raas-job-{job.id}-{stage}")
        job.work = work
        try:
            timeout = None if limit is None else max(limit, 0.0)
            done, _ = await asyncio.wait({work}, timeout=timeout)
            if not done and job.ending is None:
                job.ending = _timed_out(job, stage, why, timeout_kind, timeout or 0.0)
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
            self.busy[stage] -= 1
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
            context = await self.groups.init_context(job.group, handler, job.task_job)
            job.context = context
            if job.phase in ENDED:  # the job ended while init ignored its cancellation
                await self.cleanup(job)
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

    async def cleanup(self, job: Job) -> None:
        """Release what init acquired: exactly once per context, whatever else happened."""
        context: TaskContext | None = job.context
        if context is None or context is job.released:
            self.books.release_sandbox(job)
            return
        job.released = context
        try:
            await asyncio.wait_for(
                job.handler.cleanup(context), timeout=self.config.cleanup_timeout_s
            )
        except Exception as e:
            log.exception("job %s: cleanup failed", job.id)
            job.cleanup_error = f"{type(e).__name__}: {e}"
        self.books.release_sandbox(job)

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
        await self.cleanup(job)
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
        self.books.meter(job.tenant).add(sum(job.llm_tokens()))
        job.next_attempt(failed.error)
        self.store.note_attempt(job.id, job.attempts, job.attempt_errors)
        await self.enqueue(job)

    async def enqueue(self, job: Job) -> None:
        """Put a job that runs again into the INIT queue, waiting for room; a cancel ends it."""
        job.move(Phase.HELD)  # as a worker handing a job on: a cancel wakes the put, we finish it
        job.start_waiting()
        if await self.queues[Stage.INIT].put(job, give_up=lambda: job.ending is not None):
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
        await self.cleanup(job)
        state = job.ending.state if job.ending is not None else JobState.DONE
        job.timing.finished_at = time.time()
        result = await self._persist(job, build_result(job, state))
        if result is None:
            log.error(
                "job %s: the service stopped before its result could be written; its record"
                " says it is unfinished, so it runs again at the next start",
                job.id,
            )
            self.books.settle_tokens(job)
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
        self.books.settle_tokens(job)
        self._forget(job)
        self.ledger.record(job_event(job, result))
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
                if job.id not in self.held:
                    self.held.add(job.id)
                    log.warning(
                        "job %s: finished %s, but its result cannot be written (%s); it is held"
                        " and written once the store can",
                        job.id,
                        result.state,
                        e,
                        exc_info=not isinstance(e, StoreWriteError),  # a bug of ours: in full
                    )
                if self.abandon.is_set():
                    self.held.discard(job.id)
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.abandon.wait(), self.config.store_retry_s)
                continue
            if job.id in self.held:
                self.held.discard(job.id)
                log.info("job %s: its held result is written", job.id)
            return written

    def join_group(self, job: Job) -> None:
        request = job.request
        job.group = self.groups.join(
            request.group_key, job.task, request.rollout.instance, job.handler
        )

    async def _release(self, handler: TaskHandler, template: TaskContext) -> None:
        """Clean up a finished group's template (a context no job holds)."""
        try:
            await asyncio.wait_for(handler.cleanup(template), self.config.cleanup_timeout_s)
        except Exception:
            log.exception("%s: the cleanup of a group's template failed", handler.name)

    def _forget(self, job: Job) -> None:
        if self.jobs.pop(job.id, None) is not None:
            self.books.jobs[job.tenant] -= 1
        if job.group is not None:
            self.groups.leave(job.group)
            job.group = None
        if not self.jobs:
            self.idle.set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


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


def _timed_out(job: Job, stage: Stage, why: str, kind: ErrorKind, limit_s: float) -> Ending:
    """The ending of a job whose time (``limit_s`` for this stage run) ran out in ``stage``.

    Where a model call had brought no token and gone at least half of that time without a sign
    that its backend serves it (``LiveCall.silent_s``), the backend never answered: the
    infrastructure's fault, said so with the backend's name, and run again (an attempt has its
    whole budget). A slow model that was sending tokens, or a loop that spent the time in its
    tools, stays ``kind``. The half is what makes it a stall and not a trick: a policy that
    waits out its budget in a tool and then asks the model with a moment left gets no token
    either, and must not turn its own timeout into a run again (its 0 would be dropped from
    the trainer's batch, not learned from)."""
    call = job.model_call()
    now = time.monotonic()
    if call is not None and call.tokens == 0 and call.silent_s(now) >= limit_s / 2:
        took = f"{now - call.started:.3g} s"
        if not call.backend:
            said = f"no backend took the turn's model call in {took} (the pool was paused,"
            said += " or had no backend free)"
        elif call.streaming:
            said = f"{call.backend} sent no token in {took} of the turn's model call"
        else:
            said = f"{call.backend} had not answered the turn's model call in {took}, nor any"
            said += " other call meanwhile"
        why, kind = f"{said}: {why}", "infra"
    return Ending(JobState.TIMEOUT, stage, "timeout", why, kind)
