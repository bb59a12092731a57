"""One job as the pipeline tracks it while it is alive."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from raas.llm.pool import BackendPool
from raas.llm.types import LiveCall
from raas.pipeline.groups import Group
from raas.pipeline.states import TRANSITIONS, BadTransition, JobState, Phase, Stage
from raas.tasks.protocol import RewardInfo, TaskContext, TaskHandler, TaskJob
from raas.tenants import DEFAULT_TENANT, job_key
from raas.wire import (
    Branch,
    ErrorInfo,
    ErrorKind,
    RolloutRequest,
    RolloutResult,
    StageName,
    Trajectory,
)


def new_job_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class JobRequest:
    """A submission as the pipeline takes it: the wire's request, its ids as its tenant gave
    them, and that tenant. Inside the server a job, its group and a branch's parent are known by
    keys in the tenant's namespace (raas.tenants): ``key``, ``group_key``, ``keyed_branch``."""

    rollout: RolloutRequest
    tenant: str = DEFAULT_TENANT  # whose job it is

    @classmethod
    def of(
        cls,
        instance: dict[str, Any],
        sampling_params: dict[str, Any] | None = None,
        job_id: str | None = None,
        *,
        tenant: str = DEFAULT_TENANT,
        **fields: Any,
    ) -> JobRequest:
        """A request made inside the process (/process, the benchmarks, tests). Not validated:
        the wire's requests are at the door, and submit checks what the pipeline needs."""
        rollout = RolloutRequest.model_construct(
            instance=instance, sampling_params=sampling_params or {}, job_id=job_id, **fields
        )
        return cls(rollout, tenant)

    @property
    def key(self) -> str | None:
        """The server's key of the job (None: the server picks an id)."""
        job_id = self.rollout.job_id
        return None if job_id is None else job_key(self.tenant, job_id)

    @property
    def group_key(self) -> str | None:
        """The server's key of the job's group: two tenants' same group name are two groups."""
        group = self.rollout.group
        return None if group is None else job_key(self.tenant, group)

    @property
    def keyed_branch(self) -> Branch | None:
        """The branch, its parent named by the server's key (model_copy: a key is no job id the
        wire would take)."""
        branch = self.rollout.branch
        if branch is None or self.tenant == DEFAULT_TENANT:
            return branch
        return branch.model_copy(update={"job_id": job_key(self.tenant, branch.job_id)})

    def same_job(self, other: JobRequest) -> bool:
        """Whether ``other`` asks the same job (a resubmission of one job_id must)."""
        mine, theirs = self.rollout, other.rollout
        return (
            mine.instance == theirs.instance
            and mine.sampling_params == theirs.sampling_params
            and mine.branch == theirs.branch
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
class JobClock:
    """Where a job in flight spent its time so far (the wire's Timing reports it when it ends)."""

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
        self.priority = request.rollout.priority
        self.tenant = request.tenant
        self.state = JobState.QUEUED
        self.stage: Stage | None = None  # the stage it is in, or waits for
        self.timing = JobClock()
        self.context: TaskContext | None = None
        self.trajectory: Trajectory | None = None
        self.reward: RewardInfo | None = None
        self.ending: Ending | None = None
        # The running stage's work; cancelled on timeout or cancel.
        self.work: asyncio.Task[Any] | None = None
        self.phase = Phase.QUEUED  # who holds it, so who finishes it (move() steps it)
        # The context whose cleanup has run: each attempt's is released exactly once.
        self.released: TaskContext | None = None
        self.cleanup_error: str | None = None
        self.trajectory_error: str | None = None  # how the trajectory breaks its invariant
        self.done = asyncio.Event()
        self.result: RolloutResult | None = None
        self.attempts = 1
        # In flight when the server last stopped: its task resumes it from its checkpoints.
        self.recovered = False
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
        self.cleanup_error = None
        self.trajectory_error = None

    def move(self, phase: Phase) -> None:
        """Step to ``phase``; BadTransition where TRANSITIONS has no such step from its own."""
        if phase not in TRANSITIONS[self.phase]:
            raise BadTransition(f"job {self.id}: no step from {self.phase} to {phase}")
        self.phase = phase

    @property
    def task_job(self) -> TaskJob:
        rollout = self.request.rollout
        return TaskJob(
            self.id,
            rollout.instance,
            rollout.sampling_params,
            self.services,
            self.request.keyed_branch,
            self.recovered,
        )

    @property
    def data_source(self) -> str:
        return str(self.request.rollout.instance.get("data_source", ""))

    @property
    def instance_id(self) -> str | None:
        value = self.request.rollout.instance.get("instance_id")
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

    def budget(self, default_timeout_s: float | None) -> float | None:
        """The seconds of stage time this attempt has in all (asked, else the default, under
        the tenant's cap); None: no limit."""
        asked = self.request.rollout.timeout_s
        limit = asked if asked is not None else default_timeout_s
        if self.timeout_cap is not None:
            limit = self.timeout_cap if limit is None else min(limit, self.timeout_cap)
        return limit

    def budget_left(self, default_timeout_s: float | None) -> float | None:
        """Seconds of stage time left to this attempt: only time inside stages counts."""
        limit = self.budget(default_timeout_s)
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
        whose first is the trajectory), with those of the model call in flight: a backend that
        streams (vLLM, raas engine) adds each token as it comes, so a stalled turn stands still
        while a slow one grows."""
        traj = self.partial_trajectory()
        segments = self.context.segments if self.context is not None else ()
        response = sum(len(s.response_ids) for s in segments) or len(traj.response_ids)
        call = self.model_call()
        return len(traj.prompt_ids), response + (call.tokens if call is not None else 0)

    def model_call(self) -> LiveCall | None:
        """The job's model call in flight (its session is the job's id), where its LLM is the
        pool; None between calls."""
        llm = getattr(self.services, "llm", None)
        return llm.live_call(self.id) if isinstance(llm, BackendPool) else None

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
