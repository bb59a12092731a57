"""The one record a finished job leaves for counting: a JobEvent, made where the job finishes
(``Pipeline._finish``, or at a start for a job that cannot run again) and handed to the
ledger (raas.pipeline.ledger), which every count of finished jobs reads.

It is made from the result as written (what the store holds, so the counts and the stored
result agree), and from what only the job knows: its tenant, the LLM tokens of its turns, the
seconds it held a sandbox.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from raas.pipeline.job import Job
from raas.pipeline.states import JobState, Stage
from raas.wire import ErrorKind, RolloutResult


@dataclass(frozen=True)
class JobEvent:
    """One job's end: what it was, how it ended, what it used."""

    tenant: str
    data_source: str  # the instance's own (a dataset name stays that): the metrics' label
    task: str | None  # the raas task that ran it; None when no task took it
    state: JobState
    queue_s: float
    stage_s: dict[Stage, float] = field(hash=False)  # every attempt's, by stage
    error_kind: ErrorKind | None  # of the error that ended it; None when done
    error_type: str | None
    # The kinds of the errors that ended its earlier runs (each run again), oldest first.
    attempt_error_kinds: tuple[ErrorKind, ...]
    tokens_in: int  # every LLM call's prompt, as the turn records count them
    tokens_out: int  # every LLM call's completion
    generated_tokens: int  # response tokens of the policy's (loss mask 1)
    malformed_tool_calls: int
    tamper: bool  # a judge scored it 0: a twin of a deciding test passed
    sandbox_s: float  # INIT to cleanup, every attempt
    reward: float | None
    # Its tokens' newest policy version minus their oldest; None where its backend named none.
    policy_version_span: int | None
    finished_at: float  # Unix time it was reported finished (its result durable)


def job_event(job: Job, result: RolloutResult) -> JobEvent:
    """The event of ``job``, whose ``result`` was just written."""
    tokens_in, tokens_out = job.llm_tokens()
    return _event(job.tenant, result, tokens_in, tokens_out, job.sandbox_s)


def restart_event(tenant: str, result: RolloutResult) -> JobEvent:
    """The event of a job from before a restart that fails at the start, not run again: it
    used nothing of this process (its result keeps no trajectory)."""
    return _event(tenant, result, 0, 0, 0.0)


def _event(
    tenant: str, result: RolloutResult, tokens_in: int, tokens_out: int, sandbox_s: float
) -> JobEvent:
    timing = result.timing
    error = result.error
    return JobEvent(
        tenant=tenant,
        data_source=result.data_source,
        task=result.task,
        state=JobState(result.state),
        queue_s=timing.queue_s,
        stage_s={Stage.INIT: timing.init_s, Stage.RUN: timing.run_s, Stage.EVAL: timing.eval_s},
        error_kind=error.kind if error is not None else None,
        error_type=error.type if error is not None else None,
        attempt_error_kinds=tuple(e.kind for e in result.attempt_errors),
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        generated_tokens=sum(result.trajectory.loss_mask),
        malformed_tool_calls=result.trajectory.malformed_tool_calls(),
        tamper=bool(result.metrics.get("tamper")),
        sandbox_s=sandbox_s,
        reward=result.reward,
        policy_version_span=result.trajectory.policy_version_span(),
        finished_at=time.time(),
    )
