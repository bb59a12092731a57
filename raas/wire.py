"""The wire contract: every type that crosses HTTP (requests, results, trajectories, status).

This module imports nothing but pydantic, so the trainer-side client uses it without the
server's dependencies; the server, the store and the export use the same types, and the
OpenAPI document is generated from them.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated, Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

# The one spelling of a job's states (raas.pipeline.states.JobState mirrors it, checked): in
# flight, then finished. A job in flight is queued or in a stage, so its stages are its names too.
StageName = Literal["init", "run", "eval"]
LiveStateName = Literal["queued", StageName]
FinalStateName = Literal["done", "failed", "timeout", "cancelled"]
JobStateName = Literal[LiveStateName, FinalStateName]
# infra: the sandbox, a backend, the action server, the server itself or a judge failed; such a
# job runs again (up to the attempt limit). policy: what the model did (time spent, its output).
ErrorKind = Literal["infra", "policy"]
# A reward at least this is a pass (pass rates count these).
PASS_REWARD = 1.0
FINAL_STATES: tuple[FinalStateName, ...] = get_args(FinalStateName)
STAGE_NAMES: tuple[StageName, ...] = get_args(StageName)
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


def _require_data_source(instance: dict[str, Any]) -> dict[str, Any]:
    source = instance.get("data_source")
    if not isinstance(source, str) or not source:
        raise ValueError("instance.data_source must be a non-empty string naming the task")
    return instance


JsonT = TypeVar("JsonT")


_NOT_TEXT = PydanticCustomError(
    "unicode_text", "a lone surrogate is not text: send each character as UTF-8 or a pair"
)


def _is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text UTF-8 can hold (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: str) -> str:
    """``value`` as a 422 can echo it: each lone surrogate written as its escape (the answer is
    UTF-8 too, and could not hold it)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def reject_non_finite(value: JsonT) -> JsonT:
    """``value`` itself, or a ValidationError locating each NaN or infinity inside it.

    Python's json (and so FastAPI) reads ``NaN``, ``Infinity`` and ``1e999`` (as inf) into
    floats; nothing downstream can use them (``int(inf)`` raises, JSON answers cannot hold them),
    so free-form fields (an instance, sampling_params) are walked once at the door. So are their
    texts: JSON's ``"\\ud800"`` reads as a lone surrogate, which no UTF-8 store or answer can
    hold (it was a 500 at the store's write). Raised from a validator, the errors' locations are
    joined to the field's, so the 422 names the very value: ``["body", "instance", "numbers", 1]``.
    """
    errors: list[InitErrorDetails] = []
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:  # a loop, not recursion: a deeply nested body cannot exhaust the stack
        loc, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            errors.append({"type": "finite_number", "loc": loc, "input": item})
        elif isinstance(item, str) and not _is_text(item):
            errors.append({"type": _NOT_TEXT, "loc": loc, "input": _shown(item)})
        elif isinstance(item, dict):
            errors += [
                {"type": _NOT_TEXT, "loc": (*loc, _shown(k)), "input": _shown(k)}
                for k in item
                if isinstance(k, str) and not _is_text(k)
            ]
            # A location is echoed in the 422 (UTF-8 too): a key as it can be shown.
            keys = [
                _shown(k) if isinstance(k, str) else k if isinstance(k, int) else str(k)
                for k in item
            ]
            # reversed: popped from the end, so the errors come out in document order
            stack += reversed([((*loc, k), v) for k, v in zip(keys, item.values(), strict=True)])
        elif isinstance(item, list | tuple):
            stack += reversed([((*loc, i), v) for i, v in enumerate(item)])
    if errors:
        raise ValidationError.from_exception_data("non-finite numbers", errors)
    return value


Instance = Annotated[
    dict[str, Any], AfterValidator(_require_data_source), AfterValidator(reject_non_finite)
]
SamplingParamsIn = Annotated[dict[str, Any], AfterValidator(reject_non_finite)]

# A job id travels in a URL path (GET /v1/rollouts/{job_id}) and in log lines, so it holds no
# slash, space or control character, and does not start with a dot (``.`` and ``..`` are path
# steps that clients resolve away).
JobId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*$",
        description="Letters, digits and `._:@-` (not first: `.`), 1 to 200 of them.",
    ),
]

