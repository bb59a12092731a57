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
the task). The trainer must push its weights to the inference servers raas uses (e.g. the
engine's ``POST /update_weights``) for the rollouts to be on-policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from raas.client.rollout_client import SyncRolloutClient

Instance = dict[str, Any]


def make_rollout_func(
    servers: str | Sequence[str],
    to_instance: Callable[[Any], Instance],
    sampling_params: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    client: SyncRolloutClient | None = None,
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A ``rollout_func`` for TRL's GRPOTrainer backed by raas servers."""
    rollouts = client or SyncRolloutClient(servers)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        runs = _runs(prompts)
        instances = [to_instance(prompt) for prompt, _ in runs]
        groups = [
            rollouts.generate_groups(
                [instance], count, sampling_params=sampling_params, timeout_s=timeout_s
            )[0]
            for instance, (_, count) in zip(instances, runs, strict=True)
        ]
        out: dict[str, list[Any]] = {
            "prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
            "raas_reward": [], "raas_state": [],
        }  # fmt: skip
        for group in groups:
            for result in group.results:
                traj = result.trajectory
                out["prompt_ids"].append(list(traj.prompt_ids))
                out["completion_ids"].append(list(traj.response_ids))
                out["logprobs"].append(list(traj.logprobs))
                out["env_mask"].append(list(traj.loss_mask))
                out["raas_reward"].append(result.reward if result.reward is not None else 0.0)
                out["raas_state"].append(result.state)
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


def raas_reward(completions: list[Any], raas_reward: list[float], **kwargs: Any) -> list[float]:
    """A TRL reward function that returns the reward raas computed for each completion."""
    return [float(r) for r in raas_reward]
