"""The verl integration's parts that need no verl: rows to requests, results to verl samples,
verl's servers as raas backends. (verl's own AgentLoopWorker on raas: test_verl_agent_loop.py,
`make test-verl`.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from raas.api.app import create_app
from raas.client.integrations.verl_bridge import (
    RaasRolloutFailed,
    clear_raas_backends,
    job_id_for,
    plain,
    protocol_for,
    register_verl_servers,
    result_to_sample,
    result_to_samples,
    routing_paused,
    row_to_instance,
    sampling_params_for,
)
from raas.settings import ServeSettings
from raas.wire import RolloutRequest, RolloutResult
from tests.support.llm_servers import ServerThread

# A row as verl's AgentLoopWorker passes it: numpy values out of its non-tensor batch.
ROW: dict[str, Any] = {
    "data_source": "openai/gsm8k",
    "raw_prompt": np.array([{"role": "user", "content": "What is 2 + 2?"}], dtype=object),
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"split": "train", "index": np.int64(7)},
    "index": np.int64(7),
    "uid": "9b2e",
    "tools_kwargs": {},
}


def test_a_verl_row_becomes_a_raas_math_instance() -> None:
    instance = row_to_instance(ROW)
    assert instance == {
        "data_source": "openai/gsm8k",  # the server runs verl's names as its tasks
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 7},
        "instance_id": "openai/gsm8k-7",
    }
    assert type(instance["extra_info"]["index"]) is int  # JSON-able
    own = {"data_source": "countdown", "numbers": [3, 4], "target": 7}
    assert row_to_instance({**ROW, "raas_instance": own}) == own
    text = row_to_instance({"data_source": "math", "prompt": "1+1?"})
    assert text["prompt"] == [{"role": "user", "content": "1+1?"}] and "reward_model" not in text
    renamed = row_to_instance({**ROW, "data_source": "my/set"}, {"my/set": "math"})
    assert renamed["data_source"] == "math"
    with pytest.raises(ValueError, match="data_source"):
        row_to_instance({"raw_prompt": []})


def test_plain_turns_numpy_into_json() -> None:
    value = plain({"a": np.array([1, 2]), "b": (np.float32(0.5),), "c": np.bool_(True)})
    assert value == {"a": [1, 2], "b": [0.5], "c": True}


def test_verls_sampling_params_become_raas_ones() -> None:
    # What AgentLoopWorker.generate_sequences passes.
    verl = {
        "temperature": 1,
        "top_p": 0.9,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
    }
    params = sampling_params_for(verl, prompt_length=512, response_length=256, max_turns=4)
    assert params == {
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 256,
        "max_context_tokens": 768,
        "max_turns": 4,
    }
    over = sampling_params_for(
        verl, prompt_length=8, response_length=8, overrides={"max_tokens": 2}
    )
    assert over["max_tokens"] == 2
    # What the math task accepts: a request the server takes.
    from raas.tasks.math import MathTask
    from raas.tasks.protocol import TaskJob

    MathTask().validate(TaskJob(job_id="j", instance=row_to_instance(ROW), sampling_params=params))


def test_job_ids_are_fresh_and_valid() -> None:
    ids = {job_id_for(ROW) for _ in range(100)}
    assert len(ids) == 100
    for job_id in ids:
        assert job_id.startswith("verl-7-")
        RolloutRequest(instance={"data_source": "math"}, job_id=job_id)
    assert re.match(r"^verl-a-b-[0-9a-f]{12}$", job_id_for({"index": "a/b"}))


def result(
    state: str = "done", n: int = 6, reward: float | None = 1.0, **traj: Any
) -> RolloutResult:
    trajectory = {
        "prompt_ids": [1, 2, 3],
        "response_ids": list(range(10, 10 + n)),
        "loss_mask": [1, 1, 0, 0, 1, 1][:n],
        "logprobs": [-0.5, -0.5, 0.0, 0.0, -0.25, -0.25][:n],
        "messages": [
            {"role": "system", "content": ""},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "o"},
            {"role": "assistant", "content": "b"},
        ],
        "turns": [{"generate_s": 0.5, "tools_s": 0.25}, {"generate_s": 0.5, "tools_s": 0.0}],
        "stop_reason": "finish",
        **traj,
    }
    return RolloutResult.model_validate(
        {
            "job_id": "j",
            "state": state,
            "reward": reward,
            "trajectory": trajectory,
            "data_source": "math",
            "error": None
            if state == "done"
            else {"type": "backend", "message": "down", "kind": "infra", "stage": "run"},
            "timing": {"queue_s": 0, "init_s": 0.1, "run_s": 1, "eval_s": 0.2, "total_s": 1.3},
        }
    )


def test_a_result_becomes_a_verl_sample() -> None:
    s = result_to_sample(result(), prompt_length=8, response_length=8)
    assert (s.prompt_ids, s.response_ids) == ([1, 2, 3], [10, 11, 12, 13, 14, 15])
    assert s.response_mask == [1, 1, 0, 0, 1, 1]
    assert s.response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.25, -0.25]
    assert (s.reward, s.num_turns, s.truncated, s.failed) == (1.0, 4, False, False)
    assert (s.generate_s, s.tools_s, s.eval_s) == (1.0, 0.25, 0.2)
    assert s.raas["job_id"] == "j" and s.raas["timing"]["total_s"] == 1.3

    cut = result_to_sample(result(), prompt_length=2, response_length=3, truncated="keep")
    assert cut.prompt_ids == [2, 3]  # the last prompt_length tokens, as verl keeps them
    assert (cut.response_ids, cut.response_mask) == ([10, 11, 12], [1, 1, 0])
    assert cut.truncated and cut.raas["response_tokens"] == 6 and cut.reward == 1.0
    assert cut.raas["truncated_as"] == "keep"


def test_a_cut_response_gets_the_reward_truncated_says() -> None:
    masked = result_to_sample(result(), prompt_length=8, response_length=3)  # the default
    assert masked.truncated and masked.raas["truncated_as"] == "mask"
    assert (masked.response_mask, masked.reward) == ([0, 0, 0], 1.0)  # reward for the group
    penalised = result_to_sample(
        result(), prompt_length=8, response_length=3, truncated="penalise", truncated_reward=-1
    )
    assert (penalised.response_mask, penalised.reward) == ([1, 1, 0], -1.0)
    whole = result_to_sample(result(), prompt_length=8, response_length=6)
    assert not whole.truncated and whole.raas["truncated_as"] is None
    assert (whole.response_mask, whole.reward) == ([1, 1, 0, 0, 1, 1], 1.0)
    with pytest.raises(ValueError, match="truncated must be one of mask, penalise, keep"):
        result_to_samples(result(), prompt_length=8, response_length=3, truncated="cut")  # type: ignore[arg-type]


def test_a_failed_result_is_dropped_zeroed_or_raised() -> None:
    failed = result("failed", reward=None)
    assert result_to_samples(failed, prompt_length=8, response_length=8) == []  # "drop"
    (s,) = result_to_samples(failed, prompt_length=8, response_length=8, on_failure="zero")
    assert s.failed and s.reward == 0.0 and s.response_mask == [0] * 6
    assert s.response_ids == [10, 11, 12, 13, 14, 15]  # kept, for inspection
    with pytest.raises(RaasRolloutFailed, match="ended failed: backend"):
        result_to_samples(failed, prompt_length=8, response_length=8, on_failure="raise")
    with pytest.raises(ValueError, match="on_failure must be one of drop, zero, raise"):
        result_to_samples(failed, prompt_length=8, response_length=8, on_failure="mask")  # type: ignore[arg-type]
    # Failed before any token: verl still needs a prompt and a response.
    empty = result("failed", n=0, reward=None, prompt_ids=[], messages=[], turns=[])
    e = result_to_sample(
        empty, prompt_length=8, response_length=8, fallback_prompt_ids=[5, 6], pad_token_id=2
    )
    assert (e.prompt_ids, e.response_ids, e.response_mask, e.response_logprobs) == (
        [5, 6],
        [2],
        [0],
        [0.0],
    )
    assert e.num_turns == 0


def test_misaligned_results_are_refused() -> None:
    bad = result()
    bad.trajectory.logprobs.pop()
    with pytest.raises(ValueError, match="differ in length"):
        result_to_sample(bad, prompt_length=8, response_length=8)


@pytest.fixture
def service_url(tmp_path: Path) -> Iterator[str]:
    server = ServerThread(create_app(ServeSettings(db=tmp_path / "b.db", tokenizer="tiny"))).start()
    yield server.url
    server.stop()


def backends(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{url}/v1/backends").json()
    return found


def test_verls_servers_register_as_backends_and_stay_registered_around_a_sync(
    service_url: str,
) -> None:
    addresses = ["127.0.0.1:18001", "[::1]:18002"]  # as verl's LLMServerManager.get_addresses()
    out = register_verl_servers(
        service_url, addresses, protocol=protocol_for("sglang"), capacity=4, locality=False
    )
    assert [b["url"] for b in out] == ["http://127.0.0.1:18001", "http://[::1]:18002"]
    assert [(b["protocol"], b["capacity"]) for b in backends(service_url)] == [("sglang", 4)] * 2
    again = register_verl_servers(service_url, addresses[:1], protocol="sglang")
    assert again[0]["id"] == out[0]["id"] and len(backends(service_url)) == 2

    seen: list[int] = []
    # Paused, not cleared: the rollouts in flight keep their backends (nothing listens on
    # these addresses, so the pool drains them instead of pausing them through a route).
    with routing_paused(service_url, addresses[1:], protocol="vllm"):
        seen.append(len(backends(service_url)))
    assert seen == [2]
    assert len(backends(service_url)) == 2
    clear_raas_backends([service_url])
    assert backends(service_url) == []
    with pytest.raises(ValueError, match="trtllm"):
        protocol_for("trtllm")
    with pytest.raises(RuntimeError, match="422"):
        register_verl_servers(service_url, ["http://bad host:1"])


def test_each_raas_server_gets_the_verl_servers_on_its_host_first() -> None:
    from raas.client.integrations.verl_bridge import local_first

    here, there = ["localhost:9001", "127.0.0.1:9002"], ["10.255.0.9:9003"]
    assert local_first("http://127.0.0.1:8000", here + there) == here
    assert local_first("http://127.0.0.1:8000", there) == there  # none local: all of them


def test_each_segment_of_a_gateway_job_becomes_a_verl_sample_with_the_job_s_reward() -> None:
    second = {
        "prompt_ids": [7],
        "response_ids": [30, 31],
        "loss_mask": [1, 1],
        "logprobs": [-1, -2],
    }
    job = result()
    job.metrics["segments"] = [job.trajectory.model_dump(), second]
    samples = result_to_samples(job, prompt_length=8, response_length=8)
    assert [s.raas["segment"] for s in samples] == [0, 1]
    assert samples[0].response_ids == [10, 11, 12, 13, 14, 15]
    s = samples[1]
    assert (s.prompt_ids, s.response_ids, s.response_mask) == ([7], [30, 31], [1, 1])
    assert s.response_logprobs == [-1.0, -2.0] and s.reward == 1.0
    kept = result_to_samples(job, segments="last", prompt_length=8, response_length=8)
    assert [(k.raas["segment"], k.response_ids) for k in kept] == [(1, [30, 31])]
    assert len(result_to_samples(job, segments="first", prompt_length=8, response_length=8)) == 1
    assert len(result_to_samples(result(), prompt_length=8, response_length=8)) == 1
    # One segment cut: the job is truncated, and each of its samples gets what that says.
    cut = result_to_samples(job, prompt_length=8, response_length=4, truncated="penalise")
    assert [(c.truncated, c.reward) for c in cut] == [(True, 0.0), (False, 0.0)]
    with pytest.raises(ValueError, match="segments must be one of"):
        result_to_samples(job, segments="some", prompt_length=8, response_length=8)  # type: ignore[arg-type]
