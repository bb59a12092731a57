"""The wire contract: every type that crosses HTTP (requests, results, trajectories, status).

This module imports nothing but pydantic, so the trainer-side client uses it without the
server's dependencies; the server, the store and the export use the same types, and the
OpenAPI document is generated from them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

JobStateName = Literal["queued", "init", "run", "eval", "done", "failed", "timeout", "cancelled"]
StageName = Literal["init", "run", "eval"]
FINAL_STATES = ("done", "failed", "timeout", "cancelled")


def _require_data_source(instance: dict[str, Any]) -> dict[str, Any]:
    source = instance.get("data_source")
    if not isinstance(source, str) or not source:
        raise ValueError("instance.data_source must be a non-empty string naming the task")
    return instance


Instance = Annotated[dict[str, Any], AfterValidator(_require_data_source)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutRequest(_Strict):
    instance: Instance = Field(
        description="The task instance; `data_source` picks the task handler."
    )
    sampling_params: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the task (and its LLM calls)."
    )
    job_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:@-]+$",
        description="Idempotency key: resubmitting the same job_id returns the same job.",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Budget of time inside stages (queue waits not counted)."
    )
    priority: int = Field(default=0, description="Higher runs first within each stage queue.")


class BatchRequest(_Strict):
    jobs: list[RolloutRequest] = Field(min_length=1, max_length=10000)


class Submitted(BaseModel):
    job_id: str
    state: JobStateName
    created: bool = Field(description="False when the job_id was already known.")


class BatchSubmitted(BaseModel):
    jobs: list[Submitted]


class ErrorInfo(BaseModel):
    type: str
    message: str


class Trajectory(BaseModel):
    """What a rollout produced so far, as the trainer receives it.

    A task appends to it as it goes (the lists are shared with the agent loop, so it is
    complete at every await), so that a job that is cancelled or runs out of time still returns
    everything produced before that point. Token-level fields stay empty for tasks that need no
    model (the scripted countdown task).
    """

    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(
        default_factory=list,
        description="1 on tokens the policy generated, 0 on tokens the environment inserted.",
    )
    logprobs: list[float] = Field(
        default_factory=list, description="Aligned with response_ids; 0.0 where loss_mask is 0."
    )
    messages: list[dict[str, Any]] = Field(default_factory=list)
    turns: list[dict[str, Any]] = Field(default_factory=list)
    stop_reason: str | None = None


class Timing(BaseModel):
    queue_s: float
    init_s: float
    run_s: float
    eval_s: float
    total_s: float


class RolloutResult(BaseModel):
    job_id: str
    state: JobStateName
    stage_failed: StageName | None = None
    error: ErrorInfo | None = None
    reward: float | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    trajectory: Trajectory
    timing: Timing
    instance_id: str | None = None
    data_source: str


class JobStatus(BaseModel):
    job_id: str
    state: JobStateName
    stage: StageName | None = Field(
        default=None, description="The stage the job is in or waits for, while in flight."
    )
    result: RolloutResult | None = None


class ResultPage(BaseModel):
    results: list[RolloutResult]
    next_since: int = Field(description="Pass as `since` to get the results after this page.")


class StageStatus(BaseModel):
    workers: int
    active: int
    queued: int
    queue_capacity: int


class ServiceStatus(BaseModel):
    accepting: bool
    uptime_s: float
    in_flight: int
    stages: dict[StageName, StageStatus]
    finished: dict[str, int] = Field(description="Jobs finished by this process, by state.")
    tasks: list[str]
    llm_servers: list[str]


class ProcessRequest(_Strict):
    """ProRL Agent's ``/process`` body."""

    instance: Instance
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = Field(default=None, min_length=1, max_length=200)


class CancelRequest(_Strict):
    job_id: str


BackendProtocol = Literal["vllm", "sglang", "verl"]


class LLMServerRequest(_Strict):
    address: str = Field(min_length=1, description="Base URL of an inference server.")
    protocol: BackendProtocol | None = Field(
        default=None, description="Defaults to the server's --llm-protocol."
    )
    capacity: int | None = Field(default=None, ge=1)


class BackendIn(_Strict):
    url: str = Field(min_length=1, description="Base URL (a trailing /v1 is fine).")
    protocol: BackendProtocol = "vllm"
    capacity: int = Field(default=8, ge=1, description="Concurrent sessions it is sized for.")
    model: str | None = Field(default=None, description="Served model name (vLLM).")


class BackendOut(BaseModel):
    id: str
    url: str
    protocol: BackendProtocol
    capacity: int
    model: str | None
    healthy: bool
    sessions: int = Field(description="Jobs pinned to it now.")
    load: float
    requests: int
    failures: int
    last_error: str | None


class Ack(BaseModel):
    ok: bool = True
    message: str = ""