_HOST_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
# What a backend URL may be, as one ECMA-262 pattern for the OpenAPI document (so a client, or a
# fuzzer, knows what is valid) that the check below also holds a URL to: an optional http(s)
# scheme, a host, an optional port (1-65535) and an optional path of URL characters. A host is a
# dotted IPv4 address, a bracketed IPv6 address, or a name whose last label starts with a letter:
# httpx reads any host of four digit runs (1-2-3-4, 999.1.1.1) as an IPv4 address and fails.
# The one refusal it cannot say: an xn-- label that is not valid punycode.
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV6 = "|".join(
    [
        f"(?:{_H16}:){{7}}{_H16}",
        *(f"(?:{_H16}:){{1,{n}}}(?::{_H16}){{1,{7 - n}}}" for n in range(1, 7)),
        f"(?:{_H16}:){{1,7}}:",
        f":(?::{_H16}){{1,7}}",
        "::",
    ]
)
_PORT = "(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
BACKEND_URL_PATTERN = (
    "^(?:https?://)?"
    f"(?:(?:[A-Za-z0-9_-]{{1,63}}\\.)*[A-Za-z][A-Za-z0-9_-]{{0,62}}\\.?"
    f"|(?:{_OCTET}\\.){{3}}{_OCTET}|\\[(?:{_IPV6})\\])"
    f"(?::{_PORT})?(?:/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?$"
)
_BACKEND_URL = re.compile(BACKEND_URL_PATTERN)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def check_backend_url(address: str) -> str:
    """``address`` itself when it can name an inference server (``http://host:8000``,
    ``host:8000``, ``https://host/prefix/v1``); otherwise a ValueError saying what is wrong.

    Checked where a backend is added (the API, ``--llm``): a URL the HTTP client cannot use
    would otherwise fail on every request and health check made to it.
    """
    url = address.strip()
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError("must not contain spaces or control characters")
    # A scheme is what comes before the first "://" when that follows letters only: in
    # host/a://b, "://" is in the path.
    scheme_given = _SCHEME.match(url) is not None
    try:
        parts = urlsplit(url if scheme_given else "http://" + url)
    except ValueError as e:
        raise ValueError(f"not a URL: {e}") from None
    scheme = url.split("://", 1)[0] if scheme_given else "http"
    if scheme not in ("http", "https"):  # as written: HTTP:// is not one (see llm.base_url)
        raise ValueError(f"must be an http:// or https:// URL, not {scheme}://")
    if parts.query or parts.fragment:
        raise ValueError("must be a base URL, without a ?query or #fragment")
    try:
        _ = parts.port  # parsing it is the check
    except ValueError as e:
        raise ValueError(f"bad port: {e}") from None
    host = parts.hostname
    if not host:
        raise ValueError("has no host")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bad IPv6 address {host!r}") from None
        return address
    for label in host.removesuffix(".").split("."):
        if not _HOST_LABEL.match(label):
            raise ValueError(
                f"bad host {host!r}: labels of 1-63 ASCII letters, digits, '-' or '_'"
                " (punycode for other names)"
            )
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise ValueError(f"bad host {host!r}: {label!r} is not valid punycode") from None
    if not _BACKEND_URL.fullmatch(address):
        raise ValueError(
            "must be [http(s)://]HOST[:PORT][/PATH]: HOST an IPv4 address, [an IPv6 one] or a"
            " name whose last label starts with a letter, PORT 1-65535, PATH of URL characters"
        )
    return address


BackendUrl = Annotated[
    str,
    Field(min_length=1, json_schema_extra={"pattern": BACKEND_URL_PATTERN}),
    AfterValidator(check_backend_url),
]


def _integral(value: Any) -> Any:
    """5.0 as 5: JSON Schema's integer is a number without a fraction, however written."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer of a strict request: 5 or 5.0, never true or "5"; at least 1 for a Capacity (its
# bound inside, so the document says it).
JsonInt = Annotated[int, BeforeValidator(_integral)]
Capacity = Annotated[int, Field(ge=1), BeforeValidator(_integral)]


class _Strict(BaseModel):
    # Strict: a field takes its own JSON type, as the document says (not "5" or true for an
    # integer, "1.5" for a number).
    model_config = ConfigDict(extra="forbid", strict=True)


class _Request(_Strict):
    """A submission: every number in it must be finite (``timeout_s`` of NaN or Infinity is a
    422, not a job that never times out); free-form fields are checked by reject_non_finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Branch(_Strict):
    """Where a branch starts: an earlier job of this server and a turn of it."""

    job_id: JobId = Field(description="The job to branch from (it kept snapshots).")
    turn: Annotated[int, Field(ge=1), BeforeValidator(_integral)] = Field(
        description="Turns 1..turn of that job are the branch's start (not generated again)."
    )


