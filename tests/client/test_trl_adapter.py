"""The TRL adapter without TRL: its rollout_func called the way GRPOTrainer calls it (prompts
repeated num_generations times, the trainer as second argument, read for ``args``, ``state``,
``model``), against raas and the embedded engine over HTTP. The real GRPOTrainer step is the
slow tier (tests/client/test_trl_grpo_trainer.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import torch

from raas.api.app import create_app
from raas.client import Group, RolloutResult, SyncRolloutClient
from raas.client.integrations.trl import WeightSync, make_rollout_func
from raas.client.sample_choices import NoGradient
from raas.llm.engine import create_engine_app
from raas.llm.models import load_model
from raas.settings import ServeSettings
from tests.support.llm_servers import ServerThread

KEY = "trl-test-key"


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, weights_dir: Path
) -> Iterator[tuple[str, str]]:
    app = create_engine_app("tiny", api_key=KEY, weight_dirs=[weights_dir])
    engine = ServerThread(app).start()
    db = tmp_path_factory.mktemp("trl") / "trl.db"
    service = ServerThread(create_app(ServeSettings(db=db, llm=[engine.url], tokenizer="tiny")))
    service.start()
    yield engine.url, service.url
    service.stop()
    engine.stop()


def trainer(step: int, model: torch.nn.Module, max_completion_length: int) -> SimpleNamespace:
    return SimpleNamespace(
        args=SimpleNamespace(max_completion_length=max_completion_length),
        state=SimpleNamespace(global_step=step),
        model=model,
    )


def test_rollout_func_caps_completions_and_pushes_weights_after_a_step(
    servers: tuple[str, str], weights_dir: Path
) -> None:
    engine_url, raas_url = servers
    model, _ = load_model("tiny")
    sync = WeightSync([engine_url], weights_dir / "sync", api_key=KEY)
    with SyncRolloutClient(raas_url) as client:
        func = make_rollout_func(
            raas_url,
            lambda p: {"data_source": "math", "problem": p, "answer": "4"},
            {"max_turns": 1, "temperature": 1.0},
            client=client,
            weights=sync,
        )
        prompts = ["What is 2 + 2?"] * 2 + ["What is 1 + 3?"] * 2
        out = func(prompts, trainer(0, model, max_completion_length=5))
        assert not (weights_dir / "sync").exists()  # step 0: the servers hold these weights
        before = httpx.get(f"{engine_url}/v1/engine/stats").json()["weight_version"]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        func(prompts, trainer(1, model, max_completion_length=5))
        after = httpx.get(f"{engine_url}/v1/engine/stats").json()["weight_version"]
        func(prompts, trainer(1, model, max_completion_length=5))  # same step: no push
        again = httpx.get(f"{engine_url}/v1/engine/stats").json()["weight_version"]
    assert len(out["completion_ids"]) == 4 and len(out["prompt_ids"]) == 4
    for ids, lps, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True):
        assert 0 < len(ids) <= 5 and len(ids) == len(lps) == len(mask)
    # The two groups are the two prompts, in order.
    assert out["prompt_ids"][0] == out["prompt_ids"][1] != out["prompt_ids"][2]
    assert (after, again) == (before + 1, before + 1)
    assert sorted(p.name for p in (weights_dir / "sync").iterdir()) == ["step-1"]


def test_a_server_that_refuses_the_weights_is_an_error(
    servers: tuple[str, str], tmp_path: Path
) -> None:
    _, raas_url = servers  # raas itself has no /update_weights: a 404
    sync = WeightSync([raas_url], tmp_path / "weights")
    model, _ = load_model("tiny")
    with pytest.raises(RuntimeError, match="did not load the weights of step 1"):
        sync.push_if_stepped(trainer(1, model, max_completion_length=5))


class TwoSegmentGroups:
    """Stands in for the client: every job ends done, reward 1.0, with two gateway segments."""

    def generate_groups(self, instances: list[Any], n: int, **kwargs: Any) -> list[Group]:
        first = {"prompt_ids": [1, 2], "response_ids": [10, 11], "loss_mask": [1, 0]}
        first["logprobs"] = [-0.5, 0.0]
        second = {"prompt_ids": [3], "response_ids": [20], "loss_mask": [1], "logprobs": [-1.0]}
        timing = {"queue_s": 0, "init_s": 0, "run_s": 1, "eval_s": 0, "total_s": 1}
        return [
            Group(
                task=instance,
                results=[
                    RolloutResult.model_validate(
                        {
                            "job_id": f"j{i}-{k}",
                            "state": "done",
                            "reward": 1.0,
                            "trajectory": first,
                            "metrics": {"segments": [first, second]},
                            "data_source": "harness",
                            "timing": timing,
                        }
                    )
                    for k in range(n)
                ],
            )
            for i, instance in enumerate(instances)
        ]


def test_a_job_of_several_segments_is_one_completion_as_trl_takes_them() -> None:
    """TRL pairs completions with prompts by position: "all" cannot add rows, so it says so;
    "first" and "last" send that segment, with the job's reward."""
    model, _ = load_model("tiny")
    client = cast(SyncRolloutClient, TwoSegmentGroups())
    prompts = ["q"] * 2

    def rollout(segments: Any) -> dict[str, list[Any]]:
        func = make_rollout_func(
            "http://raas.invalid", lambda p: {"problem": p}, client=client, segments=segments
        )
        return func(prompts, trainer(0, model, max_completion_length=8))

    with pytest.raises(ValueError, match=r"j0-0 has 2 gateway segments.*segments='first'"):
        rollout("all")
    last = rollout("last")
    assert last["prompt_ids"] == [[3], [3]] and last["completion_ids"] == [[20], [20]]
    assert last["env_mask"] == [[1], [1]] and last["logprobs"] == [[-1.0], [-1.0]]
    assert last["raas_reward"] == [1.0, 1.0] and last["raas_segment"] == [1, 1]
    first = rollout("first")
    assert first["completion_ids"] == [[10, 11]] * 2 and first["raas_segment"] == [0, 0]


