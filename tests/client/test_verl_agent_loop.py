"""verl's own AgentLoopWorker runs raas's agent loop (`make test-verl`, in a venv with verl).

Everything verl-side is verl's real code, built the way its trainer builds it: the trainer
config composed by hydra from verl's ppo_trainer.yaml, the rows read by verl's RLHFDataset and
collated by its collate_fn, uids and `rollout.n` repeats as RayPPOTrainer.fit makes them, and
`AgentLoopWorker.generate_sequences` (what verl's AgentLoopManager calls on each Ray worker),
which finds `raas_agent` through `agent_loop_config_path`, instantiates it with hydra per sample,
and pads and stacks the outputs into the DataProto the trainer trains on. The raas side is a
real service over HTTP with the tiny random model behind the embedded engine, or a scripted
model that calls tools.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import httpx
import pytest

from tests.support.tiers import require

verl = require("verl", "verl", "make test-verl")

import numpy as np  # noqa: E402  (after the skip: verl brings them)
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402

from raas.api.app import create_app  # noqa: E402
from raas.client.integrations.verl import close_clients  # noqa: E402
from raas.client.integrations.verl_bridge import row_to_instance  # noqa: E402
from raas.llm.engine import create_engine_app  # noqa: E402
from raas.llm.models import TINY_DIR, cache_dir, load_tokenizer  # noqa: E402
from raas.settings import ServeSettings  # noqa: E402
from tests.support.llm_servers import AgentBackend, ServerThread  # noqa: E402
from tests.support.policies import call  # noqa: E402

pytestmark = pytest.mark.verl

OBSERVATION = "[thought recorded]"
Jobs = TypeVar("Jobs")
QUESTIONS = [("What is 2 + 2?", "4"), ("What is 3 * 5?", "15")]


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    server = ServerThread(create_engine_app("tiny")).start()  # also caches the tiny model dir
    yield server.url
    server.stop()


def serve(tmp_path: Path, llm: list[str], name: str) -> ServerThread:
    settings = ServeSettings(db=tmp_path / f"{name}.db", llm=llm, tokenizer="tiny")
    return ServerThread(create_app(settings)).start()


@pytest.fixture
def service_url(engine_url: str, tmp_path: Path) -> Iterator[str]:
    server = serve(tmp_path, [engine_url], "tiny")
    yield server.url
    server.stop()


def verl_config(
    tmp_path: Path, raas_url: str, response_length: int, *more: str, **entry: Any
) -> Any:
    """verl's trainer config, as `python -m verl.trainer.main_ppo` composes it, with raas's
    agent loop registered from a config file and selected as the default."""
    entry = {
        "name": "raas_agent",
        "_target_": "raas.client.integrations.verl.RaasAgentLoop",
        "url": raas_url,
        **entry,
    }
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text(yaml.safe_dump([entry]))
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={cache_dir() / TINY_DIR}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.n=2",
                "data.max_prompt_length=1024",
                f"data.max_response_length={response_length}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=raas_agent",
                *more,
            ],
        )


def gen_batch(config: Any, tmp_path: Path, tokenizer: Any) -> DataProto:
    """The batch the trainer hands to the agent loop manager, made as RayPPOTrainer.fit makes it."""
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": q}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"split": "train", "index": i},
        }
        for i, (q, a) in enumerate(QUESTIONS)
    ]
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([f"uid-{i}" for i in range(len(batch))], dtype=object)
    # RayPPOTrainer._get_gen_batch: the reward keys stay in the generation batch.
    batch.meta_info["global_steps"] = 1
    return batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n, interleave=True)


def generate(config: Any, batch: DataProto, balancer: Any = None) -> DataProto:
    """What AgentLoopManager does on one Ray worker (here in this process)."""

    async def go() -> DataProto:
        worker = AgentLoopWorker(config, LLMServerClient(config, balancer))
        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_clients()

    return asyncio.run(go())


def raas_result(raas_url: str, job_id: str) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(f"{raas_url}/v1/rollouts/{job_id}").json()["result"]
    return result


def check_against_raas(out: DataProto, raas_url: str) -> list[dict[str, Any]]:
    """Every row of verl's batch is exactly raas's rollout: the prompt left-padded, the response
    (cut to response_length) right-padded, the mask raas's loss mask, the logprobs raas's, the
    reward at the last response token."""
    b = out.batch
    size, prompt_len = b["prompts"].shape
    response_len = b["responses"].shape[1]
    assert b["response_mask"].shape == b["rollout_log_probs"].shape == (size, response_len)
    assert b["input_ids"].shape == b["attention_mask"].shape == (size, prompt_len + response_len)
    assert b["rm_scores"].shape == (size, response_len)
    results = []
    for i in range(size):
        info = out.non_tensor_batch["raas"][i]
        result = raas_result(raas_url, info["job_id"])
        results.append(result)
        traj = result["trajectory"]
        p = len(traj["prompt_ids"])
        assert b["prompts"][i, prompt_len - p :].tolist() == traj["prompt_ids"]
        assert b["attention_mask"][i, : prompt_len - p].sum() == 0
        n = min(len(traj["response_ids"]), response_len)
        assert n > 0 and info["truncated"] == (len(traj["response_ids"]) > response_len)
        assert b["responses"][i, :n].tolist() == traj["response_ids"][:n]
        assert b["attention_mask"][i, prompt_len:].sum() == n
        assert b["response_mask"][i, :n].tolist() == traj["loss_mask"][:n]
        assert b["response_mask"][i, n:].sum() == 0
        assert b["rollout_log_probs"][i, :n].tolist() == pytest.approx(traj["logprobs"][:n])
        assert b["rm_scores"][i, n - 1] == pytest.approx(result["reward"])
        assert b["rm_scores"][i].sum() == pytest.approx(result["reward"])
        turns = [m for m in traj["messages"] if m["role"] != "system"]
        assert out.non_tensor_batch["__num_turns__"][i] == len(turns)
    return results


def test_verl_agent_loop_worker_runs_rollouts_on_raas(service_url: str, tmp_path: Path) -> None:
    config = verl_config(tmp_path, service_url, 16, sampling_params={"max_turns": 1})
    tokenizer = load_tokenizer("tiny")
    batch = gen_batch(config, tmp_path, tokenizer)
    assert len(batch) == 4 and list(batch.non_tensor_batch["uid"]) == ["uid-0"] * 2 + ["uid-1"] * 2
    out = generate(config, batch)

    assert out.batch["prompts"].shape == (4, 1024)
    assert out.batch["responses"].shape == (4, 16)
    results = check_against_raas(out, service_url)
    assert all(r["state"] == "done" and r["task"] == "math" for r in results)
    assert {r["data_source"] for r in results} == {"openai/gsm8k"}  # the row's own name
    assert [r["instance_id"] for r in results] == ["openai/gsm8k-0"] * 2 + ["openai/gsm8k-1"] * 2
    assert len({r["job_id"] for r in results}) == 4  # each repeat is its own rollout
    assert all(isinstance(r["reward"], float) for r in results)
    # The same question renders the same prompt; the sampled answers differ.
    assert results[0]["trajectory"]["prompt_ids"] == results[1]["trajectory"]["prompt_ids"]
    # verl's metrics: the stage timings raas measured.
    metrics = out.meta_info["metrics"]
    assert len(metrics) == 4 and all(m["generate_sequences"] > 0 for m in metrics)
    assert out.non_tensor_batch["raas"][0]["timing"]["total_s"] > 0
    assert out.meta_info["reward_extra_keys"] == ["raas_failed", "raas_truncated"]
    assert out.non_tensor_batch["raas_failed"].tolist() == [0.0] * 4


def acting_model() -> AgentBackend:
    """A model that thinks once (a tool call: its observation is inserted), then finishes."""

    def script(prompt: str) -> str:
        if OBSERVATION not in prompt:  # the think tool has not answered yet
            return call("think", thought="two and two make four")
        answer = "4" if "2 + 2" in prompt else "15"
        return call("finish", answer=answer)

    return AgentBackend(script)


# 48: each turn fits (a turn may generate up to response_length tokens, and the model, like a
# real server, stops there), the whole rollout does not, so verl's copy is cut.
@pytest.mark.parametrize("response_length", [256, 48])
def test_tool_observations_are_masked_and_rewards_come_from_raas(
    tmp_path: Path, response_length: int
) -> None:
    model = ServerThread(acting_model().app).start()
    service = serve(tmp_path, [model.url], "acting")
    try:
        # keep: verl's copy of a cut rollout as it is (what truncated's choices do with it:
        # test_verls_v1_worker_trains_a_group_with_a_failed_and_a_truncated_job_as_told).
        config = verl_config(tmp_path, service.url, response_length, truncated="keep")
        out = generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")))
        results = check_against_raas(out, service.url)
    finally:
        service.stop()
        model.stop()
    tok = load_tokenizer("tiny")
    for i, result in enumerate(results):
        traj = result["trajectory"]
        assert result["state"] == "done" and traj["stop_reason"] == "finish"
        assert [t["tool_calls"][0]["name"] for t in traj["turns"]] == ["think", "finish"]
        mask = traj["loss_mask"]
        first = traj["turns"][0]["output_tokens"]
        inserted = mask.index(1, first) - first  # the observation between the two turns
        assert mask[:first] == [1] * first and inserted > 0
        assert mask[first : first + inserted] == [0] * inserted
        assert all(lp == 0.0 for lp in traj["logprobs"][first : first + inserted])
        observation = tok.decode(traj["response_ids"][first : first + inserted])
        assert OBSERVATION in observation  # the think tool's answer, inserted by raas
        assert result["reward"] == 1.0  # the right answer, judged by raas on the whole rollout
        truncated = response_length < len(traj["response_ids"])
        assert out.non_tensor_batch["raas"][i]["truncated"] == truncated == (response_length == 48)
        assert out.non_tensor_batch["raas_truncated"][i] == float(truncated)
    assert out.batch["rm_scores"].sum() == pytest.approx(4.0)


def custom_instance(row: dict[str, Any]) -> dict[str, Any]:
    """An `instance_fn`: the row as the user wants it sent."""
    return {**row_to_instance(row), "instance_id": f"mine-{row['index']}"}


def test_a_failed_rollout_adds_nothing_to_the_loss(tmp_path: Path) -> None:
    service = serve(tmp_path, [], "nobackend")  # no inference server: every job fails
    try:
        fn = f"{__name__}:custom_instance"
        # zero: the legacy worker's way to go on past a failure (drop is V1's: see below).
        config = verl_config(tmp_path, service.url, 32, instance_fn=fn, on_failure="zero")
        out = generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")))
        results = [raas_result(service.url, x["job_id"]) for x in out.non_tensor_batch["raas"]]
    finally:
        service.stop()
    assert [r["state"] for r in results] == ["failed"] * 4
    assert [r["instance_id"] for r in results] == ["mine-0"] * 2 + ["mine-1"] * 2
    assert out.batch["response_mask"].sum() == 0 and out.batch["rm_scores"].sum() == 0
    assert out.non_tensor_batch["raas_failed"].tolist() == [1.0] * 4
    # raas rendered the prompt before the first generation failed: verl still gets it.
    assert (out.batch["attention_mask"][:, :1024].sum(dim=1) > 0).all()
    assert json.dumps(out.non_tensor_batch["raas"][0]["error"])  # the reason travels along


def test_the_agent_loop_registers_verls_own_servers_with_raas(
    engine_url: str, tmp_path: Path
) -> None:
    """register_servers: raas starts with no backend; the agent loop asks verl's load balancer
    (a real Ray actor, as LLMServerManager makes it) for verl's server addresses and registers
    them, then its rollouts run on them."""
    ray = require("ray", "verl", "make test-verl")
    from verl.workers.rollout.router import get_router_handle

    service = serve(tmp_path, [], "register")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        address = engine_url.removeprefix("http://")  # verl's form: host:port
        balancer = get_router_handle(servers={address: None})
        # The setting from the trainer config's own `raas` section, as a command line gives it.
        config = verl_config(
            tmp_path,
            service.url,
            8,
            "+raas.register_servers=true",
            sampling_params={"max_turns": 1},
        )
        out = generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")), balancer)
        backends = httpx.get(f"{service.url}/v1/backends").json()
        states = [
            raas_result(service.url, x["job_id"])["state"] for x in out.non_tensor_batch["raas"]
        ]
    finally:
        ray.shutdown()
        service.stop()
    assert [(b["url"], b["protocol"], b["capacity"]) for b in backends] == [
        (engine_url, "vllm", 256)  # rollout.name and rollout.max_num_seqs
    ]
    assert states == ["done"] * 4


async def test_a_load_balancer_that_never_answers_fails_the_registration_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """register_servers asks verl's load balancer, a Ray actor: one alive but stuck must not
    hold the worker's rollouts for ever."""
    from raas.client.integrations import verl as integration

    class Stuck:
        def remote(self) -> asyncio.Future[list[str]]:
            return asyncio.get_running_loop().create_future()  # never resolved

    loop = SimpleNamespace(
        server_manager=SimpleNamespace(_load_balancer=SimpleNamespace(get_all_servers=Stuck())),
        urls=("http://127.0.0.1:1",),
    )
    monkeypatch.setattr(integration, "REGISTER_ASK_S", 0.05)
    with pytest.raises(RuntimeError, match="did not list its rollout servers within 0 s"):
        await integration.RaasAgentLoop.register_backends(loop)  # type: ignore[arg-type]


