"""TRL's ``GRPOTrainer(rollout_func=...)``: rollouts come from raas instead of TRL's generator.

TRL (>= 1.x, experimental ``rollout_func``) calls ``rollout_func(prompts, trainer)`` with this
process's slice of prompts, each prompt already repeated ``num_generations`` times in a row (TRL
1.16's sampler), and expects one completion per entry, in order, as token ids with one logprob
per completion token. Each run of identical prompts becomes one raas group (the samples get
distinct seeds). raas returns exactly that, plus ``env_mask`` (TRL's name
for the loss mask: 0 on observation tokens inserted between turns) and ``raas_reward`` (the
reward raas computed), which TRL forwards to the reward functions::

    from trl import GRPOConfig, GRPOTrainer
    from raas.client.integrations.trl import make_rollout_func, raas_reward

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=raas_reward,  # the task's own reward, computed by raas
        args=GRPOConfig(num_generations=4, ...),
        train_dataset=dataset,  # rows with a "prompt" column
        rollout_func=make_rollout_func("http://raas:8000", to_instance=lambda p: {...}),
    )

``to_instance`` turns one dataset prompt into a raas task instance (its ``data_source`` picks
the task). For the rollouts to be on-policy the inference servers raas uses must have the
trainer's weights: pass ``weights=WeightSync([engine_url], "/shared/weights")`` and, at the
first rollout after each optimizer step, the trainer's model is saved there (safetensors) and
the servers told to load it (raas's engine: ``POST /update_weights``; SGLang:
``/update_weights_from_disk``, with the step as its ``weight_version``). Given ``raas_servers``
(the raas servers that route to those inference servers), each raas server's routing is paused
around the load (:mod:`raas.client.backends_paused`), so rollouts in flight go on after it
instead of failing or being cut. TRL's ``max_completion_length`` caps each completion (and is
the tokens-per-turn limit unless ``sampling_params`` sets ``max_tokens``). The groups of a call
run concurrently.

A gateway job (an agent program raas did not write) may hold several segments (see
:mod:`raas.client.segments`). TRL's ``rollout_func`` contract is one completion per prompt
entry: GRPOTrainer zips completions with its prompts and groups rewards by position
(``num_generations`` in a row), so a job of k segments cannot be k samples there. ``segments``
says what to do: ``"all"`` (the default, named as in ``to_batch`` and the verl agent loop)
raises, naming the job, when a job has more than one; ``"first"`` or ``"last"`` sends that
segment, with the job's reward. To train on every segment, use ``to_batch`` (one row a
segment) or verl's V1 trainer.

Honest samples (the choices of :mod:`raas.client.sample_choices`): a job that did not end
``done`` has ``raas_reward`` None and an all-zero ``env_mask`` with ``failed="drop"`` (the
default) or ``"mask"`` (TRL pairs completions with prompts by position, so a completion cannot
be left out; TRL >= 1.x leaves a completion whose every reward function returned None out of
its group's mean and std and gives it advantage 0, which is what both choices mean);
``"drop_group"`` does that to every completion of a group with a member that failed for an
infrastructure reason. A completion cut to ``max_completion_length`` gets what ``truncated``
says: ``"mask"`` (default: zero ``env_mask``, its own reward in its group), ``"penalise"``
(``truncated_reward``) or ``"keep"``. ``raas_truncated`` says which were cut.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from raas.client.auth import auth_headers
from raas.client.backends_paused import backends_paused
from raas.client.rollout_client import Group, SyncRolloutClient
from raas.client.sample_choices import (
    DEFAULT_FAILED,
    DEFAULT_TRUNCATED,
    FAILED_CHOICES,
    TRUNCATED_CHOICES,
    FailedChoice,
    GradientWatch,
    TruncatedChoice,
    check_choice,
    check_truncated_reward,
    failed_by_infra,
    truncated_outcome,
)
from raas.client.segments import SegmentChoice, check_segments, trajectories
from raas.wire import RolloutResult

Instance = dict[str, Any]
# Where each kind of inference server loads a checkpoint directory from disk, and the body.
RELOAD = {
    "raas": ("/update_weights", "path"),
    "sglang": ("/update_weights_from_disk", "model_path"),
}


@dataclass
class WeightSync:
    """Pushes the trainer's weights to inference servers once per optimizer step.

    ``directory`` must be readable by the servers (a shared file system on a cluster) and, for
    raas's engine, one of its ``--weights-dir``; only the latest checkpoint is kept there.
    ``api_key`` is the servers' (raas's engine refuses ``/update_weights`` without it).
    ``raas_servers``: the raas servers whose backend pools route to ``servers``; each pauses
    its routing around the load (``pause_mode``, see :mod:`raas.client.backends_paused`), with
    ``raas_api_key``.
    """

    servers: Sequence[str]
    directory: Path | str
    protocol: Literal["raas", "sglang"] = "raas"
    timeout_s: float = 600.0
    step: int = 0  # the step whose weights the servers hold (0: the initial ones)
    api_key: str | None = None
    raas_servers: Sequence[str] = ()
    pause_mode: Literal["keep", "abort"] = "keep"
    raas_api_key: str | None = None

    def push_if_stepped(self, trainer: Any) -> bool:
        step = int(trainer.state.global_step)
        if step == self.step:
            return False
        accelerator = getattr(trainer, "accelerator", None)
        model = accelerator.unwrap_model(trainer.model) if accelerator else trainer.model
        path = Path(self.directory) / f"step-{step}"
        model.save_pretrained(path, safe_serialization=True)
        paused = (
            backends_paused(self.raas_servers, self.pause_mode, self.raas_api_key, self.timeout_s)
            if self.raas_servers
            else contextlib.nullcontext()
        )
        with paused:
            self._load(path, step)
        previous = Path(self.directory) / f"step-{self.step}"
        if self.step and previous.exists():
            shutil.rmtree(previous)
        self.step = step
        return True

    def _load(self, path: Path, step: int) -> None:
        route, field = RELOAD[self.protocol]
        body = {field: str(path)}
        if self.protocol == "sglang":  # what SGLang then reports as every token's version
            body["weight_version"] = str(step)
        headers = auth_headers(self.api_key)
        for server in self.servers:
            reply = httpx.post(
                server.rstrip("/") + route, json=body, headers=headers, timeout=self.timeout_s
            )
            if reply.is_error:
                raise RuntimeError(
                    f"{server} did not load the weights of step {step} from {path}:"
                    f" {reply.status_code} {reply.text[:300]}"
                )


def make_rollout_func(
    servers: str | Sequence[str],
    to_instance: Callable[[Any], Instance],
    sampling_params: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    client: SyncRolloutClient | None = None,
    weights: WeightSync | None = None,
    segments: SegmentChoice = "all",
    failed: FailedChoice = DEFAULT_FAILED,
    truncated: TruncatedChoice = DEFAULT_TRUNCATED,
    truncated_reward: float = 0.0,
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A ``rollout_func`` for TRL's GRPOTrainer backed by raas servers; ``segments``: which
    segment of a gateway job is its completion; ``failed``, ``truncated`` and
    ``truncated_reward``: what a failed job and a cut completion become (see the module
    docstring)."""
    segments = check_segments(segments)
    failed = check_choice("failed", failed, FAILED_CHOICES)
    truncated = check_choice("truncated", truncated, TRUNCATED_CHOICES)
    truncated_reward = check_truncated_reward(truncated_reward)
    rollouts = client or SyncRolloutClient(servers)
    watch = GradientWatch()

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        if weights is not None:
            weights.push_if_stepped(trainer)
        limit = getattr(getattr(trainer, "args", None), "max_completion_length", None)
        params = dict(sampling_params or {})
        if limit:
            params.setdefault("max_tokens", int(limit))
        runs = _runs(prompts)
        instances = [to_instance(prompt) for prompt, _ in runs]
        groups: list[Group | None] = [None] * len(runs)
        by_count: dict[int, list[int]] = {}
        for i, (_, count) in enumerate(runs):
            by_count.setdefault(count, []).append(i)
        for count, members in by_count.items():  # one call: its groups run concurrently
            got = rollouts.generate_groups(
                [instances[i] for i in members], count, sampling_params=params, timeout_s=timeout_s
            )
            for i, group in zip(members, got, strict=True):
                groups[i] = group
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "raas_reward": [],
            "raas_state": [],
            "raas_segment": [],
            "raas_truncated": [],
        }
        cap = int(limit) if limit else None
        cut = slice(0, cap)
        for filled in groups:
            assert filled is not None
            outage = failed == "drop_group" and any(map(failed_by_infra, filled.results))
            for result in filled.results:
                picked = trajectories(result, segments)
                if len(picked) > 1:
                    raise ValueError(
                        f"raas job {result.job_id} has {len(picked)} gateway segments, and TRL's"
                        " rollout_func takes one completion a prompt: make_rollout_func("
                        "segments='first' or 'last'), or train on every segment with to_batch"
                    )
                segment, traj = picked[0]
                was_cut = cap is not None and len(traj.response_ids) > cap
                reward, masked = _reward(result, outage, was_cut, truncated, truncated_reward)
                mask = list(traj.loss_mask[cut])
                out["raas_segment"].append(segment)
                out["prompt_ids"].append(list(traj.prompt_ids))
                out["completion_ids"].append(list(traj.response_ids[cut]))
                out["logprobs"].append(list(traj.logprobs[cut]))
                out["env_mask"].append([0] * len(mask) if masked else mask)
                out["raas_reward"].append(reward)
                out["raas_state"].append(result.state)
                out["raas_truncated"].append(was_cut)
        failed_jobs = sum(state != "done" for state in out["raas_state"])
        watch.check(
            out["env_mask"],
            sum(out["raas_truncated"]),
            failed_jobs,
            f"max_completion_length={cap}" if cap else None,
        )
        return out

    return rollout_func


def _runs(prompts: list[Any]) -> list[tuple[Any, int]]:
    """Consecutive identical prompts as (prompt, how many)."""
    runs: list[tuple[Any, int]] = []
    for prompt in prompts:
        if runs and runs[-1][0] == prompt:
            runs[-1] = (prompt, runs[-1][1] + 1)
        else:
            runs.append((prompt, 1))
    return runs


def _reward(
    result: RolloutResult,
    outage: bool,
    was_cut: bool,
    truncated: TruncatedChoice,
    truncated_reward: float,
) -> tuple[float | None, bool]:
    """A completion's ``raas_reward`` and whether its ``env_mask`` is zeroed: None (out of its
    group's statistics, advantage 0 in TRL >= 1.x) for a failure or an outage's group."""
    if outage or result.state != "done" or result.reward is None:
        return None, True
    if was_cut:
        return truncated_outcome(result.reward, truncated, truncated_reward)
    return result.reward, False


def raas_reward(
    completions: list[Any], raas_reward: list[float | None], **kwargs: Any
) -> list[float | None]:
    """A TRL reward function that returns the reward raas computed for each completion (None
    for a failed job's: TRL leaves it out of its group's statistics)."""
    return [None if r is None else float(r) for r in raas_reward]