class RolloutRequest(_Request):
    instance: Instance = Field(
        description="The task instance; `data_source` picks the task handler."
    )
    sampling_params: SamplingParamsIn = Field(
        default_factory=dict, description="Passed to the task (and its LLM calls)."
    )
    job_id: JobId | None = Field(
        default=None,
        description="Idempotency key: resubmitting the same job_id returns the same job.",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Budget of time inside stages (queue waits not counted)."
    )
    priority: JsonInt = Field(default=0, description="Higher runs first within each stage queue.")
    group: JobId | None = Field(
        default=None,
        description="A group of rollouts of one task (GRPO's n samples of a prompt): the jobs"
        " in flight on a server that name the same group and the same instance run the task's"
        " INIT once, and each starts from a fork of its result (its sandbox copied as it was"
        " after INIT); each stays a job of its own (its id, result and retries: a failed one"
        " is forked again). Where the task or the sandbox cannot fork, each runs INIT itself.",
    )
    branch: Branch | None = Field(
        default=None,
        description="Start from an earlier job's state after a turn: its token prefix (ids,"
        " loss_mask and logprobs of turns 1..turn, not generated again), its conversation and"
        " its sandbox as it was after that turn. That job must have been submitted with"
        " `sampling_params.keep_snapshots` and the snapshot still kept; otherwise a 422 names"
        " what is missing (`branch.job_id`, `branch.turn`). The instance must be that job's.",
    )


class BatchRequest(_Request):
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
    kind: ErrorKind = Field(
        default="infra",
        description="infra: not the model's doing (retried up to the attempt limit);"
        " policy: what the model did (never retried).",
    )
    stage: StageName | None = Field(default=None, description="The stage it happened in.")


# The policy (weight) version of a turn's generated tokens, in its record (``Trajectory.turns``):
# ``policy_version``, an int where every token of the turn was sampled under one version (null
# where the backend says nothing of its weights), or ``policy_versions``, one int a generated
# token, where a weight update landed mid-generation. A record has one of the two keys.
POLICY_VERSION = "policy_version"
POLICY_VERSIONS = "policy_versions"


def policy_version_fields(versions: list[int] | None) -> dict[str, Any]:
    """What a turn record says of the versions of its tokens (see POLICY_VERSION)."""
    if versions and len(set(versions)) > 1:
        return {POLICY_VERSIONS: list(versions)}
    return {POLICY_VERSION: versions[0] if versions else None}


def turn_policy_versions(turn: dict[str, Any]) -> list[int]:
    """The distinct policy versions a turn record names, oldest first (none where unknown)."""
    many = turn.get(POLICY_VERSIONS)
    if isinstance(many, list):
        return sorted({v for v in many if isinstance(v, int)})
    one = turn.get(POLICY_VERSION)
    return [one] if isinstance(one, int) and not isinstance(one, bool) else []


