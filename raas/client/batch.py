"""Rollout results to a padded training batch, with group-relative advantages.

``to_batch`` takes groups of results (the n samples of one prompt each) and returns a
:class:`Batch` of right-padded ``[N, L]`` numpy arrays: token ids, masks, the sampler's log-probs,
one advantage a row, and token-level loss weights. Three recipes are built in:

``"grpo"`` (DeepSeekMath, Shao et al. 2024)
    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` over the group's rewards. The paper writes
    ``std(r)`` without saying which; this uses the sample standard deviation (Bessel's ``n - 1``),
    as the reference implementations do (``torch.std`` in TRL's GRPOTrainer, verl and OpenRLHF).
    The loss is a sequence-level mean: ``1/N sum_i 1/|o_i| sum_t loss_it``, so
    ``loss_weights[i, t] = 1 / (|o_i| * N)``.

``"dr_grpo"`` (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training")
    ``A_i = r_i - mean(r)``: no division by the std (it up-weights too-easy and too-hard
    prompts), and no division by the sequence length (it favours short correct and long wrong
    answers). The loss is summed over tokens and divided by a constant generation budget
    (their code: the sampler's maximum number of generated tokens):
    ``loss_weights[i, t] = 1 / (budget * N)``. The budget is ``generation_budget`` when given,
    else ``max_length``, else the batch's width ``L``; only the first two are constant from batch
    to batch, so pass one of them.

``"dapo"`` (DAPO, Yu et al. 2025)
    The GRPO advantage, with DAPO's token-level policy-gradient loss: every policy token of the
    batch weighs the same, ``loss_weights[i, t] = 1 / sum_j |o_j|``, so long sequences are not
    down-weighted. (DAPO's dynamic sampling, which drops groups whose rewards are all equal, is
    :mod:`raas.client.dapo`'s job, not this one.)

Here ``|o_i|`` counts the policy tokens (``loss_mask == 1``) of row ``i`` that survive truncation,
and ``N`` counts the rows with at least one such token; rows with none (masked failures, empty
responses, responses cut away by ``max_length``) weigh nothing and do not count. Groups whose
rewards are all equal get advantage 0 but keep their rows (and count in ``N``). The policy loss
for a batch is ``sum(loss_weights * per_token_loss)``; the weights of the whole batch sum to 1
for grpo and dapo, so a trainer that splits a batch into micro-batches sums (does not average)
the micro-batch losses to get the full batch's gradient.

Results that did not finish (state other than ``"done"``) or have no reward are dropped from
their group before its statistics (``failed="drop"``), or kept as rows that carry no gradient
(``failed="mask"``). With ``failed="drop_group"``, a group with a member that failed for an
infrastructure reason (its error's ``kind`` is ``"infra"``: a sandbox, a backend, a restart) is
dropped whole, so no group's statistics are computed over the survivors of an outage; other
failures are dropped as with ``"drop"``. Nothing is ever copied from a sibling to fill a gap.
(The choices are :mod:`raas.client.sample_choices`', shared with the verl and TRL adapters.)

A job cut by ``max_length`` (any of its rows longer) gets what ``truncated`` says: ``"mask"``
(the default: its rows carry no gradient, its own reward counts in its group's statistics),
``"penalise"`` (reward ``truncated_reward`` in place of its own) or ``"keep"``.

Staleness on tokens: with ``policy_version`` (the trainer's current version, in the backend's
numbering) each row's ``staleness`` is how many versions its job's oldest generated token is
behind it (-1 where the backend named none), and ``max_staleness`` drops a job whose lag is
greater from its group before the statistics (counted in ``Batch.stale``).

A gateway job of k segments (see :mod:`raas.client.segments`) gives k rows with
``segments="all"`` (the default): each its own prompt, response, mask and logprobs, all with the
job's reward, advantage and group. The group's statistics are over its jobs (each job's reward
counts once), and each such row counts as a sample in ``N`` and in the loss weights.
``segments="first"`` or ``"last"`` keeps one row a job.

This module imports numpy and ``raas.wire`` only; torch is imported by
:meth:`Batch.to_torch` when called.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from raas.client.sample_choices import (
    DEFAULT_FAILED,
    DEFAULT_TRUNCATED,
    FAILED_CHOICES,
    TRUNCATED_CHOICES,
    FailedChoice,
    TruncatedChoice,
    check_choice,
    check_truncated_reward,
    failed_by_infra,
    truncated_outcome,
)
from raas.client.segments import SegmentChoice, check_segments, trajectories
from raas.client.staleness import token_lag, too_stale
from raas.wire import RolloutResult, Trajectory

if TYPE_CHECKING:
    import torch

AdvantageName = Literal["grpo", "dr_grpo", "dapo"]
FailedPolicy = FailedChoice  # the name to_batch's option had first
ADVANTAGES: tuple[AdvantageName, ...] = ("grpo", "dr_grpo", "dapo")
FAILED_POLICIES = FAILED_CHOICES

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]

ResultLike = RolloutResult | Mapping[str, Any]

# The array fields, in the order ``to_torch`` returns them.
ARRAY_FIELDS = (
    "input_ids",
    "attention_mask",
    "loss_mask",
    "old_logprobs",
    "rewards",
    "advantages",
    "token_advantages",
    "loss_weights",
    "group_index",
    "prompt_lengths",
    "response_lengths",
    "segment_index",
    "staleness",
)


class HasResults(Protocol):
    """A group object carrying its samples (``raas.client.rollout_client.Group`` is one)."""

    @property
    def results(self) -> Sequence[ResultLike]: ...


@dataclass(eq=False)
class Batch:
    """N rows of prompt + response, right-padded to width L.

    ``old_logprobs[i, t]`` is the sampler's log-probability of ``input_ids[i, t]`` (position
    ``prompt_len + k`` holds the log-prob of response token ``k``). A causal LM predicts token
    ``t`` from the logits at ``t - 1``, so compare it with
    ``log_softmax(logits[:, :-1]).gather(-1, input_ids[:, 1:, None])`` against
    ``old_logprobs[:, 1:]`` (and ``loss_mask[:, 1:]``, ``loss_weights[:, 1:]``,
    ``token_advantages[:, 1:]``).
    """

    input_ids: IntArray  # [N, L] prompt_ids + response_ids, pad_token_id after
    attention_mask: IntArray  # [N, L] 1 on real tokens
    loss_mask: IntArray  # [N, L] the response's loss_mask; 0 on prompt, padding, masked rows
    old_logprobs: FloatArray  # [N, L] sampler log-probs where loss_mask is 1, else 0
    rewards: FloatArray  # [N] the result's reward (0.0 for masked failures)
    advantages: FloatArray  # [N]
    token_advantages: FloatArray  # [N, L] advantages broadcast where loss_mask is 1, else 0
    loss_weights: FloatArray  # [N, L] token weights of the loss (see the module docstring)
    group_index: IntArray  # [N] position of the row's group in the ``groups`` argument
    prompt_lengths: IntArray  # [N] prompt tokens in the row (after truncation)
    response_lengths: IntArray  # [N] response tokens in the row (after truncation)
    segment_index: IntArray  # [N] which of its job's gateway segments the row is (0: the first)
    staleness: IntArray  # [N] versions the job's oldest token lags policy_version (-1: unknown)
    dropped: int = 0  # results removed by failed="drop" or "drop_group"
    masked: int = 0  # rows kept without gradient by failed="mask"
    truncated: int = 0  # rows cut to max_length
    stale: int = 0  # results removed by max_staleness
    dropped_groups: int = 0  # groups with no result left (or none to begin with)
    job_ids: tuple[str, ...] = field(default=())  # [N] the job of each row (k rows: k segments)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to_torch(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The array fields as tensors on ``device`` (on the CPU they share the arrays' memory)."""
        try:
            import torch
        except ImportError as exc:
            raise ImportError(
                "Batch.to_torch() needs PyTorch, which is not installed "
                "(pip install torch), or use the Batch's numpy arrays directly"
            ) from exc
        return {
            name: torch.from_numpy(np.ascontiguousarray(getattr(self, name))).to(device)
            for name in ARRAY_FIELDS
        }


