"""verl's agent loop (``verl.experimental.agent_loop``, verl 0.9) backed by raas.

``RaasAgentLoop`` is registered as ``raas_agent``. verl's ``AgentLoopWorker`` instantiates it
for each sample and calls ``run(sampling_params, **row)``; it sends the row to a raas server as
one job (:func:`~raas.client.integrations.verl_bridge.row_to_instance`: ``data_source`` picks the
raas task, ``reward_model.ground_truth`` is the answer), waits for the result and returns an
``AgentLoopOutput``: raas's prompt and response token ids, its loss mask as ``response_mask``
(0 on tool observations), its logprobs, its reward as ``reward_score`` (verl then computes no
reward of its own for the sample), the number of chat turns and where the time went.

A gateway job (an agent program raas did not write) of k segments is k samples, each with its
own prompt, response, mask and logprobs and the job's reward (``segments: all``, the default;
``first`` or ``last`` keeps one). verl's V1 trainer (``trainer.use_v1=true``, verl 0.9's
default: ``AgentLoopWorkerTQ``) takes a list of outputs from one ``run`` and stores each under
``{uid}_{session_id}_{index}``, in the prompt's GRPO group (its ``uid``), copying the last
output's reward to the others; ``run`` returns a list there. verl's legacy worker
(``AgentLoopWorker``, ``trainer.use_v1=false``) takes one output a row, and its trainer joins the
outputs row for row with the prompts it sent (``DataProto.union``), so a job of several
segments cannot become several samples there: ``run`` raises, saying so, unless ``segments`` is
``first`` or ``last``. (The V1 worker is told apart by the ``session_id`` it passes to ``run``.)

Honest samples: a job that did not end ``done`` is no sample by default (``on_failure: drop``),
which verl's V1 worker takes as a session left out of its group's GRPO mean and std; the legacy
worker cannot leave a row out, so it needs ``on_failure: zero`` (reward 0.0 in the group, said
to be biased) or ``raise``, or ``resubmit``. A response verl sees cut to its
``response_length`` gets what ``truncated`` says (``mask`` by default: no gradient, its reward
still in its group's statistics; ``penalise``; ``keep``). See :class:`RaasAgentLoop`.

verl's Ray workers import only verl, so the class is registered through an agent loop config
file (``actor_rollout_ref.rollout.agent.agent_loop_config_path``), whose entry also carries this
loop's settings (hydra passes the entry's keys to ``__init__``)::

    - name: raas_agent
      _target_: raas.client.integrations.verl.RaasAgentLoop
      url: http://raas-host:8000        # or a list; default: $RAAS_URL (comma-separated)
      sampling_params: {max_turns: 4}   # raas sampling params that win over verl's
      tasks: {my/set: countdown}        # optional: rename one's own data_source names

and ``actor_rollout_ref.rollout.agent.default_agent_loop=raas_agent`` selects it (or an
``agent_name`` column naming it per row). The same settings may also come from a top-level
``raas`` section of the trainer config (``+raas.url=...``). The raas server must render prompts
with the policy's tokenizer (``raas serve --tokenizer``), and route to verl's own inference
servers: see :func:`~raas.client.integrations.verl_bridge.register_verl_servers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from raas.client.integrations.verl_bridge import (
    DEFAULT_ON_FAILURE,
    ON_FAILURE,
    OnFailure,
    RaasRolloutFailed,
    VerlSample,
    clear_raas_backends,
    job_id_for,
    plain,
    protocol_for,
    register_verl_servers,
    result_to_samples,
    routing_paused,
    row_to_instance,
    sampling_params_for,
)
from raas.client.rollout_client import RolloutClient
from raas.client.sample_choices import (
    DEFAULT_TRUNCATED,
    TRUNCATED_CHOICES,
    TruncatedChoice,
    check_choice,
    check_truncated_reward,
)
from raas.client.segments import SegmentChoice, check_segments
from raas.wire import RolloutRequest, RolloutResult

__all__ = [
    "RaasAgentLoop",
    "RaasRolloutFailed",
    "clear_raas_backends",
    "close_clients",
    "protocol_for",
    "register_verl_servers",
    "routing_paused",
]

AGENT_NAME = "raas_agent"

# One RolloutClient per event loop and server list: verl makes a new agent loop object for every
# sample, and a client's connections belong to the loop that opened them.
_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[tuple[str, ...], str | None], RolloutClient]
] = weakref.WeakKeyDictionary()


def _client(urls: tuple[str, ...], api_key: str | None) -> RolloutClient:
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = (urls, api_key)
    if key not in per_loop:
        per_loop[key] = RolloutClient(list(urls), api_key=api_key)
    return per_loop[key]


# verl servers registered with raas by this process: (raas urls, addresses) -> when.
_registered: dict[tuple[tuple[str, ...], tuple[str, ...]], float] = {}
_register_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)
REGISTER_EVERY_S = 60.0  # how often a worker checks verl's server list again
REGISTER_ASK_S = 60.0  # how long verl's load balancer may take to list its servers


def _import(path: str) -> Callable[..., Any]:
    """``package.module:name`` (or ``package.module.name``) imported."""
    import importlib

    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    target: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return target


@register(AGENT_NAME)
class RaasAgentLoop(AgentLoopBase):  # type: ignore[misc]  # verl is untyped (Any) to mypy
    """One verl sample, one raas job. Settings (each from this loop's config entry, else the
    trainer config's ``raas`` section, else the environment):

    - ``url``: a raas server or a list of them (``$RAAS_URL``, comma-separated); jobs spread
      over them by free capacity (:class:`~raas.client.RolloutClient`);
    - ``api_key`` (``$RAAS_API_KEY``); ``timeout_s``: each job's time budget (the server's
      default when unset);
    - ``sampling_params``: raas sampling params that win over those made from verl's;
    - ``tasks``: one's own ``data_source`` names -> raas task (verl's dataset names need none:
      the server knows them, see ``raas/tasks/sources.py``); ``instance_fn``: a
      ``module:function`` taking the row (a dict) and returning the raas instance, instead;
    - ``segments``: which of a gateway job's segments become samples, each with the job's
      reward: ``all`` (default; several samples need verl's V1 worker, see the module
      docstring), ``first`` or ``last``;
    - ``on_failure``: ``mask`` (default: a job that did not finish ``done`` adds nothing to the
      loss: zero mask, reward 0.0) or ``raise``;
    - ``register_servers``: true to register verl's own rollout servers as raas backends from
      the agent loop itself (their addresses from the load balancer verl hands its agent loops,
      at most once a minute per worker; protocol from ``rollout.name``, capacity from
      ``rollout.max_num_seqs``), so that the trainer needs no change; off by default, for a
      raas whose backends are registered otherwise (``register_verl_servers``, ``raas serve
      --llm``).
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any = None,
        data_config: Any = None,
        hf_model_type: str | None = None,
        *,
        url: str | list[str] | None = None,
        api_key: str | None = None,
        timeout_s: float | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        tasks: Mapping[str, str] | None = None,
        instance_fn: str | None = None,
        on_failure: OnFailure | None = None,
        resubmit: int | None = None,
        truncated: TruncatedChoice | None = None,
        truncated_reward: float | None = None,
        segments: SegmentChoice | None = None,
        register_servers: bool | None = None,
        poll_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            trainer_config,
            server_manager,
            tokenizer,
            processor,
            dataset_cls,
            data_config,
            hf_model_type,
            **kwargs,
        )
        section = plain(self.config.get("raas", None)) or {}

        def setting(name: str, given: Any) -> Any:
            return plain(given) if given is not None else section.get(name)

        urls = setting("url", url) or os.environ.get("RAAS_URL", "")
        if isinstance(urls, str):
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError(
                "RaasAgentLoop needs a raas server: set `url` in its agent loop config entry,"
                " raas.url in the trainer config, or RAAS_URL"
            )
        self.urls = tuple(str(u) for u in urls)
        self.api_key = setting("api_key", api_key) or os.environ.get("RAAS_API_KEY") or None
        self.timeout_s = setting("timeout_s", timeout_s)
        self.sampling_overrides = setting("sampling_params", sampling_params) or {}
        self.tasks = setting("tasks", tasks)
        fn = setting("instance_fn", instance_fn)
        self.instance_fn = _import(fn) if fn else None
        self.on_failure = check_choice(
            "on_failure", setting("on_failure", on_failure) or DEFAULT_ON_FAILURE, ON_FAILURE
        )
        self.resubmit = int(setting("resubmit", resubmit) or 0)
        if self.resubmit < 0:
            raise ValueError(f"resubmit must be >= 0; got {self.resubmit}")
        self.truncated = check_choice(
            "truncated", setting("truncated", truncated) or DEFAULT_TRUNCATED, TRUNCATED_CHOICES
        )
        reward = setting("truncated_reward", truncated_reward)
        self.truncated_reward = check_truncated_reward(0.0 if reward is None else reward)
        self.segments = check_segments(setting("segments", segments) or "all")
        self.register_servers = bool(setting("register_servers", register_servers))
        self.poll_s = poll_s
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        multi_turn = self.rollout_config.get("multi_turn", None) or {}
        self.max_turns = multi_turn.get("max_assistant_turns", None)

    def request(self, sampling_params: dict[str, Any], row: Mapping[str, Any]) -> RolloutRequest:
        """The raas request for one verl sample."""
        instance = (
            plain(self.instance_fn(dict(row)))
            if self.instance_fn
            else row_to_instance(row, self.tasks)
        )
        params = sampling_params_for(
            sampling_params,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            max_turns=self.max_turns,
            overrides=self.sampling_overrides,
        )
        return RolloutRequest(
            instance=instance,
            sampling_params=params,
            job_id=job_id_for(row),
            timeout_s=self.timeout_s,
        )

    async def register_backends(self) -> None:
        """verl's rollout servers as this loop's raas servers' backends (``register_servers``).

        The addresses come from verl's load balancer actor, which ``LLMServerClient`` (the
        ``server_manager`` verl gives every agent loop) holds; raas treats an address it has
        as the same backend, so registering again is harmless.
        """
        balancer = getattr(self.server_manager, "_load_balancer", None)
        if balancer is None:
            raise RuntimeError(
                "register_servers: this verl's server manager has no load balancer to ask for"
                " its rollout servers; register them with register_verl_servers() instead"
            )
        lock = _register_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:
            try:  # an actor alive but stuck would hold every rollout of this worker here
                listed = await asyncio.wait_for(balancer.get_all_servers.remote(), REGISTER_ASK_S)
            except TimeoutError:
                raise RuntimeError(
                    f"register_servers: verl's load balancer did not list its rollout servers"
                    f" within {REGISTER_ASK_S:.0f} s"
                ) from None
            addresses = tuple(sorted(listed))
            key = (self.urls, addresses)
            when = _registered.get(key)
            if when is not None and time.monotonic() - when < REGISTER_EVERY_S:
                return
            protocol = protocol_for(str(self.rollout_config.name))
            capacity = int(self.rollout_config.get("max_num_seqs", None) or 8)
            await asyncio.to_thread(
                register_verl_servers,
                list(self.urls),
                list(addresses),
                protocol,
                capacity,
                api_key=self.api_key,
            )
            _registered[key] = time.monotonic()

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        if self.register_servers:
            await self.register_backends()
        request = self.request(sampling_params, kwargs)
        client = _client(self.urls, self.api_key)
        result = await self.run_job(client, request)
        for _ in range(self.resubmit):
            if result.state == "done":
                break
            fresh = request.model_copy(update={"job_id": job_id_for(kwargs)})
            result = await self.run_job(client, fresh)
        legacy = "session_id" not in kwargs  # see the module docstring
        if result.state != "done" and self.on_failure == "drop" and legacy:
            raise RaasRolloutFailed(
                result,
                "verl's legacy AgentLoopWorker (trainer.use_v1=false) takes one sample a row and"
                " counts it in its group's GRPO statistics, so a failed job cannot be dropped"
                " there: run verl's V1 trainer (trainer.use_v1=true), or set the raas agent"
                " loop's on_failure to zero (reward 0.0 in its group: biased) or raise, or"
                " resubmit to a number of tries",
            )
        fallback = () if result.trajectory.prompt_ids else self._fallback_prompt(kwargs)
        samples = result_to_samples(
            result,
            segments=self.segments,
            prompt_length=self.prompt_length,
            response_length=self.response_length,
            fallback_prompt_ids=fallback,
            pad_token_id=self._pad_id(),
            on_failure=self.on_failure,
            truncated=self.truncated,
            truncated_reward=self.truncated_reward,
        )
        outputs = [self.output(sample) for sample in samples]
        if len(outputs) == 1:
            return outputs[0]
        if legacy:
            raise ValueError(
                f"raas job {result.job_id} has {len(outputs)} gateway segments, and verl's"
                " legacy AgentLoopWorker (trainer.use_v1=false) takes one sample a prompt row:"
                " run verl's V1 trainer (trainer.use_v1=true), which takes every segment as a"
                " sample of the prompt's group, or set the raas agent loop's segments to"
                " first or last"
            )
        return outputs

    async def run_job(self, client: RolloutClient, request: RolloutRequest) -> RolloutResult:
        """The result of one raas job (cancelled if this is)."""
        job_id = await client.submit(request)
        try:
            return await client.wait(job_id, self.poll_s)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # the job must not run on without a reader
                await asyncio.shield(client.cancel(job_id))
            raise

    def output(self, sample: VerlSample) -> AgentLoopOutput:
        metrics = AgentLoopMetrics(
            generate_sequences=sample.generate_s,
            tool_calls=sample.tools_s,
            compute_score=sample.eval_s,
        )
        return AgentLoopOutput(
            prompt_ids=sample.prompt_ids,
            response_ids=sample.response_ids,
            response_mask=sample.response_mask,
            response_logprobs=sample.response_logprobs,
            reward_score=sample.reward,
            num_turns=sample.num_turns,
            metrics=metrics,
            extra_fields={
                "raas": sample.raas,
                # Numbers only: verl averages these per data source in validation.
                "reward_extra_info": {
                    "raas_failed": float(sample.failed),
                    "raas_truncated": float(sample.truncated),
                },
                # Keys verl's own loops always set, so mixed batches concatenate.
                "turn_scores": [],
                "tool_rewards": [],
            },
        )

    def _pad_id(self) -> int:
        for attr in ("pad_token_id", "eos_token_id"):
            value = getattr(self.tokenizer, attr, None)
            if value is not None:
                return int(value)
        return 0

    def _fallback_prompt(self, row: Mapping[str, Any]) -> list[int]:
        """The row's prompt in the policy's chat template, for a job that failed before raas
        rendered one (verl needs a prompt for every sample)."""
        messages = plain(row.get("raw_prompt"))
        if not messages:
            return [self._pad_id()]
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception:  # a tokenizer without a chat template, odd content
            return [self._pad_id()]
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return [int(t) for t in ids] or [self._pad_id()]


async def close_clients() -> None:
    """Close the raas clients this event loop opened (verl's workers live as long as their
    process and need not call it; a script that runs a loop and ends may)."""
    for client in _clients.pop(asyncio.get_running_loop(), {}).values():
        await client.aclose()