# -- a gateway job of several segments -------------------------------------------------------


def segment(prompt: list[int], response: list[int], mask: list[int], logprobs: list[float]) -> Any:
    return {"prompt_ids": prompt, "response_ids": response, "loss_mask": mask, "logprobs": logprobs}


SEGMENTS = [
    segment([1, 2, 3], [10, 11, 12], [1, 0, 1], [-0.5, 0.0, -0.25]),
    segment([4, 5], [20, 21], [1, 1], [-1.0, -2.0]),
]


class TwoSegmentJobs:
    """Stands in for the raas client: every job ends done, reward 1.0, with two gateway
    segments (an agent that compacted its context), as the harness task writes them."""

    def __init__(self) -> None:
        self.job_ids: list[str] = []

    async def submit(self, request: Any) -> str:
        self.job_ids.append(request.job_id)
        return str(request.job_id)

    async def wait(self, job_id: str, poll_s: float = 30.0) -> Any:
        from raas.wire import RolloutResult

        segments = [{**s, "messages": [{"role": "user", "content": "q"}]} for s in SEGMENTS]
        return RolloutResult.model_validate(
            {
                "job_id": job_id,
                "state": "done",
                "reward": 1.0,
                "trajectory": {**segments[0], "stop_reason": "agent_exit_0"},
                "metrics": {"gateway_segments": 2, "segments": segments},
                "data_source": "harness",
                "timing": {"queue_s": 0, "init_s": 0, "run_s": 1, "eval_s": 0, "total_s": 1},
            }
        )