class Trajectory(BaseModel):
    """What a rollout produced so far, as the trainer receives it; also the token record a
    rollout writes as it goes (the agent loop's, each gateway segment's).

    A task appends to it as it goes (the agent loop writes into the one it is given), so that a
    job that is cancelled or runs out of time still returns everything produced before that
    point. Token-level fields stay empty for tasks that need no model (the scripted countdown
    task).

    The invariant the trainer relies on (``invariant_error`` says how it is broken): every prompt
    given to the model is a prefix of ``ids``, so nothing it saw was re-tokenized or rewritten;
    ``response_ids``, ``loss_mask`` and ``logprobs`` have one entry a token; the mask is 0 or 1;
    every logprob is finite. The pipeline checks it when it writes a job's result.
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
    turns: list[dict[str, Any]] = Field(
        default_factory=list,
        description="One record a model call: its backend, token counts, timings, text, tool "
        "calls, and `policy_version` (the weight version its tokens were sampled under; null "
        "where the backend says nothing) or `policy_versions` (one a generated token, where a "
        "weight update landed mid-generation).",
    )
    stop_reason: str | None = None
    # The prompts given to the model, in process only (never on the wire). Each one is checked to
    # extend the one before when it is given, so only the last is kept: a copy of every prompt
    # would grow with the square of a long rollout.
    _prompts: int = PrivateAttr(default=0)
    _last_prompt: list[int] = PrivateAttr(default_factory=list)
    _broken: str | None = PrivateAttr(default=None)  # the first prompt found rewritten

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def next_prompt(self) -> list[int]:
        """The ids as they stand, recorded as a prompt given to the model."""
        prompt = self.ids
        if self._broken is None and prompt[: len(self._last_prompt)] != self._last_prompt:
            self._broken = _not_a_prefix(self._prompts - 1)
        self._prompts += 1
        self._last_prompt = prompt
        return prompt

    def add_generated(self, token_ids: list[int], logprobs: list[float]) -> None:
        """Tokens the policy generated (loss_mask 1), with their logprobs."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
        self.response_ids += token_ids
        self.loss_mask += [1] * len(token_ids)
        self.logprobs += logprobs

    def add_inserted(self, token_ids: list[int]) -> None:
        """Tokens the environment inserted (loss_mask 0, logprob 0.0): templates, observations."""
        self.response_ids += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)

    def invariant_error(self) -> str | None:
        """How this trajectory breaks the invariant (see the class), or None where it holds."""
        if self._broken is not None:
            return self._broken
        last = self._last_prompt
        if self.ids[: len(last)] != last:
            return _not_a_prefix(self._prompts - 1)
        lengths = len(self.response_ids), len(self.loss_mask), len(self.logprobs)
        if len(set(lengths)) > 1:
            return "{} response_ids but {} loss_mask and {} logprobs".format(*lengths)
        if any(m not in (0, 1) for m in self.loss_mask):
            return "loss_mask holds values other than 0 and 1"
        if not self.finite_logprobs():
            return "logprobs holds values that are not finite numbers"
        return None

    def policy_version_range(self) -> tuple[int, int] | None:
        """The oldest and newest policy version of the generated tokens, from the turn records;
        None where no turn has one."""
        versions = [v for turn in self.turns for v in turn_policy_versions(turn)]
        return (min(versions), max(versions)) if versions else None

    def policy_version_span(self) -> int | None:
        """The newest policy version of the generated tokens minus the oldest: how many weight
        updates landed while the trajectory was generated (the staleness of its oldest token
        against its newest); None where no turn names a version (not 0: it is not known)."""
        span = self.policy_version_range()
        return None if span is None else span[1] - span[0]

    def token_policy_versions(self, segment: int = 0) -> list[int | None] | None:
        """One entry a response token: the policy version that generated it, None on a token
        the environment inserted (or whose turn names no version). None as a whole where the
        turn records do not account for the generated tokens (their ``output_tokens`` do not
        add up to the tokens with loss mask 1), so no token is given another's version. A
        record naming another ``segment`` than this trajectory's is skipped (a gateway job's
        result trajectory, its first segment, holds every call's record)."""
        versions: list[int | None] = []
        for turn in self.turns:
            if turn.get("segment", segment) != segment:
                continue
            count = turn.get("output_tokens")
            if not isinstance(count, int) or isinstance(count, bool):
                return None
            many = turn.get(POLICY_VERSIONS)
            if isinstance(many, list) and len(many) == count:
                versions += [v if isinstance(v, int) else None for v in many]
            else:
                one = turn.get(POLICY_VERSION)
                known = isinstance(one, int) and not isinstance(one, bool)
                versions += [one if known else None] * count
        if len(versions) != sum(1 for m in self.loss_mask if m == 1):
            return None
        generated = iter(versions)
        return [next(generated) if m == 1 else None for m in self.loss_mask]

    def finite_logprobs(self) -> bool:
        """Whether every logprob is a finite number (JSON holds no other: NaN is written null)."""
        return all(_finite(lp) for lp in self.logprobs)

    def malformed_tool_calls(self) -> int:
        """Tool calls the model wrote that the parser could not read, over every turn (each
        turn's ``format_errors``; a gateway job's turns are every segment's calls)."""
        return sum(len(t.get("format_errors") or ()) for t in self.turns)


def _not_a_prefix(prompt: int) -> str:
    return f"prompt {prompt} given to the model is not a prefix of the trajectory's ids"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


class Timing(BaseModel):
    queue_s: float
    init_s: float
    run_s: float
    eval_s: float
    total_s: float


