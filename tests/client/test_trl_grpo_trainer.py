"""TRL's GRPOTrainer takes a real training step on rollouts from raas (slow tier: `make
test-trl`, which installs TRL)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raas.api.app import create_app
from raas.client.integrations.trl import make_rollout_func
from raas.client.integrations.trl import raas_reward as reward_from_raas
from raas.llm.engine import create_engine_app
from raas.llm.models import load_model
from raas.settings import ServeSettings
from tests.support.llm_servers import ServerThread
from tests.support.tiers import require

pytestmark = pytest.mark.slow


def test_grpo_trainer_steps_on_raas_rollouts(tmp_path: Path) -> None:
    trl = require("trl", "slow", "make test-trl")
    datasets = require("datasets", "slow", "make test-trl")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    engine = ServerThread(create_engine_app("tiny")).start()
    service = ServerThread(
        create_app(ServeSettings(db=tmp_path / "trl.db", llm=[engine.url], tokenizer="tiny"))
    ).start()
    seen: list[list[float]] = []

    def reward(completions: list[object], raas_reward: list[float], **kw: object) -> list[float]:
        seen.append(list(raas_reward))
        return reward_from_raas(completions, raas_reward)

    try:
        model, tokenizer = load_model("tiny")
        data = datasets.Dataset.from_list([{"prompt": "What is 2 + 2?"}] * 4)
        args = trl.GRPOConfig(
            output_dir=str(tmp_path / "out"),
            num_generations=2,
            per_device_train_batch_size=2,
            max_steps=1,
            max_completion_length=16,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
        )
        instance = {"data_source": "math", "answer": "4"}
        trainer = trl.GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            rollout_func=make_rollout_func(
                service.url, lambda p: {**instance, "problem": p}, {"max_tokens": 8, "max_turns": 1}
            ),
        )
        trainer.train()
    finally:
        service.stop()
        engine.stop()
    assert trainer.state.global_step == 1
    assert seen and len(seen[0]) == 2 and set(seen[0]) <= {0.0, 1.0}
    assert reward_from_raas([None], [1]) == [1.0]