def stand_in(monkeypatch: pytest.MonkeyPatch, jobs: Jobs) -> Jobs:
    """``jobs`` as the raas client of every agent loop verl makes."""
    import raas.client.integrations.verl as loop

    monkeypatch.setattr(loop, "_client", lambda urls, api_key: jobs)
    return jobs


@pytest.fixture
def two_segment_jobs(monkeypatch: pytest.MonkeyPatch) -> TwoSegmentJobs:
    return stand_in(monkeypatch, TwoSegmentJobs())


def v1_worker_class(monkeypatch: pytest.MonkeyPatch, stored: list[dict[str, Any]]) -> Any:
    """verl's V1 AgentLoopWorkerTQ (the Ray actor's own class), with a transfer queue that
    records what the worker puts in it (the transfer_queue package is not installed here)."""
    import sys
    import types

    fake = types.ModuleType("transfer_queue")

    def stub(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})  # names verl's V1 modules import and this test never uses

    async def kv_put(**kwargs: Any) -> None:
        pass

    async def kv_batch_put(**kwargs: Any) -> None:
        stored.append(kwargs)

    fake.__getattr__ = stub  # type: ignore[method-assign]
    fake.init = lambda *a, **k: None  # type: ignore[attr-defined]
    fake.async_kv_put = kv_put  # type: ignore[attr-defined]
    fake.async_kv_batch_put = kv_batch_put  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    from verl.trainer.ppo.v1 import agent_loop_tq

    monkeypatch.setattr(agent_loop_tq, "tq", fake)
    return agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class


