"""verl and raas, the parts that need no verl: dataset rows to raas requests, raas results to
the fields of verl's ``AgentLoopOutput``, and verl's rollout servers as raas backends.

``raas.client.integrations.verl`` (the agent loop verl instantiates) is built on these; they are
here, apart from it, so that they import and are tested without verl installed.

Backends: verl starts its own inference servers (vLLM or SGLang replicas, one address
``host:port`` each, ``LLMServerManager.get_addresses()``) and syncs its own weights into them
after every step. raas only routes: :func:`register_verl_servers` adds those addresses to one or
more raas servers' backend pools (``POST /v1/backends``), :func:`clear_raas_backends` removes
every backend (``POST /clear_llm_server``), and :func:`routing_paused` pauses raas's routing
around a weight sync (see :mod:`raas.client.backends_paused`: no rollout fails or is cut by it)
and registers the addresses again after it. raas never loads, pushes or syncs weights for verl.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from raas.client.backends_paused import backends_paused
from raas.client.backends_paused import post_json as _post
from raas.client.sample_choices import (
    DEFAULT_TRUNCATED,
    TRUNCATED_CHOICES,
    TruncatedChoice,
    check_choice,
    check_truncated_reward,
    truncated_outcome,
)
from raas.client.segments import SegmentChoice, check_segments, trajectories
from raas.wire import RolloutResult, Trajectory

log = logging.getLogger(__name__)

# The sampling keys verl's AgentLoopWorker passes that raas takes as they are.
_PASSED = ("temperature", "top_p", "top_k")
# Keys verl passes that have no raas counterpart: logprobs always come back from raas.
_DROPPED = ("logprobs", "repetition_penalty")

# What a job that did not end done becomes in verl (see raas.client.sample_choices for the
# shared choices): "drop", no sample (verl's V1 worker leaves a session that returns none out of
# its group's GRPO statistics); "zero", a sample with reward 0.0 and no gradient, which verl's
# GRPO still counts in its group's mean and std (biased: the legacy worker's only way to go on);
# "raise", RaasRolloutFailed.
OnFailure = Literal["drop", "zero", "raise"]
ON_FAILURE: tuple[OnFailure, ...] = ("drop", "zero", "raise")
DEFAULT_ON_FAILURE: OnFailure = "drop"


class RaasRolloutFailed(RuntimeError):
    """A raas job ended in another state than ``done`` and ``on_failure`` is ``raise`` (or
    ``drop``, which verl's legacy worker cannot do: ``advice`` says what to do instead)."""

    def __init__(self, result: RolloutResult, advice: str = "") -> None:
        self.result = result
        error = result.error
        why = f"{error.type} ({error.kind}): {error.message}" if error else "no error recorded"
        more = f"; {advice}" if advice else ""
        super().__init__(f"raas job {result.job_id} ended {result.state}: {why}{more}")


def plain(value: Any) -> Any:
    """``value`` as plain JSON-able Python: numpy arrays and scalars (verl's non-tensor batch is
    numpy object arrays), OmegaConf containers (hydra passes config values as those) and tuples
    become lists, dicts and Python numbers."""
    module = type(value).__module__
    if module.startswith("omegaconf"):
        from omegaconf import OmegaConf  # present wherever such a value came from

        return plain(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if module == "numpy" and hasattr(value, "tolist"):  # an ndarray or a scalar (.item())
        return plain(value.tolist())
    return value


def row_to_instance(
    row: Mapping[str, Any], tasks: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The raas task instance for one verl sample (the keyword arguments verl's agent loop gets).

    A row with a ``raas_instance`` column (a dict) is sent as that instance, unchanged. Otherwise
    the row goes as verl holds it: its ``data_source`` (the server knows verl's dataset names and
    runs each as one of its tasks; ``tasks`` renames one's own, exactly), the chat messages
    (``raw_prompt``, else ``prompt``) as ``prompt``, ``reward_model``, ``ability`` and
    ``extra_info``, and ``instance_id`` ``<data_source>-<extra_info.index>`` when there is one.
    """
    own = plain(row.get("raas_instance"))
    if own:
        if not isinstance(own, dict):
            raise ValueError("raas_instance must be a dict (a raas task instance)")
        return own
    source = plain(row.get("data_source"))
    if not isinstance(source, str) or not source:
        raise ValueError("a verl row needs a data_source to choose the raas task")
    messages = plain(row["raw_prompt"] if row.get("raw_prompt") is not None else row.get("prompt"))
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    instance: dict[str, Any] = {
        "data_source": (tasks or {}).get(source, source),
        "prompt": messages,
    }
    for key in ("reward_model", "ability", "extra_info"):
        value = plain(row.get(key))
        if value:
            instance[key] = value
    extra = instance.get("extra_info")
    if isinstance(extra, dict) and extra.get("index") is not None:
        instance["instance_id"] = f"{source}-{extra['index']}"
    return instance


def sampling_params_for(
    verl_params: Mapping[str, Any],
    *,
    prompt_length: int,
    response_length: int,
    max_turns: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """raas ``sampling_params`` from what verl passes to ``AgentLoopBase.run``.

    ``temperature``, ``top_p`` and ``top_k`` pass (verl's greedy validation: temperature 0);
    ``logprobs`` is dropped (raas always returns them) and so is ``repetition_penalty`` (raas has
    none: a value other than 1.0 is logged). Each turn may generate up to ``response_length``
    tokens, and the conversation may grow to ``prompt_length + response_length`` tokens in all
    (raas's ``max_context_tokens``), verl's own limits; ``max_turns`` is verl's
    ``multi_turn.max_assistant_turns`` when set. ``overrides`` (the agent loop config's
    ``sampling_params``) win over all of these.
    """
    params: dict[str, Any] = {}
    for key in _PASSED:
        if verl_params.get(key) is not None:
            params[key] = plain(verl_params[key])
    for key in ("temperature", "top_p"):
        if key in params:
            params[key] = float(params[key])
    if "top_k" in params:
        params["top_k"] = int(params["top_k"])
    penalty = verl_params.get("repetition_penalty")
    if penalty is not None and not math.isclose(float(penalty), 1.0):
        log.warning("raas has no repetition_penalty: %s is ignored", penalty)
    unknown = set(verl_params) - set(_PASSED) - set(_DROPPED)
    if unknown:
        log.debug("verl sampling params not passed to raas: %s", sorted(unknown))
    params["max_tokens"] = int(response_length)
    params["max_context_tokens"] = int(prompt_length) + int(response_length)
    if max_turns:
        params["max_turns"] = int(max_turns)
    params.update(plain(dict(overrides or {})))
    return params


_NOT_IN_JOB_ID = re.compile(r"[^A-Za-z0-9._:@-]")


def job_id_for(row: Mapping[str, Any]) -> str:
    """A fresh job id naming the row's index: ``verl-<index>-<12 hex>``.

    Fresh on every call: verl repeats each prompt ``rollout.n`` times, and pads validation
    batches with copies, and each of them is its own rollout.
    """
    extra = plain(row.get("extra_info")) or {}
    index = plain(row.get("index"))
    if index is None and isinstance(extra, dict):
        index = extra.get("index")
    tag = _NOT_IN_JOB_ID.sub("-", str(index))[:64] if index is not None else "x"
    return f"verl-{tag}-{uuid.uuid4().hex[:12]}"


@dataclass
class VerlSample:
    """One rollout as verl's ``AgentLoopOutput`` takes it (lists, not tensors)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    num_turns: int
    generate_s: float
    tools_s: float
    eval_s: float
    truncated: bool
    failed: bool
    raas: dict[str, Any] = field(default_factory=dict)


def result_to_sample(
    result: RolloutResult,
    *,
    prompt_length: int,
    response_length: int,
    fallback_prompt_ids: Sequence[int] = (),
    pad_token_id: int = 0,
    on_failure: OnFailure = "zero",
    trajectory: Trajectory | None = None,
    segment: int = 0,
    truncated: TruncatedChoice = DEFAULT_TRUNCATED,
    truncated_reward: float = 0.0,
    job_cut: bool | None = None,
) -> VerlSample:
    """The verl sample for a finished raas job (for ``trajectory``, one of its gateway
    segments, numbered ``segment``, when given; :func:`result_to_samples` makes one a segment).

    - ``response_mask`` is raas's ``loss_mask``: 1 on tokens the policy generated, 0 on the
      tokens the environment inserted (tool observations, templates); logprobs stay aligned
      with ``response_ids`` (0.0 on inserted tokens).
    - The response is cut to verl's ``response_length`` (it can be longer when the prompt is
      shorter than ``prompt_length``: raas's limit is the context, prompt and response
      together), and the sample gets what ``truncated`` says (``"mask"``, the default: its own
      reward with a zero mask; ``"penalise"``: ``truncated_reward``; ``"keep"``: its own
      reward on the tokens verl sees; see :mod:`raas.client.sample_choices`). A prompt longer
      than ``prompt_length`` keeps its last ``prompt_length`` tokens, as verl's own agent
      loops do. ``job_cut`` says whether the job counts as truncated (another of its segments
      may be cut where this one is not); by default, whether this sample is cut.
    - A job that did not end ``done`` (failed, timed out, cancelled) raises
      :class:`RaasRolloutFailed` with ``on_failure="raise"``; otherwise it keeps what it
      produced with a zero mask and reward 0.0 (``"drop"`` is :func:`result_to_samples`'
      business: a dropped job has no sample).
    - verl cannot take an empty prompt or response: a job that failed before its first prompt
      gets ``fallback_prompt_ids``, and an empty response becomes one ``pad_token_id`` with
      mask 0.
    """
    traj = trajectory if trajectory is not None else result.trajectory
    failed = result.state != "done"
    if failed and on_failure == "raise":
        raise RaasRolloutFailed(result)
    prompt = list(traj.prompt_ids) or list(fallback_prompt_ids)
    if len(prompt) > prompt_length:
        log.warning(
            "raas job %s: prompt of %d tokens exceeds verl's prompt_length %d; left-truncating",
            result.job_id,
            len(prompt),
            prompt_length,
        )
        prompt = prompt[-prompt_length:]
    n = len(traj.response_ids)
    if not (len(traj.loss_mask) == len(traj.logprobs) == n):
        raise ValueError(
            f"raas job {result.job_id}: response_ids, loss_mask and logprobs differ in length"
            f" ({n}, {len(traj.loss_mask)}, {len(traj.logprobs)})"
        )
    cut = n > response_length
    response = list(traj.response_ids[:response_length])
    mask = [int(m) for m in traj.loss_mask[:response_length]]
    logprobs = [float(x) for x in traj.logprobs[:response_length]]
    reward = 0.0 if failed or result.reward is None else float(result.reward)
    masked = failed
    if (cut if job_cut is None else job_cut) and not failed:
        reward, masked = truncated_outcome(reward, truncated, truncated_reward)
    if masked:
        mask = [0] * len(mask)
    if not response:
        response, mask, logprobs = [pad_token_id], [0], [0.0]
    turns = traj.turns
    error = result.error
    return VerlSample(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward=reward,
        # verl counts chat turns: user, assistant and tool messages (not the system prompt).
        num_turns=sum(1 for m in traj.messages if m.get("role") != "system"),
        generate_s=sum(float(t.get("generate_s") or 0.0) for t in turns),
        tools_s=sum(float(t.get("tools_s") or 0.0) for t in turns),
        eval_s=result.timing.eval_s,
        truncated=cut,
        failed=failed,
        raas={
            "job_id": result.job_id,
            "state": result.state,
            "stop_reason": traj.stop_reason,
            "attempts": result.attempts,
            "error": error.model_dump() if error else None,
            "timing": result.timing.model_dump(),
            "truncated": cut,
            "truncated_as": None if failed or not (cut or job_cut) else truncated,
            "response_tokens": n,
            "segment": segment,
        },
    )


def result_to_samples(
    result: RolloutResult,
    *,
    segments: SegmentChoice = "all",
    prompt_length: int,
    response_length: int,
    fallback_prompt_ids: Sequence[int] = (),
    pad_token_id: int = 0,
    on_failure: OnFailure = DEFAULT_ON_FAILURE,
    truncated: TruncatedChoice = DEFAULT_TRUNCATED,
    truncated_reward: float = 0.0,
) -> list[VerlSample]:
    """The verl samples of a finished raas job: one for each gateway segment ``segments``
    picks (``"all"``, ``"first"``, ``"last"``; see :mod:`raas.client.segments`), each with the
    job's reward, or the one of a job without segments (see :func:`result_to_sample`); none
    for a job that did not end ``done`` with ``on_failure="drop"`` (the default).

    A job is truncated when any of its samples is cut to ``response_length``: then every one of
    its samples gets what ``truncated`` says, so a segment cut alone does not credit its job's
    others with the reward the unseen tokens earned."""
    on_failure = check_choice("on_failure", on_failure, ON_FAILURE)
    truncated = check_choice("truncated", truncated, TRUNCATED_CHOICES)
    truncated_reward = check_truncated_reward(truncated_reward)
    if result.state != "done" and on_failure == "drop":
        return []
    picked = trajectories(result, check_segments(segments))
    job_cut = any(len(traj.response_ids) > response_length for _, traj in picked)
    return [
        result_to_sample(
            result,
            prompt_length=prompt_length,
            response_length=response_length,
            fallback_prompt_ids=fallback_prompt_ids,
            pad_token_id=pad_token_id,
            on_failure=on_failure,
            trajectory=traj,
            segment=k,
            truncated=truncated,
            truncated_reward=truncated_reward,
            job_cut=job_cut,
        )
        for k, traj in picked
    ]


# -- backends --------------------------------------------------------------------------------


def protocol_for(rollout_name: str) -> str:
    """The raas backend protocol of a verl rollout (``actor_rollout_ref.rollout.name``)."""
    if rollout_name in ("vllm", "sglang"):
        return rollout_name
    raise ValueError(f"raas speaks vLLM's and SGLang's protocols, not {rollout_name!r}'s")


def _urls(raas_url: str | Sequence[str]) -> list[str]:
    return [raas_url] if isinstance(raas_url, str) else list(raas_url)


def register_verl_servers(
    raas_url: str | Sequence[str],
    addresses: Sequence[str],
    protocol: str = "vllm",
    capacity: int = 8,
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 30.0,
    locality: bool = True,
) -> list[dict[str, Any]]:
    """Add verl's rollout servers (``host:port`` addresses, as
    ``LLMServerManager.get_addresses()`` gives them) to each raas server's backend pool.

    Locality first: with one raas server per node, each gets the verl servers on its own host
    (same resolved address), so its rollouts never cross the network; a raas server with none on
    its host gets them all (as every raas server does with ``locality=False``). The same address
    again is the backend already there, so calling this again (after every weight sync, say) is
    harmless. ``capacity`` is the sessions each server is sized for (raas's least-loaded
    routing); ``model`` is vLLM's served model name when it is not the only one. Returns each
    raas server's answers (``BackendOut``), in order.
    """
    out = []
    for url in _urls(raas_url):
        for address in local_first(url, addresses) if locality else addresses:
            body = {"url": address, "protocol": protocol, "capacity": capacity, "model": model}
            out.append(_post(url, "/v1/backends", body, api_key, timeout_s))
    return out


def local_first(raas_url: str, addresses: Sequence[str]) -> list[str]:
    """The addresses on ``raas_url``'s host, or all of them when none is."""
    here = _host_ip(urlsplit(raas_url).hostname)
    local = [a for a in addresses if here is not None and _host_ip(_host(a)) == here]
    return local or list(addresses)


def _host(address: str) -> str | None:
    return urlsplit(address if "://" in address else f"http://{address}").hostname


def _host_ip(host: str | None) -> str | None:
    if not host:
        return None
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def clear_raas_backends(
    raas_url: str | Sequence[str], api_key: str | None = None, timeout_s: float = 30.0
) -> None:
    """Remove every backend of each raas server (``POST /clear_llm_server``).

    A job still in flight finds no backend on its next turn and fails as an infrastructure
    error (run again, up to the attempt limit): clear only while no rollout runs, as between
    verl's synchronous steps, where every agent loop has its result before training starts.
    """
    for url in _urls(raas_url):
        _post(url, "/clear_llm_server", None, api_key, timeout_s)


@contextmanager
def routing_paused(
    raas_url: str | Sequence[str],
    addresses: Sequence[str],
    api_key: str | None = None,
    mode: Literal["keep", "abort"] = "keep",
    **registration: Any,
) -> Iterator[None]:
    """Each raas server's routing paused inside the block (a weight sync), then resumed and
    ``addresses`` registered again, whatever happened inside; ``registration``: the other
    options of :func:`register_verl_servers` (``protocol``, ``capacity``, ``model``, ...)::

        with routing_paused(raas_url, manager.get_addresses(), protocol="vllm"):
            trainer.checkpoint_manager.update_weights(step)

    No generation starts inside the block, and each verl server is paused through its own route
    (``mode``, see :func:`~raas.client.backends_paused.backends_paused`) or drained: rollouts in
    flight wait, and go on after it (a generation a server aborted, from the tokens it had), so
    none fails or is cut because the weights changed."""
    try:
        with backends_paused(raas_url, mode, api_key):
            yield
    finally:
        register_verl_servers(raas_url, addresses, api_key=api_key, **registration)