class Resume(BaseModel):
    """How a job that was in flight when the server stopped went on after its restart."""

    resumed_at_turn: int | None = Field(
        default=None,
        description="The turns it went on from (their tokens were not generated again); null"
        " where it ran from the start.",
    )
    lost: list[str] = Field(
        default_factory=list,
        description="What of its sandbox could not come back: processes it had started, an"
        " IPython kernel's memory, parts of the shell's state.",
    )
    refused: str | None = Field(
        default=None,
        description="Why it ran from the start although it had checkpoints (what shapes the"
        " rollout changed; its checkpoints could not be read back).",
    )


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
    data_source: str = Field(
        description="The instance's own data_source, as submitted (a dataset name such as"
        " `openai/gsm8k` stays that)."
    )
    task: str | None = Field(
        default=None,
        description="The raas task that ran the job (`math` for `openai/gsm8k`); null when no"
        " task took it.",
    )
    attempts: int = Field(
        default=1,
        description="How many times the job ran: more than 1 after infra failures or restarts.",
    )
    attempt_errors: list[ErrorInfo] = Field(
        default_factory=list,
        description="Why each earlier attempt was run again, oldest first.",
    )
    resume: Resume | None = Field(
        default=None,
        description="Set for a job that was in flight when the server stopped and had"
        " checkpoints: the turn it resumed at, or why it did not.",
    )


class ExportedResult(RolloutResult):
    """A row of an export (``GET /v1/rollouts:export``, ``raas export``): the result under the id
    its own tenant knows the job by, and that tenant named beside it."""

    tenant: str | None = Field(
        default=None,
        description="The tenant whose job it is; null for the admin's own jobs (tenant `default`),"
        " so for every job of a server without tenants. With `job_id`, it names the job.",
    )


class JobStatus(BaseModel):
    job_id: str
    state: JobStateName
    stage: StageName | None = Field(
        default=None, description="The stage the job is in or waits for, while in flight."
    )
    result: RolloutResult | None = None


class RunningJob(BaseModel):
    """A job in flight, as ``GET /v1/rollouts:running`` lists it."""

    job_id: str
    data_source: str
    instance_id: str | None = None
    task: str | None = Field(default=None, description="The raas task that runs it.")
    state: JobStateName = Field(description="queued, init, run or eval.")
    stage: StageName | None = None
    turns: int = Field(description="Agent turns taken so far (this attempt).")
    prompt_tokens: int = Field(
        default=0,
        description="The first prompt's tokens, known once RUN has rendered it.",
    )
    response_tokens: int = Field(
        description="Response tokens so far (this attempt; a gateway job's every segment), with"
        " those of the turn being generated where its backend streams (vLLM, raas engine);"
        " an SGLang or verl turn's come when it ends."
    )
    elapsed_s: float = Field(description="Since it was submitted.")
    attempts: int = 1


class RunningPage(BaseModel):
    jobs: list[RunningJob]


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
    images_version: str | None = Field(
        default=None,
        description="Names the list of images the image store of the server's node holds (GET"
        " /v1/images): it changes whenever the list does, so a client reads the list again only"
        " then. Null from a server that reports no images.",
    )


class NodeImages(BaseModel):
    """The images the image store of a server's node holds: a client sends a job whose instance
    names one of them to this server rather than to one that lacks it."""

    version: str = Field(description="The `images_version` of /v1/status this list goes with.")
    images: list[str] = Field(
        description="Their names as the store keys them (`docker.io/library/ubuntu:latest`),"
        " sorted."
    )


# -- the dashboard's own routes (/v1/dashboard/...): what /v1/rollouts and /v1/status lack -------


class JobSummary(BaseModel):
    """A finished job as the dashboard lists it: the result without its trajectory."""

    job_id: str
    state: JobStateName
    data_source: str
    task: str | None = None
    instance_id: str | None = None
    reward: float | None = None
    error_type: str | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = Field(default=None, description="Cut at 300 characters.")
    stage_failed: StageName | None = None
    stop_reason: str | None = None
    judge_note: str | None = Field(
        default=None,
        description="Why the judge scored a job below a pass: its `metrics.reason` (results"
        " stored before judges gave one: a verifier's or judge's error, a failing case, the"
        " answer a math judge read).",
    )
    tamper: str | None = Field(
        default=None,
        description="Why the judge scored the job 0 as tampering (a twin of a deciding test"
        " passed), cut at 300 characters; null where it did not.",
    )
    turns: int
    response_tokens: int
    total_s: float | None = Field(default=None, description="Seconds from submission to result.")
    attempts: int = 1
    finished_at: float = Field(description="Unix time the result was written.")


