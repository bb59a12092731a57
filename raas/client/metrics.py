"""Per-batch rollout metrics for a trainer's logs: TensorBoard, and Weights & Biases.

``rollout_metrics(batch)`` turns one training step's rollouts (results, their dicts, or groups of
them as ``generate_groups`` and ``collect_groups`` return) into flat ``{name: float}``, the shape
verl's and TRL's trainers log; ``MetricsLogger`` writes that to whatever is installed. Every
name starts with ``prefix`` (``rollout/``):

- ``count``: rollouts in the batch. ``state/{done,failed,timeout,cancelled}``,
  ``error_kind/{infra,policy}``, ``stage_failed/{init,run,eval}`` (always all of them),
  ``error_type/TYPE`` and ``stop_reason/REASON`` (those present): fractions of the batch.
  ``attempts_mean``: above 1 when infrastructure failures made jobs run again.
- ``reward_mean``, ``reward_std`` (population), ``reward_min``, ``reward_max``, ``pass_rate``
  (reward >= 1, as ``raas run`` counts it): over the scored rollouts (state ``done`` with a
  reward); failures carry no reward and are not counted as zeros.
- ``prompt_tokens_{mean,max}``, ``response_tokens_{mean,min,max}``,
  ``generated_tokens_mean`` (the policy's own tokens: loss mask 1), ``turns_{mean,max}``: over
  the rollouts that produced a trajectory, failed ones included (their partial trajectory).
- ``time/{queue,init,run,eval,total}_s_mean`` and ``time/total_s_max`` over every rollout;
  ``time/{generate,tools}_s_mean``, the model's and the tools' share of RUN summed over a
  rollout's turns, over the rollouts with turns.
- ``malformed_tool_calls_mean`` (tool calls the parser could not read, a rollout) and
  ``malformed_tool_calls_frac`` (rollouts with one or more), over the rollouts with turns: a
  reward earned, or lost, around calls that never ran.
- Given ``policy_version`` (the trainer's version, in the backend's numbering):
  ``staleness/{known_frac,mean,p50,p90,max,on_policy_frac}``, how many versions each rollout's
  oldest generated token lags it (``known_frac``: the rollouts whose backend named versions;
  the others are left out of the rest).
- Given groups: ``groups``; ``group_reward_std_mean`` (sample std within a group, as GRPO
  normalises) and ``group_zero_std_frac`` (groups with no signal: all rewards equal, as TRL's
  ``frac_reward_zero_std``) over groups with two or more scored rollouts; ``group_solved_frac``
  (at least one rollout passed) over groups with one or more.

A statistic with nothing to describe (no scored rollout, no group) is left out rather than
written as 0, which would plot as a measurement.

This module imports numpy and the client's own modules; ``MetricsLogger`` imports
``tensorboard`` and ``wandb`` when it is made, and only the ones it was asked for.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raas.client.batch import HasResults, ResultLike, _as_result, _members
from raas.client.dapo import DapoReport
from raas.client.staleness import staleness_metrics, token_lag
from raas.wire import ERROR_KINDS, FINAL_STATES, PASS_REWARD, STAGE_NAMES, RolloutResult

TIMINGS = ("queue_s", "init_s", "run_s", "eval_s", "total_s")

Rollouts = Iterable[ResultLike] | Iterable[Iterable[ResultLike] | HasResults]


def rollout_metrics(
    batch: Rollouts, prefix: str = "rollout/", policy_version: int | None = None
) -> dict[str, float]:
    """The metrics of one batch of rollouts (see the module docstring for each name)."""
    results, groups = _flatten(batch)
    metrics = {"count": float(len(results))}
    if results:
        metrics |= _outcomes(results)
        metrics |= _rewards(results)
        metrics |= _lengths(results)
        metrics |= _malformed(results)
        metrics |= _timings(results)
        if policy_version is not None:
            lags = [token_lag(r, policy_version) for r in results]
            metrics |= staleness_metrics(lags)
    if groups is not None:
        metrics |= _group_stats(groups)
    return {prefix + name: value for name, value in metrics.items()}


def dapo_metrics(report: DapoReport, prefix: str = "dapo/") -> dict[str, float]:
    """``collect_groups``' report as metrics: prompts and jobs submitted, groups kept, dropped
    and stale (on submit time, on tokens), jobs cancelled, wall and waiting time, whether the
    prompts ran out, and the distribution of the kept rollouts' oldest-token lags
    (``staleness/...``, see :func:`raas.client.staleness.staleness_metrics`)."""
    fields = dataclasses.asdict(report)
    lags = fields.pop("token_lags")
    return {prefix + k: float(v) for k, v in fields.items()} | staleness_metrics(
        lags, prefix + "staleness/"
    )


def _flatten(batch: Rollouts) -> tuple[list[RolloutResult], list[list[RolloutResult]] | None]:
    """The rollouts of ``batch``, and its groups when it is made of groups."""
    items = list(batch)
    single = [isinstance(item, RolloutResult | Mapping) for item in items]
    if all(single):
        return [_as_result(item, 0, j) for j, item in enumerate(items)], None
    if any(single):
        raise TypeError(
            "pass a batch of results or a batch of groups (each the results of one prompt), not"
            " a mix of both"
        )
    groups = [
        [_as_result(item, g, j) for j, item in enumerate(_members(group, g))]
        for g, group in enumerate(items)
        if not isinstance(group, RolloutResult | Mapping)  # (all are groups: narrows the type)
    ]
    return [r for group in groups for r in group], groups


def _fractions(
    counts: Counter[str], n: int, name: str, always: Sequence[str] = ()
) -> dict[str, float]:
    keys = dict.fromkeys([*always, *sorted(counts)])
    return {f"{name}/{key}": counts[key] / n for key in keys}


def _outcomes(results: list[RolloutResult]) -> dict[str, float]:
    n = len(results)
    errors = [r.error for r in results if r.error is not None]
    stages = Counter(str(r.stage_failed) for r in results if r.stage_failed is not None)
    stops = Counter(r.trajectory.stop_reason for r in results if r.trajectory.stop_reason)
    return {
        **_fractions(Counter(r.state for r in results), n, "state", FINAL_STATES),
        **_fractions(Counter(e.kind for e in errors), n, "error_kind", ERROR_KINDS),
        **_fractions(stages, n, "stage_failed", STAGE_NAMES),
        **_fractions(Counter(e.type for e in errors), n, "error_type"),
        **_fractions(stops, n, "stop_reason"),
        "attempts_mean": float(np.mean([r.attempts for r in results])),
    }


def _scored(result: RolloutResult) -> bool:
    return result.state == "done" and result.reward is not None


def _rewards(results: list[RolloutResult]) -> dict[str, float]:
    rewards = np.array([r.reward for r in results if _scored(r)], dtype=np.float64)
    if not rewards.size:
        return {}
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "reward_min": float(rewards.min()),
        "reward_max": float(rewards.max()),
        "pass_rate": float((rewards >= PASS_REWARD).mean()),
    }


def _lengths(results: list[RolloutResult]) -> dict[str, float]:
    trajs = [r.trajectory for r in results if r.trajectory.prompt_ids or r.trajectory.turns]
    if not trajs:
        return {}
    prompt = np.array([len(t.prompt_ids) for t in trajs])
    response = np.array([len(t.response_ids) for t in trajs])
    turns = np.array([len(t.turns) for t in trajs])
    return {
        "prompt_tokens_mean": float(prompt.mean()),
        "prompt_tokens_max": float(prompt.max()),
        "response_tokens_mean": float(response.mean()),
        "response_tokens_min": float(response.min()),
        "response_tokens_max": float(response.max()),
        "generated_tokens_mean": float(np.mean([sum(t.loss_mask) for t in trajs])),
        "turns_mean": float(turns.mean()),
        "turns_max": float(turns.max()),
    }


def _malformed(results: list[RolloutResult]) -> dict[str, float]:
    counts = [r.trajectory.malformed_tool_calls() for r in results if r.trajectory.turns]
    if not counts:
        return {}
    return {
        "malformed_tool_calls_mean": float(np.mean(counts)),
        "malformed_tool_calls_frac": float(np.mean([c > 0 for c in counts])),
    }


def _turn_seconds(turns: list[dict[str, Any]], key: str) -> float:
    return sum(float(t.get(key) or 0.0) for t in turns)


def _timings(results: list[RolloutResult]) -> dict[str, float]:
    metrics = {
        f"time/{name}_mean": float(np.mean([getattr(r.timing, name) for r in results]))
        for name in TIMINGS
    }
    metrics["time/total_s_max"] = max(r.timing.total_s for r in results)
    with_turns = [r.trajectory.turns for r in results if r.trajectory.turns]
    if with_turns:
        for key in ("generate_s", "tools_s"):
            metrics[f"time/{key}_mean"] = float(
                np.mean([_turn_seconds(t, key) for t in with_turns])
            )
    return metrics


def _group_stats(groups: list[list[RolloutResult]]) -> dict[str, float]:
    metrics = {"groups": float(len(groups))}
    scored = [[float(r.reward or 0.0) for r in g if _scored(r)] for g in groups]
    several = [np.array(rewards) for rewards in scored if len(rewards) >= 2]
    if several:
        metrics["group_reward_std_mean"] = float(np.mean([r.std(ddof=1) for r in several]))
        metrics["group_zero_std_frac"] = float(np.mean([np.ptp(r) == 0 for r in several]))
    some = [rewards for rewards in scored if rewards]
    if some:
        metrics["group_solved_frac"] = float(np.mean([max(r) >= PASS_REWARD for r in some]))
    return metrics


class MetricsLogger:
    """Writes rollout metrics to TensorBoard (``tensorboard_dir``) and to Weights & Biases
    (``wandb=True``), whichever are installed.

    W&B: an active run (``wandb.run``, started by the trainer) is used as it is and left open;
    otherwise one is started with ``wandb_init`` (``wandb.init``'s keyword arguments: project,
    name, config, mode...) and finished by ``close()``. A sink that was asked for but whose
    package is missing is reported with a warning naming the package to install, and the
    others go on: ``sinks`` says which are live. ``log`` returns the metrics it wrote, so they
    can be printed too.

        with MetricsLogger(tensorboard_dir="runs/grpo", wandb=True) as metrics:
            for step in range(steps):
                groups, report = await collect_groups(client, prompts, n=8, batch_size=32, ...)
                metrics.log(groups, step, report=report)
    """

    def __init__(
        self,
        tensorboard_dir: str | Path | None = None,
        wandb: bool = False,
        *,
        wandb_init: Mapping[str, Any] | None = None,
        prefix: str = "rollout/",
    ) -> None:
        self.prefix = prefix
        self._tb: Any = None
        self._wandb_run: Any = None
        self._owns_wandb_run = False
        if tensorboard_dir is not None:
            self._tb = _tensorboard_writer(Path(tensorboard_dir))
        if wandb:
            self._wandb_run, self._owns_wandb_run = _wandb_run(dict(wandb_init or {}))

    @property
    def sinks(self) -> list[str]:
        """The sinks being written: ``tensorboard``, ``wandb``."""
        return [name for name, s in (("tensorboard", self._tb), ("wandb", self._wandb_run)) if s]

    def log(
        self,
        batch: Rollouts,
        step: int,
        *,
        report: DapoReport | None = None,
        extra: Mapping[str, float] | None = None,
        policy_version: int | None = None,
    ) -> dict[str, float]:
        """Log ``rollout_metrics(batch)`` at ``step`` (the trainer's step: W&B drops a step
        lower than one it has seen), with ``report``'s and ``extra`` metrics; returns them.
        ``policy_version``: the trainer's version, for the staleness of the rollouts' tokens."""
        metrics = rollout_metrics(batch, self.prefix, policy_version)
        if report is not None:
            metrics |= dapo_metrics(report)
        metrics |= {k: float(v) for k, v in (extra or {}).items()}
        self.log_scalars(metrics, step)
        return metrics

    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        """Write ``metrics`` as they are at ``step``."""
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(name, value, step)
            self._tb.flush()  # a crashed run keeps what it logged
        if self._wandb_run is not None:
            self._wandb_run.log(dict(metrics), step=step)

    def close(self) -> None:
        """Flush and close the TensorBoard writer; finish the W&B run if this logger began it."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None and self._owns_wandb_run:
            self._wandb_run.finish()
        self._wandb_run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _missing(package: str, extra: str, what: str) -> None:
    warnings.warn(
        f"{package} is not installed, so rollout metrics are not written to {what}"
        f" (pip install '{package}', or 'raas[{extra}]')",
        RuntimeWarning,
        stacklevel=4,  # the line that made the logger
    )


def _tensorboard_writer(directory: Path) -> Any:
    try:
        # TensorBoard's own writer: numpy only, no TensorFlow or torch.
        from tensorboard.summary import Writer
    except ImportError:
        _missing("tensorboard", "tensorboard", str(directory))
        return None
    directory.mkdir(parents=True, exist_ok=True)
    return Writer(str(directory))


def _wandb_run(init: dict[str, Any]) -> tuple[Any, bool]:
    """The W&B run to log to, and whether this logger started it."""
    try:
        import wandb
    except ImportError:
        _missing("wandb", "wandb", "Weights & Biases")
        return None, False
    if wandb.run is not None:
        return wandb.run, False
    return wandb.init(**init), True
