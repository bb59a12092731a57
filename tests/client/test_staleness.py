"""Staleness on tokens: the oldest generated token's policy version against the trainer's, in
collect_groups, the rollout metrics and collect_groups' report (to_batch's: test_to_batch.py)."""

from __future__ import annotations

from typing import Any

import pytest

from raas.client import DapoReport, collect_groups, dapo_metrics, rollout_metrics
from raas.client.staleness import oldest_version, staleness_metrics, token_lag
from raas.wire import RolloutRequest, RolloutResult


def result(job_id: str, reward: float, *turns: dict[str, Any]) -> RolloutResult:
    return RolloutResult.model_validate(
        {
            "job_id": job_id,
            "state": "done",
            "reward": reward,
            "trajectory": {"turns": list(turns)},
            "data_source": "test",
            "timing": {"queue_s": 0, "init_s": 0, "run_s": 0, "eval_s": 0, "total_s": 0},
        }
    )


def test_the_lag_is_the_oldest_token_s_over_every_turn_and_segment() -> None:
    job = result("j", 1.0, {"policy_version": 7}, {"policy_versions": [5, 6, 6]})
    assert oldest_version(job) == 5 and token_lag(job, 8) == 3
    # A gateway job: its later segments' turns count too.
    older = {"prompt_ids": [1], "turns": [{"policy_version": 2}]}
    job.metrics["segments"] = [job.trajectory.model_dump(), older]
    assert oldest_version(job) == 2
    assert token_lag(result("u", 1.0, {"policy_version": None}), 8) is None


def test_the_lag_distribution_leaves_unknown_lags_out_and_says_how_many_were_known() -> None:
    assert staleness_metrics([0, 0, 2, None]) == {
        "staleness/known_frac": 0.75,
        "staleness/mean": pytest.approx(2 / 3),
        "staleness/p50": 0.0,
        "staleness/p90": pytest.approx(1.6),
        "staleness/max": 2.0,
        "staleness/on_policy_frac": pytest.approx(2 / 3),
    }
    assert staleness_metrics([None]) == {"staleness/known_frac": 0.0}
    assert staleness_metrics([]) == {}
    batch = [result("a", 1.0, {"policy_version": 3}), result("b", 0.0, {"policy_version": 4})]
    metrics = rollout_metrics(batch, policy_version=4)
    assert metrics["rollout/staleness/max"] == 1.0 and metrics["rollout/staleness/mean"] == 0.5
    assert not any("staleness" in name for name in rollout_metrics(batch))


class VersionedJobs:
    """Stands in for RolloutClient: the k-th sample of a task ends with the reward and the
    policy version its instance names for k."""

    def __init__(self) -> None:
        self.requests: dict[str, RolloutRequest] = {}

    async def submit_batch(self, requests: list[RolloutRequest]) -> list[str]:
        self.requests |= {str(r.job_id): r for r in requests}
        return [str(r.job_id) for r in requests]

    async def wait(self, job_id: str) -> RolloutResult:
        k = int(job_id.rsplit("-", 1)[1])
        reward, version = self.requests[job_id].instance["samples"][k]
        return result(job_id, reward, {"policy_version": version})

    async def cancel_all(self, job_ids: list[str], timeout_s: float = 30.0) -> None:
        pass


async def test_collect_groups_drops_a_group_with_a_token_older_than_the_bound() -> None:
    prompts = [
        {"data_source": "test", "samples": [[1.0, 9], [0.0, 7]]},  # a token 3 behind 10
        {"data_source": "test", "samples": [[1.0, 10], [0.0, 9]]},
        {"data_source": "test", "samples": [[0.0, 8], [1.0, 8]]},
    ]
    settings: dict[str, Any] = {"n": 2, "batch_size": 3, "max_in_flight": 6}
    client: Any = VersionedJobs()
    kept, report = await collect_groups(
        client, prompts, **settings, policy_version=lambda: 10, max_token_staleness=2
    )
    assert [g.task for g in kept] == prompts[1:]
    assert report.groups_token_stale == 1 and report.groups_stale == 0
    assert sorted(report.token_lags, key=str) == [0, 1, 2, 2]
    metrics = dapo_metrics(report)
    assert metrics["dapo/groups_token_stale"] == 1.0
    assert metrics["dapo/staleness/max"] == 2.0 and metrics["dapo/staleness/known_frac"] == 1.0
    now = {"policy_version": lambda: 10}
    everything, report = await collect_groups(client, prompts, **settings, **now)
    assert len(everything) == 3 and report.groups_token_stale == 0
    with pytest.raises(ValueError, match="max_token_staleness needs policy_version"):
        await collect_groups(client, prompts, **settings, max_token_staleness=2)
    assert "dapo/staleness/mean" not in dapo_metrics(DapoReport())