class JobSummaryPage(BaseModel):
    jobs: list[JobSummary] = Field(description="Newest first.")
    next_before: int | None = Field(
        description="Pass as `before` for the older jobs; null when this page is the last."
    )


class FailureCount(BaseModel):
    type: str = Field(description="The error's type (`NoBackendAvailable`, `JobTimeout`...).")
    kind: ErrorKind
    count: int


class Throughput(BaseModel):
    window_s: float
    finished: int = Field(description="Jobs finished in the window.")
    response_tokens: int = Field(description="Response tokens of those jobs.")


class SourceStats(BaseModel):
    """One data_source's finished jobs, in the whole database."""

    data_source: str = Field(description="Empty for jobs stored without one.")
    finished: dict[str, int] = Field(description="Finished jobs by state.")
    rewarded: int = Field(description="Finished jobs with a reward.")
    mean_reward: float | None = Field(description="Over the rewarded jobs.")
    pass_rate: float | None = Field(description="The share of them whose reward is 1 or more.")
    finished_recently: int = Field(description="Jobs of it that finished in the last 10 minutes.")


class Distributions(BaseModel):
    """How the last finished jobs ended and how long they ran (the dashboard's histograms)."""

    jobs: int = Field(description="How many finished jobs these count (the last ones).")
    stop_reasons: dict[str, int] = Field(
        description="Jobs by the trajectory's stop_reason, most first (finish, length,"
        " max_turns, ...; a failed job without one by its state; `none`: no agent loop)."
    )
    turns: list[int] = Field(description="Jobs by turns taken: the count of k turns at index k.")
    response_tokens_bin: int = Field(description="The width of a response-length bin, tokens.")
    response_tokens: list[int] = Field(
        description="Jobs by response tokens: bin i holds lengths from i * bin to (i+1) * bin."
    )
    groups: int = Field(
        default=0,
        description="Groups (the request's `group`: GRPO's samples of a prompt) with two or"
        " more rewarded jobs among these.",
    )
    groups_all_equal: int = Field(
        default=0,
        description="Those whose rewards are all equal: a zero advantage, so GRPO learns"
        " nothing from them (DAPO's dynamic sampling drops them).",
    )


class DashboardStats(BaseModel):
    """What the database says: every result, from this process and the ones before it."""

    finished: dict[str, int] = Field(description="Finished jobs by state.")
    failures: list[FailureCount] = Field(description="Finished jobs by error, most first.")
    throughput: list[Throughput] = Field(description="Over the last minute and 10 minutes.")
    data_sources: list[str] = Field(description="Every data_source a job was submitted with.")
    rewarded: int = Field(default=0, description="Finished jobs with a reward.")
    mean_reward: float | None = Field(default=None, description="Over the rewarded jobs.")
    pass_rate: float | None = Field(
        default=None, description="The share of rewarded jobs whose reward is 1 or more."
    )
    sources: list[SourceStats] = Field(
        default_factory=list, description="The same, by data_source, with each one's rate."
    )


class DashboardSeries(BaseModel):
    """What finished over the server's recent past (at most ``keep`` buckets back): one value a
    bucket of ``bucket_s`` seconds, oldest first, in columns as a plot takes them. Counted in
    memory as jobs finish, and filled at the server's start from the results the database holds
    for that span, so a restart keeps them."""

    bucket_s: float
    t: list[float] = Field(description="Each bucket's start, Unix time.")
    finished: list[int] = Field(description="Jobs finished in the bucket.")
    rollouts_per_min: list[float]
    generated_tokens_per_s: list[float] = Field(
        description="Tokens the model generated (loss mask 1) of the jobs that finished."
    )
    rewarded: list[int] = Field(description="Finished jobs with a reward.")
    reward_mean: list[float | None] = Field(description="Null where none was rewarded.")
    pass_rate: list[float | None] = Field(description="Share of the rewarded with reward >= 1.")
    stage_s: dict[StageName, list[float | None]] = Field(
        description="Mean seconds of the stage runs that ended in the bucket (null: none)."
    )
    errors: dict[ErrorKind, list[int]] = Field(
        description="Errors that ended a run of a job (its last, or one run again), by kind."
    )
    malformed_tool_calls: list[int] = Field(
        description="Tool calls the parser could not read, in the jobs that finished."
    )
    staleness_mean: list[float | None] = Field(
        description="Mean policy version span of the jobs that finished: each one's newest"
        " token's policy version minus its oldest's (how many weight updates landed while it"
        " was generated; `policy_version_span` of the export). Null where no job of the bucket"
        " had a backend that names versions: such jobs add nothing, not 0.",
    )
    staleness_max: list[int | None] = Field(
        description="The largest such span in the bucket (null: none known)."
    )