def test_every_segment_of_a_gateway_job_is_a_sample_of_its_group_in_verls_v1_worker(
    two_segment_jobs: TwoSegmentJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's V1 worker runs rollout.n sessions of a prompt and puts every output of each
    into the transfer queue the trainer reads: a job of two segments is two samples under the
    prompt's uid, each its segment's tokens, mask and logprobs, each with the job's reward."""
    stored: list[dict[str, Any]] = []
    worker_class = v1_worker_class(monkeypatch, stored)
    config = verl_config(tmp_path, "http://raas.invalid", 16)
    batch = gen_batch(config, tmp_path, load_tokenizer("tiny"))
    row = {k: v[0] for k, v in batch.non_tensor_batch.items()}  # uid-0's prompt, once
    row |= {"agent_name": "raas_agent", "global_steps": 1}
    trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}

    async def go() -> None:
        worker = worker_class(config, LLMServerClient(config, None))
        await worker._run_prompt(dict(row), {"temperature": 1.0}, trajectory)

    asyncio.run(go())
    assert len(two_segment_jobs.job_ids) == 2  # rollout.n sessions, one raas job each
    keys = [k for put in stored for k in put["keys"]]
    assert sorted(keys) == ["uid-0_0_0", "uid-0_0_1", "uid-0_1_0", "uid-0_1_1"]
    for put in stored:
        fields = put["fields"]
        for i, segment in enumerate(SEGMENTS):
            assert fields["prompts"][i].tolist() == segment["prompt_ids"]
            assert fields["responses"][i].tolist() == segment["response_ids"]
            assert fields["response_mask"][i].tolist() == segment["loss_mask"]
            assert fields["rollout_log_probs"][i].tolist() == segment["logprobs"]
            assert fields["rm_scores"][i].tolist()[-1] == 1.0  # the job's reward, on each
            assert fields["uid"][i] == "uid-0"  # the prompt's GRPO group
            assert fields["extra_fields"][i]["raas"]["segment"] == i