class MixedGroups:
    """Stands in for the client: each group is a win, a long one (longer than TRL's cap), a
    failure (infrastructure) and a loss."""

    def generate_groups(self, instances: list[Any], n: int, **kwargs: Any) -> list[Group]:
        timing = {"queue_s": 0, "init_s": 0, "run_s": 1, "eval_s": 0, "total_s": 1}
        error = {"type": "sandbox", "message": "gone", "kind": "infra", "stage": "run"}
        jobs = [("done", 1.0, 2), ("done", 1.0, 6), ("failed", None, 2), ("done", 0.0, 2)]

        def job(k: int) -> RolloutResult:
            state, reward, length = jobs[k]
            return RolloutResult.model_validate(
                {
                    "job_id": f"j-{k}",
                    "state": state,
                    "reward": reward,
                    "error": None if state == "done" else error,
                    "trajectory": {
                        "prompt_ids": [1],
                        "response_ids": [10 + t for t in range(length)],
                        "loss_mask": [1] * length,
                        "logprobs": [-0.5] * length,
                    },
                    "data_source": "math",
                    "timing": timing,
                }
            )

        return [Group(task=instance, results=[job(k) for k in range(n)]) for instance in instances]


@pytest.mark.parametrize(
    ("options", "rewards", "masked"),
    [
        # Defaults: the failure's reward is None (TRL leaves it out of the group, advantage 0);
        # the cut one keeps its reward for the group and trains nothing.
        ({}, [1.0, 1.0, None, 0.0], [False, True, True, False]),
        ({"failed": "mask"}, [1.0, 1.0, None, 0.0], [False, True, True, False]),
        ({"failed": "drop_group"}, [None] * 4, [True] * 4),
        (
            {"truncated": "penalise", "truncated_reward": -1.0},
            [1.0, -1.0, None, 0.0],
            [False, False, True, False],
        ),
        ({"truncated": "keep"}, [1.0, 1.0, None, 0.0], [False, False, True, False]),
    ],
)
def test_a_failed_job_and_a_cut_completion_get_what_the_options_say(
    options: dict[str, Any], rewards: list[float | None], masked: list[bool]
) -> None:
    from raas.client.integrations.trl import raas_reward

    model, _ = load_model("tiny")
    client = cast(SyncRolloutClient, MixedGroups())
    func = make_rollout_func("http://raas.invalid", lambda p: {"q": p}, client=client, **options)
    out = func(["q"] * 4, trainer(0, model, max_completion_length=4))
    assert out["raas_reward"] == rewards
    assert raas_reward(out["completion_ids"], out["raas_reward"]) == rewards
    assert [not any(m) for m in out["env_mask"]] == masked
    assert out["raas_truncated"] == [False, True, False, False]
    assert [len(c) for c in out["completion_ids"]] == [2, 4, 2, 2]


class AllLong(MixedGroups):
    """Every completion longer than TRL's cap: a whole batch masked."""

    def generate_groups(self, instances: list[Any], n: int, **kwargs: Any) -> list[Group]:
        groups = super().generate_groups(instances, n, **kwargs)
        return [Group(task=g.task, results=[g.results[1]] * n) for g in groups]


def test_a_batch_that_carries_no_gradient_is_said_once_loudly() -> None:
    model, _ = load_model("tiny")
    client = cast(SyncRolloutClient, AllLong())
    func = make_rollout_func("http://raas.invalid", lambda p: {"q": p}, client=client)
    with pytest.warns(NoGradient, match=r"4 of 4 completions cut to max_completion_length=4"):
        out = func(["q"] * 4, trainer(0, model, max_completion_length=4))
    assert not any(any(m) for m in out["env_mask"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the next such batch says nothing more
        func(["q"] * 4, trainer(0, model, max_completion_length=4))
        # The control: a batch with a trainable completion says nothing either.
        fresh = make_rollout_func("http://raas.invalid", lambda p: {"q": p}, client=client)
        fresh(["q"] * 4, trainer(0, model, max_completion_length=8))


def test_unknown_choices_are_refused() -> None:
    with pytest.raises(ValueError, match="failed must be one of drop, mask, drop_group"):
        make_rollout_func("http://raas.invalid", dict, failed="zero")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="truncated_reward must be a finite number"):
        make_rollout_func("http://raas.invalid", dict, truncated_reward=float("inf"))
