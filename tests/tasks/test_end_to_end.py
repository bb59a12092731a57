"""One rollout per task, end to end: the service over HTTP, the tiny random model behind the
embedded engine over HTTP, real sandboxes. The model is random: the point is that every stage
runs for real and the result is whole and honest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from raas.api.app import create_app
from raas.llm.engine import create_engine_app
from raas.settings import ServeSettings
from raas.tasks.datasets import humaneval
from tests.support.llm_servers import ServerThread
from tests.tasks.test_tasks import SWE

INSTANCES = {
    "code": humaneval()[2],
    "swe": SWE,
    "math": {"data_source": "math", "problem": "What is 2 + 2?", "answer": "4"},
    "stem": {"data_source": "stem", "question": "g on Earth in m/s^2?", "answer": 9.81},
}


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    server = ServerThread(create_engine_app("tiny")).start()
    yield server.url
    server.stop()


@pytest.fixture
def service_url(engine_url: str, tmp_path: Path) -> Iterator[str]:
    settings = ServeSettings(db=tmp_path / "e2e.db", llm=[engine_url], tokenizer="tiny")
    server = ServerThread(create_app(settings)).start()
    yield server.url
    server.stop()


@pytest.mark.parametrize("task", sorted(INSTANCES))
def test_one_rollout_per_task_with_the_tiny_model(service_url: str, task: str) -> None:
    body = {
        "instance": INSTANCES[task],
        "sampling_params": {"temperature": 1.0, "max_tokens": 24, "max_turns": 2, "seed": 3},
        "job_id": f"e2e-{task}",
    }
    r = httpx.post(f"{service_url}/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    got = httpx.get(f"{service_url}/v1/rollouts/e2e-{task}", params={"wait": 120}, timeout=130)
    result = got.json()["result"]
    assert result is not None and result["state"] == "done", result
    assert result["reward"] in (0.0, 1.0)
    traj = result["trajectory"]
    assert traj["prompt_ids"] and traj["response_ids"]
    assert len(traj["response_ids"]) == len(traj["loss_mask"]) == len(traj["logprobs"])
    assert sum(traj["loss_mask"]) == sum(t["output_tokens"] for t in traj["turns"])
    assert traj["turns"][0]["backend"].startswith("http://127.0.0.1:")
    assert "artifact" in result["metrics"]


def test_raas_run_against_a_service_then_replay(service_url: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from raas.cli import main

    out = tmp_path / "results.jsonl"
    params = '{"max_tokens": 16, "max_turns": 1, "temperature": 1.0}'
    args = [
        "run",
        "--bundled",
        "math",
        "--limit",
        "2",
        "--url",
        service_url,
        "--sampling-params",
        params,
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "2 rollouts" in result.output and "mean reward" in result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    # Replay: the stored artifacts re-scored without the model. Swap in the right answer for
    # the first one to see the judge, not the stored reward, decide.
    stored = [json.loads(x) for x in lines]
    from raas.tasks.datasets import bundled

    truth = {t["instance_id"]: t["answer"] for t in bundled("math")[:2]}
    stored[0]["metrics"]["artifact"] = {"answer": truth[stored[0]["instance_id"]]}
    stored[1]["metrics"]["artifact"] = {"answer": "not a number"}
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(s) + "\n" for s in stored))
    replay = CliRunner().invoke(main, ["run", "--bundled", "math", "--replay", str(edited)])
    assert replay.exit_code == 0, replay.output
    assert f"{stored[0]['instance_id']}: stored reward" in replay.output
    assert "re-scored 1.0" in replay.output and "re-scored 0.0" in replay.output


def test_the_trl_rollout_func_contract(service_url: str) -> None:
    from types import SimpleNamespace

    from raas.client.integrations.trl import make_rollout_func, raas_reward

    rollout_func = make_rollout_func(
        service_url,
        to_instance=lambda p: {"data_source": "math", "problem": p, "answer": "4"},
        sampling_params={"max_tokens": 8, "max_turns": 1, "seed": 1},
    )
    prompts = ["What is 2 + 2?"] * 3 + ["What is 1 + 3?"] * 3  # TRL repeats each prompt
    out = rollout_func(prompts, SimpleNamespace(num_generations=3))
    assert {"prompt_ids", "completion_ids", "logprobs"} <= set(out)
    assert all(len(out[k]) == 6 for k in out)
    for ids, lps, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True):
        assert 0 < len(ids) == len(lps) == len(mask)
    assert out["prompt_ids"][0] == out["prompt_ids"][2] != out["prompt_ids"][3]
    assert raas_reward(completions=[None] * 6, raas_reward=out["raas_reward"]) == [
        float(r) for r in out["raas_reward"]
    ]