def test_verls_legacy_worker_says_a_job_of_several_segments_needs_v1_or_one_segment(
    two_segment_jobs: TwoSegmentJobs, tmp_path: Path
) -> None:
    config = verl_config(tmp_path, "http://raas.invalid", 16)
    batch = gen_batch(config, tmp_path, load_tokenizer("tiny"))
    with pytest.raises(ValueError, match=r"2 gateway segments.*trainer\.use_v1=true"):
        generate(config, batch)
    for which, segment in (("first", 0), ("last", 1)):
        config = verl_config(tmp_path, "http://raas.invalid", 16, segments=which)
        out = generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")))
        expected = SEGMENTS[segment]
        n = len(expected["response_ids"])
        assert out.batch["responses"][:, :n].tolist() == [expected["response_ids"]] * 4
        assert out.batch["response_mask"][:, :n].tolist() == [expected["loss_mask"]] * 4
        assert [x["segment"] for x in out.non_tensor_batch["raas"]] == [segment] * 4


# -- honest samples: a failed job and a truncated response in a GRPO group -------------------

RESPONSE_LENGTH = 16
# Each prompt's n=4 jobs, in the order they are submitted: (state, reward, response tokens).
OUTCOMES = {
    "win": ("done", 1.0, 3),
    "long": ("done", 1.0, RESPONSE_LENGTH + 4),  # verl sees it cut
    "fail": ("failed", None, 2),
    "lose": ("done", 0.0, 3),
}


