"""One job as the pipeline tracks it while it is alive."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from raas.pipeline.groups import Group
from raas.pipeline.states import JobState, Stage
from raas.tasks.protocol import RewardInfo, TaskContext, TaskHandler, TaskJob
from raas.tenants import DEFAULT_TENANT, job_key
from raas.wire import Branch, ErrorInfo, ErrorKind, RolloutResult, StageName, Trajectory


def new_job_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class JobRequest:
    instance: dict[str, Any]
    sampling_params: dict[str, Any] = field(default_factory=dict)
    job_id: str | None = None
    timeout_s: float | None = None
    priority: int = 0
    tenant: str = DEFAULT_TENANT  # whose job it is (raas.tenants)
    group: str | None = None  # jobs of one group and instance share INIT (raas.pipeline.groups)
    branch: Branch | None = None  # start from an earlier job's snapshot after a turn


def scoped(request: JobRequest) -> JobRequest:
    """``request`` with its ids (job, group, branch's parent) as the server keys them: in its
    tenant's namespace, so that two tenants' same ids name two jobs (and two groups)."""
    tenant = request.tenant
    if tenant == DEFAULT_TENANT:
        return request
    branch = request.branch
    if branch is not None:  # model_copy: a key is no job id the wire would take
        branch = branch.model_copy(update={"job_id": job_key(tenant, branch.job_id)})
    return replace(
        request,
        job_id=job_key(tenant, request.job_id) if request.job_id is not None else None,
        group=job_key(tenant, request.group) if request.group is not None else None,
        branch=branch,
    )


@dataclass
class Ending:
    """Why a job stops before (or instead of) finishing normally."""

    state: JobState
    stage: Stage | None
    error_type: str
    message: str
    kind: ErrorKind = "infra"
    metrics: dict[str, Any] = field(default_factory=dict)  # for the result (a PolicyError's)
    # False: running the job again cannot help (an exception's own ``retry = False``, such as a
    # missing image's), so an infra failure ends it at once.
    retry: bool = True

    @property
    def error(self) -> ErrorInfo:
        stage: StageName | None = self.stage.value if self.stage is not None else None
        return ErrorInfo(type=self.error_type, message=self.message, kind=self.kind, stage=stage)


@dataclass
class Timing:
    submitted_at: float = field(default_factory=time.time)
    queue_s: float = 0.0
    stage_s: dict[Stage, float] = field(default_factory=lambda: {s: 0.0 for s in Stage})
    finished_at: float | None = None

    @property
    def total_s(self) -> float:
        end = self.finished_at if self.finished_at is not None else time.time()
        return end - self.submitted_at

    def in_stages(self) -> float:
        return sum(self.stage_s.values())


class Job:
    def __init__(
        self,
        job_id: str,
        request: JobRequest,
        handler: TaskHandler,
        services: Any = None,
        task: str | None = None,
    ) -> None:
        self.id = job_id
        self.request = request
        self.handler = handler
        # The registered task's name; the instance's data_source may be a dataset that runs as it.
        self.task = task or handler.name
        self.services = services
        self.priority = request.priority
        self.tenant = request.tenant
        self.state = JobState.QUEUED
        self.stage: Stage | None = None  # the stage it is in, or waits for
        self.timing = Timing()
        self.context: TaskContext | None = None
        self.trajectory: Trajectory | None = None
        self.reward: RewardInfo | None = None
        self.ending: Ending | None = None
        # The running stage's work; cancelled on timeout or cancel.
        self.work: asyncio.Task[Any] | None = None
        # True while a stage worker holds the job (in a stage, or waiting to hand it on); the
        # worker then finishes the job. Otherwise it sits in a queue and a cancel finishes it.
        self.owned = False
        self.finishing = False
        self.retrying = False  # between a failed attempt's cleanup and the next attempt
        self.cleaned_up = False
        self.cleanup_error: str | None = None
        self.trajectory_error: str | None = None  # how the trajectory breaks its invariant
        self.done = asyncio.Event()
        self.result: RolloutResult | None = None
        self.attempts = 1
        self.group: Group | None = None  # set while the job is in flight in a group
        self.attempt_errors: list[ErrorInfo] = []  # why each earlier attempt was run again
        # Since when the job holds a sandbox (from INIT's start to its cleanup), for the tenant's
        # sandbox quota, and the seconds it held one over every attempt.
        self.sandbox_since: float | None = None
        self.sandbox_s = 0.0
        # Its tenant's limits, fixed at admission: the budget of a job that asks no timeout_s
        # longer than the tenant's max_timeout_s (None: none), and the LLM tokens reserved for
        # it against the tenant's token quotas until it ends (raas.pipeline.tenants).
        self.timeout_cap: float | None = None
        self.tokens_reserved = 0
        self._spent_before = 0.0  # stage time of earlier attempts (each gets the full budget)
        self._waiting_since = time.monotonic()

    def next_attempt(self, error: ErrorInfo) -> None:
        """Start over from INIT after ``error``; what the failed attempt acquired is released."""
        self.attempt_errors.append(error)
        self.attempts += 1
        self._spent_before = self.timing.in_stages()
        self.state = JobState.QUEUED
        self.stage = Stage.INIT
        self.context = None
        self.trajectory = None
        self.reward = None
        self.ending = None
        self.cleaned_up = False
        self.cleanup_error = None
        self.trajectory_error = None

    @property
    def task_job(self) -> TaskJob:
        request = self.request
        return TaskJob(
            self.id, request.instance, request.sampling_params, self.services, request.branch
        )

    @property
    def data_source(self) -> str:
        return str(self.request.instance.get("data_source", ""))

    @property
    def instance_id(self) -> str | None:
        value = self.request.instance.get("instance_id")
        return None if value is None else str(value)

    def llm_tokens(self) -> tuple[int, int]:
        """Tokens in (every LLM call's prompt) and out (its completion), from the turn records,
        which every agent loop and the gateway write with ``prompt_tokens``/``output_tokens``."""
        turns = self.partial_trajectory().turns
        return _count(turns, "prompt_tokens"), _count(turns, "output_tokens")

    def start_waiting(self) -> None:
        self._waiting_since = time.monotonic()

    def stop_waiting(self) -> None:
        self.timing.queue_s += time.monotonic() - self._waiting_since

    def budget_left(self, default_timeout_s: float | None) -> float | None:
        """Seconds of stage time left to this attempt: only time inside stages counts."""
        limit = self.request.timeout_s if self.request.timeout_s is not None else default_timeout_s
        if self.timeout_cap is not None:
            limit = self.timeout_cap if limit is None else min(limit, self.timeout_cap)
        if limit is None:
            return None
        return limit - (self.timing.in_stages() - self._spent_before)

    def partial_trajectory(self) -> Trajectory:
        if self.trajectory is not None:
            return self.trajectory
        if self.context is not None:
            return self.context.trajectory
        return Trajectory()

    def tokens_so_far(self) -> tuple[int, int]:
        """The first prompt's tokens and the response tokens so far (of every gateway segment,
        whose first is the trajectory). Both grow a turn at a time: a backend answers a turn's
        tokens whole."""
        traj = self.partial_trajectory()
        segments = self.context.segments if self.context is not None else ()
        response = sum(len(s.response_ids) for s in segments) or len(traj.response_ids)
        return len(traj.prompt_ids), response

    def broken_trajectory(self) -> str | None:
        """How the job's trajectory, or one of its segments, breaks the token invariant (see
        Trajectory.invariant_error), or None where every one holds."""
        problem = self.partial_trajectory().invariant_error()
        if problem is not None:
            return f"the trajectory breaks the token invariant: {problem}"
        segments = self.context.segments if self.context is not None else ()
        for i, segment in enumerate(segments):
            problem = segment.invariant_error()
            if problem is not None:
                return f"gateway segment {i} breaks the token invariant: {problem}"
        return None


def _count(turns: list[dict[str, Any]], key: str) -> int:
    counts = (turn.get(key) for turn in turns)
    return sum(n for n in counts if isinstance(n, int) and not isinstance(n, bool))