def to_batch(
    groups: Iterable[Iterable[ResultLike] | HasResults],
    *,
    advantage: AdvantageName = "grpo",
    failed: FailedChoice = DEFAULT_FAILED,
    pad_token_id: int = 0,
    max_length: int | None = None,
    eps: float = 1e-6,
    generation_budget: int | None = None,
    segments: SegmentChoice = "all",
    truncated: TruncatedChoice = DEFAULT_TRUNCATED,
    truncated_reward: float = 0.0,
    policy_version: int | None = None,
    max_staleness: int | None = None,
) -> Batch:
    """A training batch from groups of rollout results (models or their dicts).

    ``groups`` holds one group a prompt, each the n results sampled for that prompt.
    ``advantage`` picks the recipe (``"grpo"``, ``"dr_grpo"``, ``"dapo"``; see the module
    docstring). ``failed`` says what happens to a result whose state is not ``"done"`` or whose
    reward is None: ``"drop"`` removes it from its group before the group's mean and std (a group
    left empty is dropped); ``"mask"`` keeps its tokens as a row with reward 0, advantage 0 and
    an all-zero loss_mask, outside the group's statistics; ``"drop_group"`` drops the whole group
    of a result that failed for an infrastructure reason (and others as ``"drop"``). Groups of
    one (usable) result get advantage 0. ``max_length`` caps the width: L is the longest
    prompt + response, or ``max_length`` if that is smaller, and longer rows lose their last
    tokens (counted in ``Batch.truncated``, with a warning); their job gets what ``truncated``
    says (``"mask"``, ``"penalise"`` with ``truncated_reward``, ``"keep"``; see
    :mod:`raas.client.sample_choices`). ``generation_budget`` is Dr. GRPO's constant loss
    normaliser (ignored by the other recipes). ``segments`` says which of a gateway job's
    segments become rows (``"all"``, ``"first"``, ``"last"``; see the module docstring): every
    row of a job has the job's reward and advantage. ``policy_version`` (the trainer's version,
    in the backend's numbering) gives each row its ``staleness``; ``max_staleness`` (which needs
    it) drops a job whose oldest token lags more, before its group's statistics.

    Raises ValueError for an unknown option, and for a usable result whose response_ids,
    loss_mask and logprobs differ in length, whose loss_mask holds other than 0 and 1, or whose
    reward is not finite (the message names the job_id).
    """
    if advantage not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {', '.join(ADVANTAGES)}; got {advantage!r}")
    failed = check_choice("failed", failed, FAILED_CHOICES)
    truncated = check_choice("truncated", truncated, TRUNCATED_CHOICES)
    truncated_reward = check_truncated_reward(truncated_reward)
    if max_length is not None and (isinstance(max_length, bool) or max_length < 1):
        raise ValueError(f"max_length must be a positive integer or None; got {max_length!r}")
    if generation_budget is not None and (
        isinstance(generation_budget, bool) or generation_budget < 1
    ):
        raise ValueError(
            f"generation_budget must be a positive integer or None; got {generation_budget!r}"
        )
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    if max_staleness is not None and (policy_version is None or max_staleness < 0):
        raise ValueError(
            "max_staleness needs policy_version (the trainer's current version) and must be"
            f" >= 0; got max_staleness={max_staleness!r}, policy_version={policy_version!r}"
        )
    segments = check_segments(segments)
    normalise = advantage != "dr_grpo"

    # Which jobs become rows, group by group: (result, its rows, its reward or None: masked).
    kept_groups: list[tuple[int, list[_Job]]] = []
    dropped = masked = dropped_groups = stale = 0
    for g, group in enumerate(groups):
        results = [_as_result(item, g, j) for j, item in enumerate(_members(group, g))]
        if failed == "drop_group" and any(map(failed_by_infra, results)):
            dropped += len(results)
            dropped_groups += 1
            continue
        jobs: list[_Job] = []
        for result in results:
            picked = trajectories(result, segments)
            lag = None if policy_version is None else token_lag(result, policy_version)
            reward = _usable_reward(result, [t for _, t in picked])
            if reward is None and failed != "mask":
                dropped += 1
            elif too_stale(lag, max_staleness):
                stale += 1
            else:
                jobs.append(_Job(result, picked, reward, lag))
                masked += len(picked) if reward is None else 0
        if jobs:
            kept_groups.append((g, jobs))
        else:
            dropped_groups += 1

    all_trajs = [t for _, jobs in kept_groups for job in jobs for _, t in job.rows]
    longest = max((len(t.prompt_ids) + len(t.response_ids) for t in all_trajs), default=0)
    width = longest if max_length is None else min(longest, max_length)

    rows: list[RolloutResult] = []
    row_masked: list[bool] = []
    row_trajs: list[Trajectory] = []
    row_segment: list[int] = []
    row_group: list[int] = []
    row_reward: list[float] = []
    row_advantage: list[float] = []
    row_lag: list[int] = []
    for g, jobs in kept_groups:
        for job in jobs:  # a job cut to the width gets the reward ``truncated`` says
            if job.reward is not None and any(_length(t) > width for _, t in job.rows):
                job.reward, job.masked = truncated_outcome(job.reward, truncated, truncated_reward)
        scored = [job.reward for job in jobs if job.reward is not None]
        advantages = iter(_group_advantages(scored, normalise, eps))
        for job in jobs:
            k = len(job.rows)  # every row of a job: the job's reward and advantage
            adv = next(advantages) if job.reward is not None else 0.0
            row_masked += [job.masked or job.reward is None] * k
            row_reward += [job.reward if job.reward is not None else 0.0] * k
            row_advantage += [0.0 if job.masked else adv] * k
            row_lag += [-1 if job.lag is None else job.lag] * k
            rows += [job.result] * k
            row_segment += [segment for segment, _ in job.rows]
            row_trajs += [traj for _, traj in job.rows]
            row_group += [g] * k

    n = len(rows)
    input_ids: IntArray = np.full((n, width), pad_token_id, dtype=np.int64)
    attention_mask: IntArray = np.zeros((n, width), dtype=np.int64)
    loss_mask: IntArray = np.zeros((n, width), dtype=np.int64)
    old_logprobs_64 = np.zeros((n, width), dtype=np.float64)
    prompt_lengths: IntArray = np.zeros(n, dtype=np.int64)
    response_lengths: IntArray = np.zeros(n, dtype=np.int64)
    cut = 0

    for i, (traj, is_masked) in enumerate(zip(row_trajs, row_masked, strict=True)):
        tokens = traj.prompt_ids + traj.response_ids
        end = min(len(tokens), width)
        if len(tokens) > width:
            cut += 1
        input_ids[i, :end] = tokens[:end]
        attention_mask[i, :end] = 1
        start = min(len(traj.prompt_ids), width)
        prompt_lengths[i] = start
        response_lengths[i] = end - start
        if is_masked or end == start:
            continue
        kept_mask = np.asarray(traj.loss_mask[: end - start], dtype=np.int64)
        loss_mask[i, start:end] = kept_mask
        old_logprobs_64[i, start:end] = np.asarray(traj.logprobs[: end - start]) * kept_mask

    if cut:
        warnings.warn(
            f"to_batch: {cut} of {n} rows were longer than max_length={max_length} and lost"
            f" their last tokens; their jobs are truncated={truncated!r}"
            + (f" (reward {truncated_reward})" if truncated == "penalise" else ""),
            stacklevel=2,
        )

    advantages_64 = np.asarray(row_advantage, dtype=np.float64).reshape(n)
    weights = _loss_weights(loss_mask, advantage, generation_budget or max_length or width)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs_64.astype(np.float32),
        rewards=np.asarray(row_reward, dtype=np.float32).reshape(n),
        advantages=advantages_64.astype(np.float32),
        token_advantages=(advantages_64[:, None] * loss_mask).astype(np.float32),
        loss_weights=weights.astype(np.float32),
        group_index=np.asarray(row_group, dtype=np.int64).reshape(n),
        prompt_lengths=prompt_lengths,
        response_lengths=response_lengths,
        segment_index=np.asarray(row_segment, dtype=np.int64).reshape(n),
        staleness=np.asarray(row_lag, dtype=np.int64).reshape(n),
        dropped=dropped,
        masked=masked,
        truncated=cut,
        stale=stale,
        dropped_groups=dropped_groups,
        job_ids=tuple(r.job_id for r in rows),
    )


