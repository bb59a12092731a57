"""raas.client.batch.to_batch against a hand-computed example.

Group A (prompt [11, 12]) and group B (prompt [13]), three samples each:

    job  response          loss_mask   logprobs                      reward
    a0   21 22 23          1 0 1       -0.5  0    -0.25              1
    a1   31                1           -1                            0
    a2   41 42             1 1         -0.125 -0.75                  0
    b0   51 52             1 1         -0.5  -1.5                    1
    b1   61 62 63 64       1 1 0 1     -1    -2   0    -4            1
    b2   71                1           -0.0625                       1

Policy tokens a row: 2 1 2 2 3 1 (11 in all), six rows with at least one. Longest row: 5 tokens.

Group A's rewards 1, 0, 0: mean 1/3, deviations 2/3, -1/3, -1/3, sample variance
(4/9 + 1/9 + 1/9) / 2 = 1/3, std 1/sqrt(3), so GRPO's advantages are 2/sqrt(3), -1/sqrt(3),
-1/sqrt(3) (1.1547, -0.57735) and Dr. GRPO's 2/3, -1/3, -1/3. Group B's rewards are all 1: 0.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import pytest

from raas.client.batch import Batch, to_batch
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory

R3 = 3**0.5
R2 = 2**0.5


def result(
    job_id: str,
    prompt: list[int],
    response: list[int],
    loss_mask: list[int],
    logprobs: list[float],
    reward: float | None,
    state: str = "done",
) -> RolloutResult:
    return RolloutResult(
        job_id=job_id,
        state=state,  # type: ignore[arg-type]
        reward=reward,
        trajectory=Trajectory(
            prompt_ids=prompt, response_ids=response, loss_mask=loss_mask, logprobs=logprobs
        ),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
        data_source="test",
    )


def group_a(a1_state: str = "done", a1_reward: float | None = 0.0) -> list[RolloutResult]:
    return [
        result("a0", [11, 12], [21, 22, 23], [1, 0, 1], [-0.5, 0.0, -0.25], 1.0),
        result("a1", [11, 12], [31], [1], [-1.0], a1_reward, a1_state),
        result("a2", [11, 12], [41, 42], [1, 1], [-0.125, -0.75], 0.0),
    ]


def group_b() -> list[RolloutResult]:
    return [
        result("b0", [13], [51, 52], [1, 1], [-0.5, -1.5], 1.0),
        result("b1", [13], [61, 62, 63, 64], [1, 1, 0, 1], [-1.0, -2.0, 0.0, -4.0], 1.0),
        result("b2", [13], [71], [1], [-0.0625], 1.0),
    ]


INPUT_IDS = [
    [11, 12, 21, 22, 23],
    [11, 12, 31, 0, 0],
    [11, 12, 41, 42, 0],
    [13, 51, 52, 0, 0],
    [13, 61, 62, 63, 64],
    [13, 71, 0, 0, 0],
]
ATTENTION = [
    [1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0],
    [1, 1, 1, 1, 0],
    [1, 1, 1, 0, 0],
    [1, 1, 1, 1, 1],
    [1, 1, 0, 0, 0],
]
LOSS_MASK = [
    [0, 0, 1, 0, 1],
    [0, 0, 1, 0, 0],
    [0, 0, 1, 1, 0],
    [0, 1, 1, 0, 0],
    [0, 1, 1, 0, 1],
    [0, 1, 0, 0, 0],
]
OLD_LOGPROBS = [
    [0, 0, -0.5, 0, -0.25],
    [0, 0, -1.0, 0, 0],
    [0, 0, -0.125, -0.75, 0],
    [0, -0.5, -1.5, 0, 0],
    [0, -1.0, -2.0, 0, -4.0],
    [0, -0.0625, 0, 0, 0],
]


def eq(array: np.ndarray[Any, Any], expected: Any, dtype: Any) -> None:
    assert array.dtype == dtype
    np.testing.assert_array_equal(array, np.array(expected, dtype=dtype))


def close(array: np.ndarray[Any, Any], expected: Any) -> None:
    assert array.dtype == np.float32
    np.testing.assert_allclose(array, np.array(expected, dtype=np.float64), rtol=1e-5, atol=1e-7)


def test_tokens_masks_and_logprobs() -> None:
    batch = to_batch([group_a(), group_b()], pad_token_id=0)
    assert len(batch) == 6
    eq(batch.input_ids, INPUT_IDS, np.int64)
    eq(batch.attention_mask, ATTENTION, np.int64)
    eq(batch.loss_mask, LOSS_MASK, np.int64)
    eq(batch.old_logprobs, OLD_LOGPROBS, np.float32)
    eq(batch.rewards, [1, 0, 0, 1, 1, 1], np.float32)
    eq(batch.group_index, [0, 0, 0, 1, 1, 1], np.int64)
    eq(batch.prompt_lengths, [2, 2, 2, 1, 1, 1], np.int64)
    eq(batch.response_lengths, [3, 1, 2, 2, 4, 1], np.int64)
    assert batch.job_ids == ("a0", "a1", "a2", "b0", "b1", "b2")
    assert (batch.dropped, batch.masked, batch.truncated, batch.dropped_groups) == (0, 0, 0, 0)


def test_pad_token_id() -> None:
    batch = to_batch([group_a()], pad_token_id=-7)
    eq(
        batch.input_ids,
        [[11, 12, 21, 22, 23], [11, 12, 31, -7, -7], [11, 12, 41, 42, -7]],
        np.int64,
    )


def test_grpo_advantages_and_sequence_mean_weights() -> None:
    batch = to_batch([group_a(), group_b()], advantage="grpo")
    a = [2 / R3, -1 / R3, -1 / R3, 0, 0, 0]
    close(batch.advantages, a)
    close(batch.token_advantages, [[a[i] * m for m in row] for i, row in enumerate(LOSS_MASK)])
    # 1 / (policy tokens of the row * 6 rows); every row sums to 1/6.
    w = [1 / 12, 1 / 6, 1 / 12, 1 / 12, 1 / 18, 1 / 6]
    close(batch.loss_weights, [[w[i] * m for m in row] for i, row in enumerate(LOSS_MASK)])
    assert batch.loss_weights.sum() == pytest.approx(1.0)


def test_grpo_divides_by_the_sample_std_plus_eps() -> None:
    # Rewards 2 and 0: mean 1, sample std sqrt(2) (the population std would be 1).
    group = [
        result("x", [1], [2], [1], [-1.0], 2.0),
        result("y", [1], [3], [1], [-1.0], 0.0),
    ]
    close(to_batch([group]).advantages, [1 / R2, -1 / R2])
    close(to_batch([group], eps=1.0).advantages, [1 / (R2 + 1), -1 / (R2 + 1)])


def test_dapo_advantages_and_token_level_weights() -> None:
    batch = to_batch([group_a(), group_b()], advantage="dapo")
    close(batch.advantages, [2 / R3, -1 / R3, -1 / R3, 0, 0, 0])
    # Every policy token of the batch weighs 1/11.
    close(batch.loss_weights, [[m / 11 for m in row] for row in LOSS_MASK])


def test_dr_grpo_advantages_and_constant_budget_weights() -> None:
    batch = to_batch([group_a(), group_b()], advantage="dr_grpo", generation_budget=4)
    close(batch.advantages, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0])
    close(batch.token_advantages[0], [0, 0, 2 / 3, 0, 2 / 3])
    # 1 / (budget 4 * 6 rows).
    close(batch.loss_weights, [[m / 24 for m in row] for row in LOSS_MASK])
    # Without a budget: max_length (8, wider than the batch), then the batch's width (5).
    batch = to_batch([group_a(), group_b()], advantage="dr_grpo", max_length=8)
    assert batch.input_ids.shape == (6, 5)
    close(batch.loss_weights, [[m / 48 for m in row] for row in LOSS_MASK])
    batch = to_batch([group_a(), group_b()], advantage="dr_grpo")
    close(batch.loss_weights, [[m / 30 for m in row] for row in LOSS_MASK])


def test_failed_drop_removes_the_row_before_the_group_statistics() -> None:
    batch = to_batch([group_a("timeout", None), group_b()], failed="drop")
    assert (batch.dropped, batch.masked, batch.dropped_groups) == (1, 0, 0)
    assert batch.job_ids == ("a0", "a2", "b0", "b1", "b2")
    eq(batch.input_ids, [INPUT_IDS[i] for i in (0, 2, 3, 4, 5)], np.int64)
    eq(batch.loss_mask, [LOSS_MASK[i] for i in (0, 2, 3, 4, 5)], np.int64)
    eq(batch.group_index, [0, 0, 1, 1, 1], np.int64)
    # Group A is now rewards 1, 0: mean 1/2, sample std sqrt(1/2), advantages +-1/sqrt(2).
    close(batch.advantages, [1 / R2, -1 / R2, 0, 0, 0])
    # Five rows: 1 / (2 * 5) for the two-token rows, 1 / (3 * 5) and 1 / 5.
    w = [1 / 10, 1 / 10, 1 / 10, 1 / 15, 1 / 5]
    close(
        batch.loss_weights,
        [[w[i] * m for m in LOSS_MASK[r]] for i, r in enumerate((0, 2, 3, 4, 5))],
    )


@pytest.mark.parametrize(("kind", "rows"), [("infra", 3), ("policy", 5)])
def test_drop_group_drops_a_group_with_an_infra_failure_whole(kind: str, rows: int) -> None:
    group = group_a("failed", None)
    group[1] = group[1].model_copy(
        update={"error": ErrorInfo(type="SandboxError", message="died", kind=kind)}  # type: ignore[arg-type]
    )
    batch = to_batch([group, group_b()], failed="drop_group")
    assert len(batch) == rows
    if kind == "infra":  # all of group A goes: its statistics would be the survivors'
        assert (batch.dropped, batch.dropped_groups) == (3, 1)
        eq(batch.group_index, [1, 1, 1], np.int64)
    else:  # a policy failure is dropped alone, as failed="drop" does
        assert (batch.dropped, batch.dropped_groups) == (1, 0)
        assert batch.job_ids == ("a0", "a2", "b0", "b1", "b2")


def test_failed_mask_keeps_a_row_without_gradient() -> None:
    # A timed-out job that still carries a reward is a failure all the same.
    batch = to_batch([group_a("timeout", 1.0), group_b()], failed="mask")
    assert (batch.dropped, batch.masked) == (0, 1)
    assert len(batch) == 6
    eq(batch.input_ids, INPUT_IDS, np.int64)  # its own tokens, nothing from a sibling
    eq(batch.attention_mask, ATTENTION, np.int64)
    eq(batch.loss_mask[1], [0, 0, 0, 0, 0], np.int64)
    eq(batch.loss_mask[[0, 2, 3, 4, 5]], [LOSS_MASK[i] for i in (0, 2, 3, 4, 5)], np.int64)
    eq(batch.old_logprobs[1], [0, 0, 0, 0, 0], np.float32)
    eq(batch.rewards, [1, 0, 0, 1, 1, 1], np.float32)
    close(batch.advantages, [1 / R2, 0, -1 / R2, 0, 0, 0])
    eq(batch.token_advantages[1], [0, 0, 0, 0, 0], np.float32)
    eq(batch.loss_weights[1], [0, 0, 0, 0, 0], np.float32)
    close(batch.loss_weights[0], [0, 0, 1 / 10, 0, 1 / 10])  # five rows carry gradient


def test_done_without_reward_counts_as_failed() -> None:
    batch = to_batch([group_a("done", None)])
    assert batch.dropped == 1
    close(batch.advantages, [1 / R2, -1 / R2])


def test_a_group_with_no_usable_result_is_dropped() -> None:
    broken = [result("c0", [5], [6], [1], [-1.0], None, "failed")]
    batch = to_batch([broken, group_b(), []])
    assert (batch.dropped, batch.dropped_groups) == (1, 2)
    eq(batch.group_index, [1, 1, 1], np.int64)
    # In mask mode the lone failure stays, with nothing to learn from it.
    batch = to_batch([broken], failed="mask")
    assert (len(batch), batch.masked, batch.dropped_groups) == (1, 1, 0)
    eq(batch.input_ids, [[5, 6]], np.int64)
    eq(batch.loss_weights, [[0, 0]], np.float32)


def test_a_group_of_one_has_no_advantage() -> None:
    batch = to_batch([[result("x", [1], [2], [1], [-1.0], 5.0)]])
    eq(batch.advantages, [0], np.float32)
    eq(batch.rewards, [5], np.float32)


def test_max_length_truncates_from_the_right() -> None:
    with pytest.warns(UserWarning, match="2 of 6 rows.*truncated='keep'"):
        batch = to_batch([group_a(), group_b()], max_length=4, advantage="dapo", truncated="keep")
    assert batch.truncated == 2
    eq(batch.input_ids, [row[:4] for row in INPUT_IDS], np.int64)
    eq(batch.attention_mask, [row[:4] for row in ATTENTION], np.int64)
    eq(batch.loss_mask, [row[:4] for row in LOSS_MASK], np.int64)
    eq(batch.old_logprobs, [row[:4] for row in OLD_LOGPROBS], np.float32)
    eq(batch.response_lengths, [2, 1, 2, 2, 3, 1], np.int64)
    close(batch.advantages, [2 / R3, -1 / R3, -1 / R3, 0, 0, 0])  # rewards are not truncated
    # Policy tokens left: 1 1 2 2 2 1 = 9.
    close(batch.loss_weights, [[m / 9 for m in row[:4]] for row in LOSS_MASK])


def test_a_truncated_job_is_masked_by_default_and_its_reward_stays_in_the_group() -> None:
    with pytest.warns(UserWarning, match="truncated='mask'"):
        batch = to_batch([group_a(), group_b()], max_length=4, advantage="dapo")
    assert batch.truncated == 2 and batch.masked == 0
    masked = [row[:4] for row in LOSS_MASK]
    masked[0] = masked[4] = [0, 0, 0, 0]  # a0 and b1 were cut
    eq(batch.loss_mask, masked, np.int64)
    # a0's reward 1.0 still counts: a1 and a2 keep the advantages of the uncut batch.
    close(batch.advantages, [0, -1 / R3, -1 / R3, 0, 0, 0])
    close(batch.rewards, [1, 0, 0, 1, 1, 1])
    # Policy tokens left: 0 1 2 2 0 1 = 6.
    close(batch.loss_weights, [[m / 6 for m in row] for row in masked])


def test_a_truncated_job_can_be_penalised() -> None:
    with pytest.warns(UserWarning, match=r"truncated='penalise' \(reward -1.0\)"):
        batch = to_batch([group_a()], max_length=4, truncated="penalise", truncated_reward=-1.0)
    close(batch.rewards, [-1, 0, 0])
    mean, std = -1 / 3, (((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2) ** 0.5
    close(batch.advantages, [(r - mean) / (std + 1e-6) for r in (-1, 0, 0)])
    eq(batch.loss_mask, [row[:4] for row in LOSS_MASK[:3]], np.int64)  # trained, on -1
    with pytest.raises(ValueError, match="truncated_reward"):
        to_batch([group_a()], truncated="penalise", truncated_reward=float("nan"))
    with pytest.raises(ValueError, match="truncated must be one of mask, penalise, keep"):
        to_batch([group_a()], truncated="cut")  # type: ignore[arg-type]


def test_max_length_inside_the_prompt_leaves_nothing_to_learn() -> None:
    with pytest.warns(UserWarning):
        batch = to_batch([group_a()], max_length=1)
    eq(batch.input_ids, [[11], [11], [11]], np.int64)
    eq(batch.prompt_lengths, [1, 1, 1], np.int64)
    eq(batch.response_lengths, [0, 0, 0], np.int64)
    eq(batch.loss_weights, [[0], [0], [0]], np.float32)


def test_no_warning_without_truncation() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert to_batch([group_a()], max_length=5).truncated == 0


def test_dicts_give_the_same_batch_as_models() -> None:
    models = [group_a("timeout", None), group_b()]
    dicts = [[r.model_dump() for r in g] for g in models]
    for failed in ("drop", "mask"):
        a = to_batch(models, failed=failed, advantage="dapo")
        b = to_batch(dicts, failed=failed, advantage="dapo")
        for name in ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "rewards"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        for name in ("advantages", "token_advantages", "loss_weights", "group_index"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert (a.dropped, a.masked, a.job_ids) == (b.dropped, b.masked, b.job_ids)


def test_group_objects_with_results() -> None:
    class Group:
        def __init__(self, results: list[RolloutResult]) -> None:
            self.results = results

    batch = to_batch([Group(group_a()), Group(group_b())])
    eq(batch.input_ids, INPUT_IDS, np.int64)


def test_empty_input() -> None:
    batch = to_batch([])
    assert len(batch) == 0
    assert batch.input_ids.shape == (0, 0)
    assert batch.advantages.shape == (0,)


@pytest.mark.parametrize(
    ("response", "loss_mask", "logprobs"),
    [([1, 2, 3], [1, 1], [0.0, 0.0, 0.0]), ([1, 2], [1, 1], [0.0]), ([1], [2], [0.0])],
)
def test_misaligned_trajectories_name_the_job(
    response: list[int], loss_mask: list[int], logprobs: list[float]
) -> None:
    bad = result("job-bad-17", [1], response, loss_mask, logprobs, 1.0)
    with pytest.raises(ValueError, match="job-bad-17"):
        to_batch([[*group_b(), bad]])


def test_non_finite_reward_names_the_job() -> None:
    with pytest.raises(ValueError, match="job-nan"):
        to_batch([[result("job-nan", [1], [2], [1], [0.0], float("nan"))]])


def test_unknown_options_are_named() -> None:
    with pytest.raises(ValueError, match="advantage"):
        to_batch([group_a()], advantage="ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="failed"):
        to_batch([group_a()], failed="zero")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_length"):
        to_batch([group_a()], max_length=0)
    with pytest.raises(ValueError, match="generation_budget"):
        to_batch([group_a()], generation_budget=0)
    with pytest.raises(ValueError, match="eps"):
        to_batch([group_a()], eps=-1.0)
    with pytest.raises(TypeError, match="single result"):
        to_batch(group_a())  # type: ignore[arg-type]


def test_to_torch() -> None:
    import torch  # a dev dependency: make test always has it

    batch = to_batch([group_a(), group_b()])
    tensors = batch.to_torch()
    int64 = ("input_ids", "attention_mask", "loss_mask", "group_index")
    float32 = ("old_logprobs", "rewards", "advantages", "token_advantages", "loss_weights")
    for name in int64 + ("prompt_lengths", "response_lengths"):
        assert tensors[name].dtype == torch.int64, name
    for name in float32:
        assert tensors[name].dtype == torch.float32, name
    for name in ("input_ids", "loss_mask", "old_logprobs", "token_advantages", "loss_weights"):
        assert tuple(tensors[name].shape) == (6, 5), name
    assert tuple(tensors["advantages"].shape) == (6,)
    assert tensors["input_ids"].tolist() == INPUT_IDS
    assert tensors["input_ids"].device.type == "cpu"


def test_to_torch_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="needs PyTorch"):
        to_batch([group_a()]).to_torch()


def test_batch_is_a_dataclass_of_arrays() -> None:
    batch = to_batch([group_a()])
    assert isinstance(batch, Batch)
    assert batch.loss_weights.shape == batch.input_ids.shape == (3, 5)


def two_segment_job(job_id: str, reward: float) -> RolloutResult:
    """A gateway job whose agent compacted its context: segment 0 (the result's trajectory)
    and segment 1, a prompt of its own, in metrics.segments as the harness task writes them."""
    first = Trajectory(
        prompt_ids=[11, 12],
        response_ids=[21, 22, 23],
        loss_mask=[1, 0, 1],
        logprobs=[-0.5, 0.0, -0.25],
    )
    second = Trajectory(prompt_ids=[14], response_ids=[81, 82], loss_mask=[1, 1], logprobs=[-1, -2])
    done = result(job_id, [], [], [], [], reward)
    return done.model_copy(
        update={
            "trajectory": first,
            "metrics": {"segments": [{**s.model_dump(), "drift": 0} for s in (first, second)]},
        }
    )


def test_every_segment_of_a_gateway_job_is_a_row_with_the_job_s_reward() -> None:
    group = [two_segment_job("g0", 1.0), result("g1", [11, 12], [31], [1], [-1.0], 0.0)]
    batch = to_batch([group])
    assert batch.job_ids == ("g0", "g0", "g1")
    assert batch.segment_index.tolist() == [0, 1, 0]
    assert batch.input_ids.tolist() == [
        [11, 12, 21, 22, 23],
        [14, 81, 82, 0, 0],
        [11, 12, 31, 0, 0],
    ]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 0, 1], [0, 1, 1, 0, 0], [0, 0, 1, 0, 0]]
    assert batch.old_logprobs[1].tolist() == [0.0, -1.0, -2.0, 0.0, 0.0]
    assert batch.prompt_lengths.tolist() == [2, 1, 2]
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0]
    assert batch.group_index.tolist() == [0, 0, 0]
    # The group's statistics are over its two jobs (rewards 1 and 0), each counted once.
    assert batch.advantages.tolist() == pytest.approx([1 / R2, 1 / R2, -1 / R2], rel=1e-5)
    # grpo: three rows with policy tokens, each weighs 1 / (tokens * 3).
    assert batch.loss_weights.sum() == pytest.approx(1.0)
    assert batch.loss_weights[1].tolist() == pytest.approx([0, 1 / 6, 1 / 6, 0, 0])


def test_segments_first_or_last_keeps_one_row_a_job() -> None:
    group = [two_segment_job("g0", 1.0), result("g1", [11, 12], [31], [1], [-1.0], 0.0)]
    first = to_batch([group], segments="first")
    assert first.job_ids == ("g0", "g1") and first.segment_index.tolist() == [0, 0]
    assert first.input_ids[0].tolist() == [11, 12, 21, 22, 23]
    last = to_batch([group], segments="last")
    assert last.job_ids == ("g0", "g1") and last.segment_index.tolist() == [1, 0]
    assert last.input_ids[0].tolist() == [14, 81, 82]
    with pytest.raises(ValueError, match="segments must be one of all, first, last"):
        to_batch([group], segments="middle")  # type: ignore[arg-type]


def test_a_misaligned_segment_is_refused_naming_it() -> None:
    job = two_segment_job("g0", 1.0)
    job.metrics["segments"][1]["logprobs"] = [-1.0]
    with pytest.raises(ValueError, match="job 'g0' segment 1: response_ids has 2 tokens"):
        to_batch([[job]])
    assert len(to_batch([[job]], segments="first")) == 1  # the segment left out is not read


def test_a_masked_failure_keeps_its_segments_without_gradient() -> None:
    job = two_segment_job("g0", 1.0).model_copy(update={"state": "failed", "reward": None})
    batch = to_batch([[job]], failed="mask")
    assert len(batch) == 2 and batch.masked == 2 and batch.loss_mask.sum() == 0


def versioned(job: RolloutResult, *turns: dict[str, Any]) -> RolloutResult:
    """``job`` with turn records naming the policy versions of its tokens."""
    traj = job.trajectory.model_copy(update={"turns": list(turns)})
    return job.model_copy(update={"trajectory": traj})


def test_staleness_is_the_oldest_tokens_lag_and_max_staleness_drops_a_job() -> None:
    a0, a1, a2 = group_a()
    group = [
        versioned(a0, {"policy_version": 5}, {"policy_versions": [3, 3, 4]}),  # oldest 3: lag 2
        versioned(a1, {"policy_versions": [4, 5]}),  # lag 1
        versioned(a2, {"policy_version": None}),  # the backend said nothing
    ]
    batch = to_batch([group], policy_version=5)
    eq(batch.staleness, [2, 1, -1], np.int64)
    assert batch.stale == 0
    batch = to_batch([group], policy_version=5, max_staleness=1)
    assert batch.stale == 1 and batch.job_ids == ("a1", "a2")
    close(batch.advantages, [0, 0])  # a0's reward 1.0 is out of the group: 0 and 0 are left
    eq(batch.staleness, [1, -1], np.int64)
    assert "staleness" in batch.to_torch()
    with pytest.raises(ValueError, match="max_staleness needs policy_version"):
        to_batch([group], max_staleness=1)
