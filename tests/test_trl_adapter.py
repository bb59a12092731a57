"""The TRL adapter without TRL: its rollout_func called the way GRPOTrainer calls it (prompts
repeated num_generations times, the trainer as second argument, read for ``args``, ``state``,
``model``), against raas and the embedded engine over HTTP. The real GRPOTrainer step is the
slow tier (tests/test_trl_grpo_trainer.py)."""

from __future__ import annotations

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
from raas.llm.engine import create_engine_app
from raas.llm.models import load_model
from raas.settings import ServeSettings
from tests.llm_servers import ServerThread

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
