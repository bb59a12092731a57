"""The contract between the pipeline and a task.

A handler is called once per stage: ``init`` (set the task up, e.g. acquire a sandbox), ``run``
(the multi-turn loop), ``eval`` (score it) and ``cleanup`` (release what ``init`` acquired). The
pipeline calls ``cleanup`` exactly once for every context that ``init`` returned, whatever happened
after. If ``init`` itself is interrupted (cancelled, timed out, or it raises), it has returned no
context, so it must release what it had acquired before re-raising.

A handler may also have ``fork_context`` (see ``context_forker``): a group of jobs of one instance
then runs ``init`` once and each job starts from a fork of that context.

A handler may also have ``prepare(instance, submission)``, called once per job at submission,
before ``validate``: the instance as the job keeps and runs it, made from the one submitted
(``harbor`` reads a task named by its path into its files there, so that nothing read later can
change an accepted job; see ``Submission``). A restart's recovery does not call it: a stored
instance is already prepared.

A stage that raises fails the job with an error of kind ``infra`` (run again, in a fresh
sandbox, up to the attempt limit) unless the exception is a ``PolicyError`` (the job's own
doing: running it again would end the same way), see ``error_kind``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from raas.wire import Branch, ErrorKind, Resume, Trajectory, reject_non_finite

Loc = tuple[str | int, ...]
# A required text field of an instance: a string (never a number turned into one), not empty.
Text = Annotated[StrictStr, Field(min_length=1)]


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
    branch: Branch | None = None  # start from an earlier job's state after a turn
    recovered: bool = False  # in flight when the server stopped: resume if it can


@dataclass
class TaskContext:
    """The state a handler carries from ``init`` to ``cleanup``.

    ``trajectory`` is read by the pipeline when a stage is interrupted, so ``run`` should append
    to it as it goes rather than build a new one at the end. ``segments`` are the job's other
    token trajectories (a gateway job's segments): the pipeline checks the invariant of each
    (``Trajectory.invariant_error``) with ``trajectory``'s when it writes the result. Handlers
    subclass this to add their own fields.
    """

    job: TaskJob
    trajectory: Trajectory = field(default_factory=Trajectory)
    segments: Sequence[Trajectory] = ()
    # A recovered job's resume (the result's ``resume``), and what its checkpoints cost (the
    # result's metrics ``checkpoints``); None where it had none.
    resume: Resume | None = None
    checkpoints: dict[str, Any] | None = None


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


class PolicyError(Exception):
    """A task raises this when a job failed through what the model did (or what the job is),
    so that it is not run again; any other exception counts as an infrastructure failure.
    ``metrics`` go into the failed result's metrics (what the task knows of why)."""

    def __init__(self, message: str, metrics: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.metrics = dict(metrics or {})


def error_kind(exc: BaseException) -> ErrorKind:
    """Whether a stage's exception is worth running the job again for (infra) or not (policy)."""
    return "policy" if isinstance(exc, PolicyError | InvalidInstance) else "infra"


class InvalidInstance(ValueError):
    """A submitted instance or sampling parameter that a handler cannot accept.

    ``loc`` locates the offending value from the request's top (``("instance", "numbers", 1)``,
    ``("sampling_params", "seed")``), list indices included, so the API answers 422 with it as
    FastAPI does; ``kind`` is the error type (pydantic's, such as ``missing`` or ``int_type``).
    """

    def __init__(self, loc: Loc | str, message: str, kind: str = "invalid_instance") -> None:
        self.loc: Loc = tuple(loc.split(".")) if isinstance(loc, str) else tuple(loc)
        self.message = message
        self.kind = kind
        super().__init__(f"{self.field}: {message}")

    @property
    def field(self) -> str:
        """``loc`` as a dotted path (``instance.numbers.1``), for messages and logs."""
        return ".".join(map(str, self.loc))

    @classmethod
    def from_validation_error(
        cls,
        error: ValidationError,
        prefix: Loc = (),
        accepted: Iterable[str] = (),
        owner: str = "the task",
    ) -> InvalidInstance:
        """The first of ``error``'s errors, located under ``prefix`` (``("instance",)``).

        An unknown key (pydantic's ``extra_forbidden``) says which keys ``owner`` accepts, so a
        misspelt sampling parameter can be fixed from the message alone.
        """
        first = error.errors(include_url=False)[0]
        message, kind = str(first["msg"]), str(first["type"])
        if kind == "extra_forbidden" and accepted:
            message = f"unknown key ({owner} takes {', '.join(sorted(accepted))})"
        return cls((*prefix, *first["loc"]), message, kind)


class TaskInstance(BaseModel):
    """The base of a task's instance model: the fields the task reads, typed and bounded.

    Any other key is kept (datasets carry ``instance_id``, ``data_source``, ``extra_info``,
    ``metadata``...), but no number anywhere in an instance may be NaN or infinite.
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _finite(cls, data: Any) -> Any:
        # The typed fields refuse NaN through allow_inf_nan; this covers the extra keys too.
        return reject_non_finite(data)


def located_error(loc: Loc, message: str, value: Any = None) -> ValidationError:
    """An error at ``loc`` (relative to the model) for a model validator to raise.

    A check that spans several fields (a snapshot, or a repo and its commit) still names one
    field: pydantic joins the location to the model's own, as it does for a field's errors.
    """
    # The message goes in through the context: a template would read braces in it as fields.
    kind = PydanticCustomError("invalid_instance", "{reason}", {"reason": message})
    return ValidationError.from_exception_data(
        "instance", [{"type": kind, "loc": loc, "input": value}]
    )


ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_instance(model: type[ModelT], instance: Mapping[str, Any]) -> ModelT:
    """``instance`` validated by ``model``; InvalidInstance at the first bad field otherwise."""
    try:
        return model.model_validate(instance)
    except ValidationError as e:
        raise InvalidInstance.from_validation_error(e, ("instance",)) from None


def parse_params(
    model: type[ModelT], params: Mapping[str, Any], owner: str, **defaults: Any
) -> ModelT:
    """``sampling_params`` validated by ``model`` over ``defaults``; InvalidInstance otherwise.

    A key given as null means its default, as it always has (trainers send ``"seed": null``).
    An unknown key is an error whose message lists what ``owner`` accepts.
    """
    given = {k: v for k, v in params.items() if v is not None}
    try:
        return model.model_validate({**defaults, **given})
    except ValidationError as e:
        raise InvalidInstance.from_validation_error(
            e, ("sampling_params",), model.model_fields, owner
        ) from None


class ContextForker(Protocol):
    async def __call__(self, template: TaskContext, job: TaskJob) -> TaskContext: ...


def context_forker(handler: TaskHandler) -> ContextForker | None:
    """The handler's optional ``fork_context(template, job)``: a context for ``job`` made from
    ``template``, a context its ``init`` returned for another job of the same instance (a fork
    of its sandbox), released by ``cleanup`` as any other. Like ``init``, it releases what it
    acquired before it raises. None where the handler has none: each job runs ``init``."""
    fork = getattr(handler, "fork_context", None)
    return fork if callable(fork) else None


@dataclass
class Submission:
    """What a handler's ``prepare`` is given beside an instance: the service's ``services`` (None
    where none are set up; a server's say what it may read, raas.tasks.services), and what the
    jobs of one submission share while they are prepared: ``memo`` (a task directory that many
    jobs name is read once) and ``bytes_left``, what preparing may still add to what the
    submission stores (a small instance made large counts its bytes, each job its own copy:
    no more than the server would have taken in one body)."""

    services: Any = None
    bytes_left: int = 0
    memo: dict[Any, Any] = field(default_factory=dict)

    def spend(self, nbytes: int) -> bool:
        """Take ``nbytes`` from ``bytes_left``; False (nothing taken) if there are not so many."""
        if nbytes > self.bytes_left:
            return False
        self.bytes_left -= nbytes
        return True


async def prepare_instance(
    handler: TaskHandler, instance: dict[str, Any], submission: Submission
) -> dict[str, Any]:
    """The instance as the job keeps it: the handler's optional ``prepare`` hook's (it raises
    InvalidInstance), else ``instance`` itself."""
    prepare = getattr(handler, "prepare", None)
    if prepare is None:
        return instance
    prepared: dict[str, Any] = await prepare(instance, submission)
    return prepared


def validate_request(handler: TaskHandler, job: TaskJob) -> None:
    """Run the handler's optional ``validate(job)`` hook; it raises InvalidInstance."""
    if job.branch is not None and not getattr(handler, "can_branch", False):
        raise InvalidInstance(("branch",), f"the {handler.name} task cannot branch")
    validate = getattr(handler, "validate", None)
    if validate is not None:
        validate(job)