@dataclass
class _Job:
    """A result that becomes rows: its (segment, trajectory)s, its reward (None: a masked
    failure), whether its rows are masked (truncated="mask"), its oldest token's lag."""

    result: RolloutResult
    rows: list[tuple[int, Trajectory]]
    reward: float | None
    lag: int | None
    masked: bool = False


def _length(traj: Trajectory) -> int:
    return len(traj.prompt_ids) + len(traj.response_ids)


def _members(group: Iterable[ResultLike] | HasResults, g: int) -> Iterable[ResultLike]:
    if isinstance(group, RolloutResult | Mapping):
        raise TypeError(
            f"groups[{g}] is a single result; pass a sequence of groups, each a sequence of "
            "the results of one prompt"
        )
    if not isinstance(group, Iterable):
        return group.results
    return group


def _as_result(item: object, g: int, j: int) -> RolloutResult:
    if isinstance(item, RolloutResult):
        return item
    if isinstance(item, Mapping):
        return RolloutResult.model_validate(item)
    raise TypeError(
        f"groups[{g}][{j}] must be a RolloutResult or a dict; got {type(item).__name__}"
    )


def _usable_reward(result: RolloutResult, trajs: Sequence[Trajectory]) -> float | None:
    """The reward of a result that takes part in its group's statistics (its trajectories
    validated), else None."""
    reward = result.reward
    if result.state != "done" or reward is None:
        return None
    if not math.isfinite(reward):
        raise ValueError(f"job {result.job_id!r}: reward is {reward!r}, not a finite number")
    for k, traj in enumerate(trajs):
        where = f"job {result.job_id!r}" + (f" segment {k}" if len(trajs) > 1 else "")
        lengths = (len(traj.response_ids), len(traj.loss_mask), len(traj.logprobs))
        if len(set(lengths)) != 1:
            raise ValueError(
                f"{where}: response_ids has {lengths[0]} tokens but loss_mask has "
                f"{lengths[1]} and logprobs has {lengths[2]}; they must be aligned"
            )
        if any(m not in (0, 1) for m in traj.loss_mask):
            raise ValueError(f"{where}: loss_mask must hold only 0 and 1")
    return float(reward)


def _group_advantages(rewards: Sequence[float], normalise: bool, eps: float) -> list[float]:
    """Reward minus the group's mean, over the sample std (n - 1) plus eps when normalising."""
    n = len(rewards)
    if n < 2 or min(rewards) == max(rewards):
        return [0.0] * n
    mean = math.fsum(rewards) / n
    deviations = [r - mean for r in rewards]
    if not normalise:
        return deviations
    std = math.sqrt(math.fsum(d * d for d in deviations) / (n - 1))
    return [d / (std + eps) for d in deviations]


def _loss_weights(
    loss_mask: IntArray, advantage: AdvantageName, budget: int
) -> npt.NDArray[np.float64]:
    counts = loss_mask.sum(axis=1).astype(np.float64)
    active = counts > 0
    n_active = int(active.sum())
    per_row = np.zeros(len(counts), dtype=np.float64)
    if n_active:
        if advantage == "dapo":
            per_row[active] = 1.0 / counts.sum()
        elif advantage == "grpo":
            per_row[active] = 1.0 / (counts[active] * n_active)
        else:  # dr_grpo
            per_row[active] = 1.0 / (budget * n_active)
    weights: npt.NDArray[np.float64] = per_row[:, None] * loss_mask
    return weights
