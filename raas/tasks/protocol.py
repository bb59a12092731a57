"""The contract between the pipeline and a task.

A handler is called once per stage: ``init`` (set the task up, e.g. acquire a sandbox), ``run``
(the multi-turn loop), ``eval`` (score it) and ``cleanup`` (release what ``init`` acquired). The
pipeline calls ``cleanup`` exactly once for every context that ``init`` returned, whatever happened
after. If ``init`` itself is interrupted (cancelled, timed out, or it raises), it has returned no
context, so it must release what it had acquired before re-raising.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from raas.wire import Trajectory


@dataclass(frozen=True)
class TaskJob:
    """What a handler is given about the job it works on.

    ``services`` holds what the service provides to every task (the LLM backend pool, the
    tokenizer, sandboxes); see raas.tasks.services. It is None where none are set up.
    """

    job_id: str
    instance: dict[str, Any]
    sampling_params: dict[str, Any]
    services: Any = None


@dataclass
class TaskContext:
    """The state a handler carries from ``init`` to ``cleanup``.

    ``trajectory`` is read by the pipeline when a stage is interrupted, so ``run`` should append
    to it as it goes rather than build a new one at the end. Handlers subclass this to add their
    own fields.
    """

    job: TaskJob
    trajectory: Trajectory = field(default_factory=Trajectory)


@dataclass
class RewardInfo:
    reward: float
    metrics: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TaskHandler(Protocol):
    name: str

    async def init(self, job: TaskJob) -> TaskContext: ...

    async def run(self, context: TaskContext) -> Trajectory: ...

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo: ...

    async def cleanup(self, context: TaskContext) -> None: ...


class InvalidInstance(ValueError):
    """A submitted instance or sampling parameter that a handler cannot accept.

    ``field`` names the offending field as a dotted path (``instance.numbers``), so the API can
    answer 422 with it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def validate_request(handler: TaskHandler, job: TaskJob) -> None:
    """Run the handler's optional ``validate(job)`` hook; it raises InvalidInstance."""
    validate = getattr(handler, "validate", None)
    if validate is not None:
        validate(job)