class MixedJobs:
    """Stands in for the raas client: the k-th job of each prompt ends as OUTCOMES' k-th says;
    ``outcome`` maps each job id to its outcome's name."""

    def __init__(self) -> None:
        self.outcome: dict[str, str] = {}
        self.submitted: dict[str, int] = {}

    async def submit(self, request: Any) -> str:
        instance = request.instance["instance_id"]
        k = self.submitted.get(instance, 0)
        self.submitted[instance] = k + 1
        self.outcome[request.job_id] = list(OUTCOMES)[k % len(OUTCOMES)]
        return str(request.job_id)

    async def wait(self, job_id: str, poll_s: float = 30.0) -> Any:
        from raas.wire import RolloutResult

        state, reward, n = OUTCOMES[self.outcome[job_id]]
        error = {"type": "sandbox", "message": "gone", "kind": "infra", "stage": "run"}
        return RolloutResult.model_validate(
            {
                "job_id": job_id,
                "state": state,
                "reward": reward,
                "error": error if state != "done" else None,
                "trajectory": {
                    "prompt_ids": [1, 2, 3],
                    "response_ids": [100 + t for t in range(n)],
                    "loss_mask": [1] * n,
                    "logprobs": [-0.5] * n,
                    "messages": [{"role": "user", "content": "q"}],
                },
                "data_source": "openai/gsm8k",
                "timing": {"queue_s": 0, "init_s": 0, "run_s": 1, "eval_s": 0, "total_s": 1},
            }
        )


@pytest.fixture
def mixed_jobs(monkeypatch: pytest.MonkeyPatch) -> MixedJobs:
    return stand_in(monkeypatch, MixedJobs())


def advantage_of(advantages: Any, mask: Any) -> float:
    """A row's advantage as verl trains on it: on its first masked-in token (0 with none)."""
    where = mask.nonzero()
    return float(advantages[where[0][0]]) if len(where) else 0.0


def grpo(rewards: dict[str, float]) -> dict[str, float]:
    """GRPO's advantages over a group, by hand: (r - mean) / (sample std + 1e-6)."""
    values = list(rewards.values())
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return {name: (r - mean) / (std + 1e-6) for name, r in rewards.items()}


R3 = 3**0.5
# (on_failure, truncated, truncated_reward) -> the advantage verl trains each job on.
V1_CASES = {
    # Defaults: the failed job is out of the group; the cut one's reward 1.0 is in it, untrained.
    ("drop", "mask", 0.0): {**grpo({"win": 1.0, "long": 1.0, "lose": 0.0}), "long": 0.0},
    ("drop", "penalise", -1.0): grpo({"win": 1.0, "long": -1.0, "lose": 0.0}),
    ("drop", "keep", 0.0): grpo({"win": 1.0, "long": 1.0, "lose": 0.0}),
    # zero: the failure's 0.0 is in the group's mean and std (biased), but it is not trained.
    ("zero", "mask", 0.0): {
        **grpo({"win": 1.0, "long": 1.0, "fail": 0.0, "lose": 0.0}),
        "long": 0.0,
        "fail": 0.0,
    },
}


@pytest.mark.parametrize("choice", list(V1_CASES), ids=lambda c: "-".join(map(str, c)))
def test_verls_v1_worker_trains_a_group_with_a_failed_and_a_truncated_job_as_told(
    mixed_jobs: MixedJobs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    choice: tuple[str, str, float],
) -> None:
    """verl's V1 worker runs a prompt's 4 sessions (win, long: cut by verl, fail, lose) and
    stores their outputs; verl's own GRPO over what it stored gives the advantages the
    options say (by hand above)."""
    import torch
    from tensordict import TensorDict
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    on_failure, truncated, truncated_reward = choice
    stored: list[dict[str, Any]] = []
    worker_class = v1_worker_class(monkeypatch, stored)
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    config = verl_config(
        tmp_path,
        "http://raas.invalid",
        RESPONSE_LENGTH,
        "actor_rollout_ref.rollout.n=4",
        on_failure=on_failure,
        truncated=truncated,
        truncated_reward=truncated_reward,
    )
    batch = gen_batch(config, tmp_path, load_tokenizer("tiny"))
    row = {k: v[0] for k, v in batch.non_tensor_batch.items()}  # uid-0's prompt, once
    row |= {"agent_name": "raas_agent", "global_steps": 1}
    trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}

    async def go() -> None:
        worker = worker_class(config, LLMServerClient(config, None))
        await worker._run_prompt(dict(row), {"temperature": 1.0}, trajectory)

    asyncio.run(go())
    keys, names, rewards, masks = [], [], [], []
    for put in stored:
        fields = put["fields"]
        for i, key in enumerate(put["keys"]):
            keys.append(key)
            names.append(mixed_jobs.outcome[fields["extra_fields"][i]["raas"]["job_id"]])
            rewards.append(fields["rm_scores"][i])
            masks.append(fields["response_mask"][i])
    expected = V1_CASES[choice]
    assert sorted(names) == sorted(expected)  # a dropped job stored nothing
    width = max(len(m) for m in masks)

    def padded(rows: list[Any]) -> Any:
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])

    data = DataProto(
        batch=TensorDict(
            {"token_level_rewards": padded(rewards), "response_mask": padded(masks)},
            batch_size=len(keys),
        ),
        non_tensor_batch={"uid": np.array(["uid-0"] * len(keys), dtype=object)},
    )
    data = compute_advantage_for_multi_trajectories(
        data, keys, AdvantageEstimator.GRPO, num_repeat=4, config=config.algorithm
    )
    got = {
        name: advantage_of(data.batch["advantages"][i], data.batch["response_mask"][i])
        for i, name in enumerate(names)
    }
    assert got == pytest.approx(expected, abs=1e-5)