class TokenView(BaseModel):
    """A job's trajectory token by token (the result's, or a running job's so far), each token's
    text decoded with the server's tokenizer: a character spread over several tokens is shown
    on its last one."""

    job_id: str
    state: JobStateName
    segment: int = Field(default=0, description="Which segment these tokens are (a gateway job's).")
    segments: int = Field(
        default=1,
        description="How many segments the job has: a gateway job's calls that did not extend"
        " each other's conversation start segments of their own (`?segment=N`).",
    )
    tokenizer: str | None = Field(description="What decoded the texts; null when none could.")
    note: str | None = Field(default=None, description="Why the texts are missing, if they are.")
    prompt_ids: list[int]
    prompt_text: list[str | None] | None = Field(
        description="One per prompt id (null for an id the tokenizer does not know)."
    )
    response_ids: list[int]
    response_text: list[str | None] | None
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int | None] | None = Field(
        default=None,
        description="One per response token: the policy version that generated it (null on "
        "inserted tokens and where the backend named none); null as a whole where the turn "
        "records do not account for the generated tokens. A token's staleness is how far it "
        "is behind the newest.",
    )


# A ProRL instance may leave data_source out (ProRL Agent's server reads it as "swebench") and
# may name a task the ProRL way ("swebench", "deepcoder_lcb", "codecontests"...): the /process
# route maps those names to raas tasks, so only the finite-number check happens here.
ProRLInstance = Annotated[dict[str, Any], AfterValidator(reject_non_finite)]


class ProcessRequest(_Request):
    """ProRL Agent's ``/process`` body, as its trainer integration and NeMo Gym's prorl agent
    build it."""

    instance: ProRLInstance = Field(
        description="The task instance. `data_source` picks the task (raas's names, or ProRL's:"
        " `swebench` and no data_source at all mean `swe`; `deepcoder*`, `codecontests`,"
        " `apps`, `codeforces`, `taco` mean `code`; `deepscaler` means `math`)."
    )
    sampling_params: SamplingParamsIn = Field(
        default_factory=dict,
        description="raas's keys, and every key of ProRL's LLM and agent config:"
        " `max_iterations` is `max_turns`, `max_output_tokens` is `max_tokens` (per turn),"
        " `max_model_len` is `max_context_tokens`; keys raas has no use for (model, api_key,"
        " tokenizer and tool-calling flags...) are accepted and listed in the answer's"
        " `metrics.prorl`. A key neither knows is a 422 naming it.",
    )
    job_id: JobId | None = Field(
        default=None,
        description="A name for `/cancel`, as in ProRL: every /process call is a new rollout,"
        " whose job_id (in the answer) is this name when no job has it yet, else the name plus"
        " `@` and a unique suffix.",
    )


class CancelRequest(_Strict):
    job_id: JobId


BackendProtocol = Literal["vllm", "sglang", "verl"]


class LLMServerRequest(_Strict):
    address: BackendUrl = Field(description="Base URL of an inference server.")
    protocol: BackendProtocol | None = Field(
        default=None, description="Defaults to the server's --llm-protocol."
    )
    capacity: Capacity | None = None


class BackendIn(_Strict):
    url: BackendUrl = Field(description="Base URL (a trailing /v1 is fine).")
    protocol: BackendProtocol = "vllm"
    capacity: Capacity = Field(default=8, description="Concurrent sessions it is sized for.")
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


class PauseIn(_Strict):
    """A weight sync's pause of a server's backend pool (``POST /v1/backends:pause``)."""

    mode: Literal["keep", "abort"] = Field(
        default="keep",
        description="keep: generations in flight wait in their server (vLLM's keep, SGLang's"
        " retract) and go on under the new weights; abort: the servers end them with the tokens"
        " so far, and raas resumes each from that prefix after the resume. A server without a"
        " pause route is drained (its requests in flight finish) either way.",
    )
    resume_after_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="The pool resumes by itself after this long (a trainer that died mid-sync).",
    )


