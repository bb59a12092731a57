"""Jobs through three stage pools: INIT (set up), RUN (the agent loop), EVAL (the reward).

The Pipeline owns the two sides and says when each runs: Admission (raas.pipeline.admission)
decides which submissions become jobs and queues again a restart's unfinished ones; Stages
(raas.pipeline.stages) runs them through the stage pools and finishes them. TenantBooks
(raas.pipeline.tenants) counts, per tenant, what both consult for its quotas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from raas.pipeline.admission import Admission
from raas.pipeline.config import PipelineConfig
from raas.pipeline.errors import Draining
from raas.pipeline.job import Job, JobRequest
from raas.pipeline.ledger import Ledger
from raas.pipeline.observer import PipelineObserver
from raas.pipeline.stages import Stages
from raas.pipeline.states import JobState, Stage
from raas.pipeline.tenants import TenantBooks, TenantPolicies
from raas.pipeline.views import JobView, record_view, view_of
from raas.store.sqlite import ResultStore
from raas.tasks.registry import TaskRegistry

__all__ = ["JobView", "Pipeline", "PipelineObserver"]

log = logging.getLogger(__name__)


class Pipeline:
    def __init__(
        self,
        registry: TaskRegistry,
        store: ResultStore,
        config: PipelineConfig | None = None,
        observers: Iterable[PipelineObserver] = (),
        services: Any = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.registry = registry
        self.services = services
        self.store = store
        self.config = config or PipelineConfig()
        # The one count of what jobs did (raas.pipeline.ledger): told of submissions and stage
        # runs as an observer, of each finished job by the JobEvent the stages hand it.
        self.ledger = ledger if ledger is not None else Ledger()
        self.observers: list[PipelineObserver] = [self.ledger, *observers]
        self.started_at = time.time()
        self.books = TenantBooks(
            lambda tenant: self.config.tenants(tenant),  # asked each time: set_tenants swaps it
            getattr(services, "snapshots", None),
            wake=lambda: self.stages.queues[Stage.INIT].wake(),
        )
        self.stages = Stages(self.config, store, self.observers, self.books, self.ledger)
        self.admission = Admission(
            registry, store, self.config, self.observers, services, self.books, self.stages
        )

    @property
    def accepting(self) -> bool:
        return self.admission.accepting

    @property
    def stopping(self) -> bool:
        """Draining for shutdown: infra failures are not run again, no request resumes."""
        return self.stages.stopping

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Fill the plots over time from the store, start the stage workers, then run again the
        jobs a previous process left unfinished."""
        # First: no job of this process has finished yet, so none is counted twice.
        recent = self.ledger.recent
        since = recent.first() * recent.bucket_s
        self.ledger.restore(await self.store.finished_groups(recent.bucket_s, since))
        self.stages.start()
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
        """Queue again the jobs in flight when the service died (Admission.recover)."""
        return await self.admission.recover()

    async def drain(self, grace_s: float) -> None:
        """Stop accepting, let jobs in flight finish for ``grace_s``, then cancel the rest.

        Returns once every job has a persisted result.
        """
        stages = self.stages
        self.admission.accepting = False
        stages.stopping = True
        if stages.jobs:
            log.info("draining: %d jobs in flight, grace period %.1f s", len(stages.jobs), grace_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stages.idle.wait(), timeout=grace_s)
        stages.abandon.set()  # results the store still refuses are left to the next start
        if stages.jobs:
            log.warning("grace period over: cancelling %d jobs", len(stages.jobs))
            for job in list(stages.jobs.values()):
                stages.end(
                    job,
                    JobState.CANCELLED,
                    "shutdown",
                    f"the service shut down; the job was not finished within the {grace_s:g} s"
                    " grace period",
                )
            await stages.idle.wait()
        await stages.settle()

    async def stop(self, grace_s: float = 0.0) -> None:
        await self.drain(grace_s)
        await self.stages.stop()

    def set_tenants(self, policies: TenantPolicies) -> None:
        """Use ``policies`` from now on (the settings were read again): weights apply at the
        next job a stage takes, quotas at the next submission."""
        self.config.tenants = policies
        self.books.wake()  # a raised sandbox quota lets waiting jobs go

    def pause(self) -> None:
        """Stop accepting new jobs; jobs in flight go on (ProRL's ``/stop``)."""
        self.admission.accepting = False

    def resume(self) -> None:
        """Accept new jobs again after pause() (ProRL's ``/start``); Draining once the service
        is shutting down (drain()), which no request undoes."""
        if self.stopping:
            raise Draining(shutting_down=True)
        self.admission.accepting = True

    async def submit(self, requests: Sequence[JobRequest]) -> list[JobView]:
        """Accept all of ``requests`` or none of them (Admission.submit says how)."""
        return await self.admission.submit(requests)

    # -- looking up, waiting, cancelling -------------------------------------------------------

    def active(self, job_id: str) -> Job | None:
        return self.stages.jobs.get(job_id)

    def in_flight(self) -> list[Job]:
        """Every job not finished yet, oldest first."""
        return sorted(self.stages.jobs.values(), key=lambda job: job.timing.submitted_at)

    async def lookup(self, job_id: str) -> JobView | None:
        job = self.stages.jobs.get(job_id)
        if job is not None:
            return view_of(job)
        record = await self.store.get(job_id)
        return record_view(record) if record is not None else None

    async def wait(self, job_id: str, timeout_s: float) -> JobView | None:
        """The job's view once it has finished, or after ``timeout_s``, whichever is first."""
        job = self.stages.jobs.get(job_id)
        if job is not None and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.done.wait(), timeout=timeout_s)
            return view_of(job)
        return await self.lookup(job_id)

    def cancel(self, job_id: str) -> Job | None:
        """Ask a job in flight to stop; its result says ``cancelled`` once cleanup has run."""
        job = self.stages.jobs.get(job_id)
        if job is not None:
            self.stages.end(job, JobState.CANCELLED, "cancelled", "cancelled by request")
        return job

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
            f" {len(self.stages.held)} finished results are held until it can"
        )

    def stats(self) -> dict[str, Any]:
        stages = self.stages
        finished = self.ledger.finished()
        return {
            "accepting": self.accepting,
            "store_writable": self.store.write_error is None,
            "results_held": len(stages.held),
            "unreadable_rows": self.store.unreadable_rows,
            "uptime_s": time.time() - self.started_at,
            "in_flight": len(stages.jobs),
            "stages": {
                stage.value: {
                    "workers": self.config.workers[stage],
                    "active": stages.busy[stage],
                    "queued": len(stages.queues[stage]),
                    "queue_capacity": stages.queues[stage].maxsize,
                }
                for stage in Stage
            },
            "finished": {
                state.value: finished[state.value] for state in JobState if state.finished
            },
            "tenants": {  # every tenant that has submitted since the start
                tenant: {"in_flight": n, "sandboxes": self.books.held_sandboxes(tenant)}
                for tenant, n in sorted(self.books.jobs.items())
            },
        }