def test_verls_legacy_worker_trains_a_failed_job_as_reward_zero_only_when_told(
    mixed_jobs: MixedJobs, tmp_path: Path
) -> None:
    """The legacy worker (one sample a row, joined with the trainer's rows) cannot leave a
    failed job out of its group: the default, drop, says so; zero puts its 0.0 in the group's
    statistics (untrained), and verl's own GRPO gives what that says."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from raas.client.integrations.verl import RaasRolloutFailed

    more = "actor_rollout_ref.rollout.n=4"
    config = verl_config(tmp_path, "http://raas.invalid", RESPONSE_LENGTH, more)
    with pytest.raises(RaasRolloutFailed, match=r"legacy AgentLoopWorker.*trainer\.use_v1=true"):
        generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")))

    config = verl_config(tmp_path, "http://raas.invalid", RESPONSE_LENGTH, more, on_failure="zero")
    out = generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")))
    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    out = compute_advantage(out, AdvantageEstimator.GRPO, num_repeat=4, config=config.algorithm)
    assert list(out.non_tensor_batch["uid"]) == ["uid-0"] * 4 + ["uid-1"] * 4
    names = [mixed_jobs.outcome[x["job_id"]] for x in out.non_tensor_batch["raas"]]
    got = [
        (name, advantage_of(out.batch["advantages"][i], out.batch["response_mask"][i]))
        for i, name in enumerate(names)
    ]
    expected = V1_CASES[("zero", "mask", 0.0)]
    assert got == [(name, pytest.approx(expected[name], abs=1e-5)) for name in names]
    assert sorted(names) == sorted(list(OUTCOMES) * 2)
    raas = out.non_tensor_batch["raas"]
    assert [x["truncated_as"] for x in raas] == ["mask" if n == "long" else None for n in names]


def test_a_failed_job_is_resubmitted_as_a_fresh_sample_when_told(
    mixed_jobs: MixedJobs, tmp_path: Path
) -> None:
    """resubmit: 1 runs the failed job again under a new job id (the prompt's fifth job: a
    win here), so even the legacy worker gets a sample for every row with on_failure drop."""
    more = "actor_rollout_ref.rollout.n=4"
    config = verl_config(tmp_path, "http://raas.invalid", RESPONSE_LENGTH, more, resubmit=1)
    out = generate(config, gen_batch(config, tmp_path, load_tokenizer("tiny")))
    names = [mixed_jobs.outcome[x["job_id"]] for x in out.non_tensor_batch["raas"]]
    assert sorted(names) == sorted(["win", "long", "win", "lose"] * 2)
    assert mixed_jobs.submitted == {"openai/gsm8k-0": 5, "openai/gsm8k-1": 5}
    assert out.non_tensor_batch["raas_failed"].tolist() == [0.0] * 8