class PauseOut(BaseModel):
    backends: dict[str, Literal["paused", "drained"]] = Field(
        description="Each backend's URL: paused through its own route, or drained."
    )


class Ack(BaseModel):
    ok: bool = True
    message: str = ""


# -- ProRL Agent's /process answer ----------------------------------------------------------------


class ProRLMessage(BaseModel):
    """One message of a ProRL answer, as ProRL's clients read it.

    ``token_ids`` is never null: concatenated over all messages they are exactly the
    trajectory's ``prompt_ids + response_ids``. An assistant message holds the tokens the model
    generated, ``input_ids`` the prompt it saw and ``logprobs`` one per generated token; a run
    of other messages (system + user, or a turn's tool observations) holds the tokens the
    environment inserted on its first message (``[]`` on the rest), with ``input_ids`` and
    ``logprobs`` null, as ProRL sends them. When the rollout left no turn records to split by,
    every ``token_ids`` is ``[]``.
    """

    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None,
        description="An assistant message's parsed calls, flattened: {name, arguments}.",
    )
    token_ids: list[int] = Field(default_factory=list)
    input_ids: list[int] | None = None
    logprobs: list[float] | None = None


class ProRLTiming(BaseModel):
    """ProRL's timing keys: seconds in each stage, ``others`` for everything else (queues)."""

    init_time: float
    run_time: float
    eval_time: float
    others_time: float
    counted_elapsed: float = Field(description="init + run + eval: what the time budget counts.")
    timeout_triggered: bool


class ProRLResult(BaseModel):
    """What ``/process`` answers: every field ProRL Agent's trainer integration and NeMo Gym's
    prorl agent read, with the types they expect, and raas's own (job_id, state, metrics...).

    A job's failure is still an answer, never an HTTP error: ``critical_error`` names what
    ProRL calls an environment failure (an ``infra`` error's stage, or ``timeout`` for a
    timed-out or cancelled job), and ``filter`` says the trajectory should not be trained on.
    """

    instance_id: str | int | None = Field(description="The instance's, as sent.")
    trajectory_id: str | int | None = Field(description="The instance's, as sent.")
    git_patch: str | None = Field(description="The agent's diff (swe), else null.")
    success: bool = Field(description="The job finished without an error.")
    finish: bool = Field(description="The model called finish.")
    messages: list[ProRLMessage]
    tools: list[dict[str, Any]] = Field(description="The tool schemas the model was shown.")
    end_properly: bool = Field(
        description="The last turn was neither cut at max_tokens nor a malformed tool call."
    )
    resolved: bool
    reward: float | None = None
    critical_error: Literal["init", "run", "eval", "timeout"] | None = None
    filter: bool
    error: str | None = Field(default=None, description="`type: message`, or null.")
    timing: ProRLTiming
    job_id: str
    state: JobStateName
    stage_failed: StageName | None = None
    error_kind: ErrorKind | None = None
    attempts: int = 1
    data_source: str = Field(description="The row's own (ProRL's default: swebench).")
    task: str | None = Field(default=None, description="The raas task that ran it.")
    metrics: dict[str, Any] = Field(
        default_factory=dict,
        description="The task's metrics; `prorl` lists the sampling_params raas did not use"
        " (api keys redacted) and the ones it renamed.",
    )


class TenantUsage(BaseModel):
    """What one tenant used over a period (GET /v1/usage)."""

    tenant: str
    submitted: int = Field(default=0, description="Jobs accepted.")
    finished: dict[str, int] = Field(
        default_factory=dict, description="Jobs finished, by final state."
    )
    stage_s: dict[str, float] = Field(
        default_factory=dict, description="Seconds inside each stage (init, run, eval)."
    )
    sandbox_s: float = Field(
        default=0.0, description="Seconds finished jobs held a sandbox (INIT to cleanup)."
    )
    tokens_in: int = Field(default=0, description="LLM prompt tokens of finished jobs.")
    tokens_out: int = Field(default=0, description="LLM tokens generated in finished jobs.")


class UsageReport(BaseModel):
    since_s: float = Field(
        description="The period covered, back from now: the one asked, or less where the server"
        " has not been up (or kept usage) that long."
    )
    tenants: list[TenantUsage] = Field(description="Each tenant that used anything, by name.")
