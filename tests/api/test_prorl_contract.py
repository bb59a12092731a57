"""ProRL Agent's clients against raas: their requests, built as their source builds them, and
every field of the answer their code reads, with the type it expects.

The clients (read from their source; cited by repository and path where each request is built):

- ProRL Agent's verl trainer integration: NVIDIA-NeMo/ProRL-Agent-Server,
  ``trainer_integration/verl/verl_custom/nvidia/rollout/async_server.py``
  (``AsyncLLMServerManager``: ``__init__``, ``request_from_openhands``,
  ``_send_single_message_to_openhands``, ``_convert_results_to_dataproto(_token)``), read in
  the fork jbarnes850/ProRL-Agent-Server (the upstream's current tree no longer has it).
- NeMo Gym's prorl agent: NVIDIA-NeMo/Gym, ``responses_api_agents/prorl_agent/run_prorl.py``
  (``initialize_prorl_server``, ``call_prorl_process``, ``convert_prorl_messages_to_output_items``)
  and ``responses_api_agents/prorl_agent/app.py`` (``SWEBenchWrapper._run_with_prorl``).
- ProRL Agent's own scripts: NVIDIA-NeMo/ProRL-Agent-Server ``scripts/tests/test_server_token.py``
  and ``scripts/run_swe.py``.

The model is an AgentBackend (a vLLM-protocol server whose scripted "model" acts), registered
the way the clients register theirs, through /add_llm_server; the tasks run for real (bwrap
sandboxes, real tests).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.api.prorl_compat import PRORL_KEYS
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from raas.tasks.code import ANSWER_FORMAT, CodeTask
from raas.tasks.countdown import CountdownTask
from raas.tasks.swe import SweTask
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

STEP = "[[step]]"  # every scripted answer starts with it: a prompt's count is the turn number

CALC = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n",
    "tests/__init__.py": "",
    "tests/test_ops.py": (
        "import unittest\nfrom calc.ops import add\n\n\nclass TestOps(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n"
    ),
}
# A SWE-Gym row as NeMo Gym's dataset holds it (metadata["instance_dict"]): no data_source, the
# test lists as JSON text. "snapshot" is raas's: the repository, since raas runs no images.
SWE_GYM_ROW = {
    "instance_id": "calc__calc-1",
    "repo": "calc/calc",
    "base_commit": "0123456789abcdef",
    "problem_statement": "add(2, 3) returns -1 instead of 5.",
    "hints_text": "",
    "version": "0.1",
    "FAIL_TO_PASS": json.dumps(["tests.test_ops.TestOps.test_add"]),
    "PASS_TO_PASS": json.dumps(["tests.test_ops.TestOps.test_zero"]),
    "snapshot": {"files": CALC},
}
# A code row as ProRL's code data holds it (verl format; the reward server reads
# reward_model.ground_truth, openhands/nvidia/reward.py), as the trainer sends it.
SUM_ROW = {
    "data_source": "codecontests",
    "instance_id": "cc-sum",
    "prompt": [
        {
            "role": "user",
            "content": "Sum two integers a and b given on one line.\n\n" + ANSWER_FORMAT,
        }
    ],
    "ability": "code",
    "reward_model": {
        "style": "rule",
        "ground_truth": json.dumps({"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}),
    },
    "extra_info": {"split": "train", "index": 0},
}
# rLLM's deepcoder rows: a LiveCodeBench functional test, the prompt as JSON text.
PRODUCT_ROW = {
    "data_source": "deepcoder_lcb",
    "instance_id": "lcb-product",
    "prompt": json.dumps([{"role": "user", "content": "Return the product of a and b."}]),
    "reward_model": json.dumps(
        {
            "ground_truth": json.dumps(
                [
                    {
                        "input": "2\n3",
                        "output": "6",
                        "testtype": "functional",
                        "metadata": {"func_name": "product"},
                    },
                    {
                        "input": "-1\n4",
                        "output": "-4",
                        "testtype": "functional",
                        "metadata": {"func_name": "product"},
                    },
                ]
            )
        }
    ),
}
# APPS call-based: arguments as lists, the return value wrapped in a list; a plain-text prompt.
ADD_ROW = {
    "data_source": "apps",
    "instance_id": "apps-add",
    "prompt": "Add a and b, as the method add of class Solution.",
    "reward_model": {
        "ground_truth": {"inputs": [[2, 3], [-1, 1]], "outputs": [[5], [0]], "fn_name": "add"}
    },
}
DOUBLE_ROW = {
    "data_source": "taco",
    "instance_id": "taco-double",
    "prompt": [{"role": "user", "content": "Print the double of n."}],
    "reward_model": {"ground_truth": {"inputs": ["4\n"], "outputs": ["8\n"]}},
}


def write(path: str, content: str) -> str:
    return call("bash", command=f"cat > {path} <<'RAAS_EOF'\n{content}\nRAAS_EOF")


SCRIPTS = {
    "add(2, 3) returns -1": [
        call("bash", command="cd /workspace/repo && sed -i 's/a - b/a + b/' calc/ops.py"),
    ],
    "Sum two integers": [
        write("/workspace/solution.py", "a, b = map(int, input().split())\nprint(a + b)"),
    ],
    "product of a and b": [
        write("/workspace/solution.py", "def product(a, b):\n    return a * b"),
    ],
    "method add of class Solution": [
        write(
            "/workspace/solution.py",
            "class Solution:\n    def add(self, a, b):\n        return a + b",
        ),
    ],
    "double of n": [  # a wrong program
        write("/workspace/solution.py", "print(int(input()) * 3)"),
    ],
}


def model(prompt: str) -> str:
    """The scripted policy: each problem's steps, then finish."""
    turn = prompt.count(STEP)
    for key, steps in SCRIPTS.items():
        if key in prompt and turn < len(steps):
            return f"{STEP} {steps[turn]}"
    return f"{STEP} Done. {call('finish', message='done')}"


@pytest.fixture
def registry(probe: ProbeTask) -> TaskRegistry:
    reg = TaskRegistry()
    for task in (probe, CountdownTask(), CodeTask(), SweTask()):
        reg.register(task)
    return reg


@pytest.fixture
def backend() -> Iterator[ServerThread]:
    server = ServerThread(AgentBackend(model).app).start()
    yield server
    server.stop()


@pytest.fixture
async def http(tmp_path: Path, registry: TaskRegistry) -> AsyncIterator[httpx.AsyncClient]:
    settings = ServeSettings(db=tmp_path / "prorl.db", tokenizer="tiny", cancel_grace_s=0.05)
    app = create_app(settings, registry)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", timeout=120
        ) as client:
            yield client


# -- what each client reads ---------------------------------------------------------------------


def trainer_reads(data: dict[str, Any]) -> None:
    """ProRL's trainer: _send_single_message_to_openhands retries unless data.get("messages") is
    non-empty; request_from_openhands subscripts ['resolved'] and ['finish'];
    _convert_results_to_dataproto(_token) reads success, error (error_mask: not None and not ''),
    resolved, finish, tools (apply_chat_template(tools=...)), and each message's role, content,
    tool_calls, token_ids, logprobs (None means zeros)."""
    assert isinstance(data["messages"], list) and data["messages"]
    assert isinstance(data["resolved"], bool) and isinstance(data["finish"], bool)
    assert isinstance(data["success"], bool)
    assert data["error"] is None or isinstance(data["error"], str)
    assert isinstance(data["tools"], list)
    for tool in data["tools"]:
        assert tool["type"] == "function" and isinstance(tool["function"]["name"], str)
    for message in data["messages"]:
        assert message["role"] in ("system", "user", "assistant", "tool")
        assert isinstance(message["content"], str)
        assert isinstance(message["token_ids"], list)
        assert all(isinstance(t, int) for t in message["token_ids"])
        lps = message["logprobs"]
        assert lps is None or (isinstance(lps, list) and len(lps) == len(message["token_ids"]))
        if message["tool_calls"] is not None:
            for tc in message["tool_calls"]:
                assert isinstance(tc["name"], str) and isinstance(tc["arguments"], str | dict)


def trainer_token_batch(messages: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """What _convert_results_to_dataproto_token makes of the messages: prompt = the messages
    before the first assistant, trailing non-assistant messages dropped, loss mask 1 on the
    assistants' token_ids, logprobs 0.0 where a message has none."""
    start = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    while messages[-1]["role"] != "assistant":
        messages = messages[:-1]
    ids = [m["token_ids"] for m in messages]
    lps = [
        m["logprobs"] if m.get("logprobs") is not None else [0.0] * len(i)
        for m, i in zip(messages, ids, strict=True)
    ]
    masks = [
        [1 if m["role"] == "assistant" else 0] * len(i) for m, i in zip(messages, ids, strict=True)
    ]
    return {  # the trainer: sum(lists, [])
        "prompt_ids": list(chain(*ids[:start])),
        "response_ids": list(chain(*ids[start:])),
        "loss_mask": list(chain(*masks[start:])),
        "logprobs": list(chain(*lps[start:])),
    }


def gym_reads(result: dict[str, Any]) -> None:
    """NeMo Gym's _run_with_prorl: result.get("messages") or [], get("tools") or [],
    bool(get("resolved")), bool(get("success")), get("git_patch") (patch_exists = bool(...)),
    get("critical_error"), get("end_properly", True), get("filter", False), get("error");
    convert_prorl_messages_to_output_items: role, content (or ""), an assistant's tool_calls
    ({name, arguments: str | dict}), token_ids, input_ids, logprobs (or []), tool_call_id."""
    assert isinstance(result["messages"], list) and isinstance(result["tools"], list)
    for key in ("resolved", "success", "end_properly", "filter"):
        assert isinstance(result[key], bool), key
    assert result["git_patch"] is None or isinstance(result["git_patch"], str)
    assert result["critical_error"] in (None, "init", "run", "eval", "timeout")
    assert result["error"] is None or isinstance(result["error"], str)
    pending = 0
    for item in result["messages"]:
        if item["role"] == "assistant":
            ids, prompt, lps = item["token_ids"], item["input_ids"], item["logprobs"]
            assert isinstance(ids, list) and isinstance(prompt, list) and isinstance(lps, list)
            assert len(lps) == len(ids) and all(isinstance(x, float) for x in lps)
            pending += len(item["tool_calls"] or [])
        elif item["role"] == "tool":
            # No tool_call_id: Gym pairs each output with the oldest call still pending.
            assert item.get("tool_call_id") is None
            pending -= 1
    assert pending >= 0


async def rollout_of(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S})
    assert r.status_code == 200
    result: dict[str, Any] = r.json()["result"]
    return result


# -- ProRL's verl trainer -------------------------------------------------------------------------


def trainer_sampling_params(max_iterations: int = 8) -> dict[str, Any]:
    """AsyncLLMServerManager.__init__'s self.sampling_params, key for key (values from a
    config: rollout.temperature, top_p, max_iterations, data.max_response_length...)."""
    path = "/models/Qwen/Qwen3-4B-Instruct-2507"  # actor_rollout_ref.model.path
    model_name = "/".join(path.split("/")[-2:])
    max_response_length, total_len = 4096, 4096 + 12288
    return {
        "model": f"hosted_vllm/{model_name}",
        "api_key": "dummy_key",
        "modify_params": False,
        "log_completions": False,
        "native_tool_calling": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_iterations": max_iterations,
        "max_output_tokens": max_response_length,
        "token_level_generation": False,
        "custom_tokenizer": "Qwen/Qwen3-8B",
        "max_model_len": total_len,
        "ensure_thinking_end_properly": True,
    }


async def test_the_verl_trainer_flow(http: httpx.AsyncClient, backend: ServerThread) -> None:
    address = backend.url.removeprefix("http://")
    # __init__: clear_llm_servers() posts /clear_llm_server with no body; then
    # _add_llm_server_to_openhands posts {"address": f"http://{address}/v1"}.
    assert (await http.post("/clear_llm_server")).status_code == 200
    r = await http.post("/add_llm_server", json={"address": f"http://{address}/v1"})
    assert r.status_code == 200
    # request_from_openhands: /start (must be 200), then /process per trajectory, then /stop.
    assert (await http.post("/start")).status_code == 200
    sampling_params = trainer_sampling_params()
    batch = [SUM_ROW, SWE_GYM_ROW | {"data_source": "swebench"}]
    messages = []  # DataProto2Messages: each instance copied, trajectory_id = j
    for instance in batch:
        for j in range(2):
            message = instance.copy()
            message["trajectory_id"] = j
            messages.append(message)

    async def send(message: dict[str, Any]) -> httpx.Response:
        request_data = {"instance": message, "sampling_params": sampling_params}
        return await http.post(
            "/process", headers={"Content-Type": "application/json"}, json=request_data
        )

    answers = await asyncio.gather(*(send(m) for m in messages))
    assert (await http.post("/stop")).status_code == 200
    results = [a.json() for a in answers]
    assert [a.status_code for a in answers] == [200] * 4, results
    for message, data in zip(messages, results, strict=True):
        trainer_reads(data)
        assert data["resolved"] is True and data["finish"] is True, data
        assert data["success"] is True and data["error"] is None
        assert (data["instance_id"], data["trajectory_id"]) == (
            message["instance_id"],
            message["trajectory_id"],
        )
        assert {t["function"]["name"] for t in data["tools"]} == {
            "bash",
            "editor",
            "finish",
            "think",
        }
        # The token path: the messages' tokens are the trajectory's, exactly.
        rollout = await rollout_of(http, data["job_id"])
        batch_view = trainer_token_batch(copy.deepcopy(data["messages"]))
        trajectory = rollout["trajectory"]
        for key in ("prompt_ids", "response_ids", "loss_mask", "logprobs"):
            assert batch_view[key] == trajectory[key], key
        prorl = data["metrics"]["prorl"]
        assert prorl["renamed_sampling_params"] == {
            "max_iterations": "max_turns",
            "max_output_tokens": "max_tokens",
            "max_model_len": "max_context_tokens",
        }
        assert prorl["unused_sampling_params"]["api_key"] == "<redacted>"
        assert prorl["unused_sampling_params"]["custom_tokenizer"] == "Qwen/Qwen3-8B"
    # Two trajectories of one instance are two rollouts, not one answer given twice.
    assert len({d["job_id"] for d in results}) == 4
    swe = results[2]
    assert (swe["data_source"], swe["task"]) == ("swebench", "swe")  # ProRL's default name
    assert "+    return a + b" in swe["git_patch"]
    assert [m["role"] for m in swe["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    first = swe["messages"][2]
    assert first["tool_calls"][0]["name"] == "bash" and "<tool_call>" not in first["content"]
    # /stop drains: a /process now is refused until the next /start.
    refused = await send(messages[0])
    assert refused.status_code == 503


async def test_contest_code_rows(http: httpx.AsyncClient, backend: ServerThread) -> None:
    await http.post("/add_llm_server", json={"address": f"{backend.url}/v1"})
    params = trainer_sampling_params()
    rows = [PRODUCT_ROW, ADD_ROW, DOUBLE_ROW]
    answers = await asyncio.gather(
        *(http.post("/process", json={"instance": r, "sampling_params": params}) for r in rows)
    )
    product, add, double = (a.json() for a in answers)
    for data in (product, add, double):
        trainer_reads(data)
        assert data["task"] == "code" and data["success"] is True, data
    assert (product["resolved"], product["reward"]) == (True, 1.0)
    assert product["metrics"]["tests_passed"] == 2
    assert (add["resolved"], add["metrics"]["tests_passed"]) == (True, 2)
    assert (double["resolved"], double["reward"]) == (False, 0.0)
    assert "printed '12\\n', expected '8\\n'" in double["metrics"]["failure"]["why"]
    assert double["filter"] is False  # a wrong answer is trained on


# -- NeMo Gym's prorl agent -----------------------------------------------------------------------


async def gym_initialize(http: httpx.AsyncClient, model_endpoint: str) -> None:
    """run_prorl.py initialize_prorl_server: /start (200, or 400 when already running), then
    /add_llm_server {"address": model_endpoint} (raise_for_status)."""
    resp = await http.post("/start")
    assert resp.status_code in (200, 400)
    resp = await http.post("/add_llm_server", json={"address": model_endpoint})
    assert resp.status_code == 200


async def gym_process(
    http: httpx.AsyncClient, metadata: dict[str, str], **params: Any
) -> dict[str, Any]:
    """app.py _run_with_prorl + run_prorl.py call_prorl_process, as they build the body."""
    instance_id = metadata.get("instance_id", "unknown")
    instance = json.loads(metadata["instance_dict"])
    sampling_params: dict[str, Any] = {}
    for key in ("temperature", "top_p", "max_output_tokens"):
        value = params.get(key)
        if value is not None:
            sampling_params[key] = value
    request_body: dict[str, Any] = {"instance": instance, "sampling_params": sampling_params}
    if instance_id is not None:
        request_body["job_id"] = instance_id
    resp = await http.post("/process", json=request_body)
    assert resp.status_code == 200, resp.text  # resp.raise_for_status()
    result: dict[str, Any] = resp.json()
    gym_reads(result)
    return result


async def test_the_nemo_gym_flow(http: httpx.AsyncClient, backend: ServerThread) -> None:
    await gym_initialize(http, f"{backend.url}/v1")
    await gym_initialize(http, f"{backend.url}/v1")  # started twice: still fine
    metadata = {"instance_id": "calc__calc-1", "instance_dict": json.dumps(SWE_GYM_ROW)}
    # ng_collect_rollouts with num_repeats=2: the same instance, the same job_id, twice at once.
    first, second = await asyncio.gather(
        gym_process(http, metadata, temperature=0.6, top_p=0.95, max_output_tokens=16384),
        gym_process(http, metadata, temperature=0.6, top_p=0.95, max_output_tokens=16384),
    )
    for result in (first, second):
        assert result["resolved"] is True and result["success"] is True
        assert result["git_patch"] and "+    return a + b" in result["git_patch"]
        assert result["critical_error"] is None and result["filter"] is False
        assert result["end_properly"] is True and result["error"] is None
        assistants = [m for m in result["messages"] if m["role"] == "assistant"]
        rollout = await rollout_of(http, result["job_id"])
        ids = rollout["trajectory"]["prompt_ids"] + rollout["trajectory"]["response_ids"]
        for message in assistants:  # prompt_token_ids + generation_token_ids: what was seen
            seen = message["input_ids"] + message["token_ids"]
            assert ids[: len(seen)] == seen
    # The name is the first one's job_id, the other runs under it: two rollouts, not one.
    ids = sorted([first["job_id"], second["job_id"]])
    assert ids[0] == "calc__calc-1" and ids[1].startswith("calc__calc-1@")
    # The next epoch rolls the instance out again, under the same name.
    again = await gym_process(http, metadata, temperature=0.6)
    assert again["job_id"].startswith("calc__calc-1@") and again["job_id"] not in ids
    assert again["resolved"] is True


async def test_a_swe_gym_row_without_its_image_fails_as_infra(
    http: httpx.AsyncClient, backend: ServerThread
) -> None:
    await gym_initialize(http, f"{backend.url}/v1")
    row = {k: v for k, v in SWE_GYM_ROW.items() if k != "snapshot"}
    row["image_name"] = "xingyaoww/sweb.eval.x86_64.calc_s_calc-1"
    metadata = {"instance_id": row["instance_id"], "instance_dict": json.dumps(row)}
    result = await gym_process(http, metadata, temperature=0.0)
    assert result["state"] == "failed" and result["error_kind"] == "infra"
    assert result["critical_error"] == "init" and result["filter"] is True
    assert result["resolved"] is False and result["success"] is False
    assert result["messages"] == [] and result["git_patch"] is None
    assert "xingyaoww/sweb.eval.x86_64.calc_s_calc-1" in result["error"]
    # infra, but not run again: a retry cannot make the image appear in the store
    assert result["attempts"] == 1


# -- ProRL's own scripts --------------------------------------------------------------------------


async def test_prorl_scripts(http: httpx.AsyncClient, backend: ServerThread) -> None:
    # scripts/tests/test_server_token.py: add_llm_server('http://127.0.0.1:8000') (no /v1),
    # start_server, get_status, then process_request(instance_copy, sampling_params).
    assert (await http.post("/add_llm_server", json={"address": backend.url})).status_code == 200
    assert (await http.post("/start")).status_code == 200
    assert (await http.get("/status")).status_code == 200
    sampling_params = {
        "model": "hosted_vllm/Qwen/Qwen3-8B",
        "api_key": "mykey",
        "modify_params": False,
        "log_completions": False,
        "native_tool_calling": True,
        "temperature": 0.6,
        "top_p": 0.9,
        "max_iterations": 35,
        "token_level_generation": True,
        "custom_tokenizer": "Qwen/Qwen3-8B",
        "max_output_tokens": 4096,
        "max_model_len": 32768,
    }
    instance_copy = copy.deepcopy(SWE_GYM_ROW | {"data_source": "swebench"})
    instance_copy["trajectory_id"] = 0
    payload = {"instance": instance_copy, "sampling_params": sampling_params or {}}
    r = await http.post("/process", json=payload)
    assert r.status_code == 200
    result = r.json()
    for message in result["messages"]:  # "Don't print full messages"
        message["content"] = len(message["content"])
        if "tool_calls" in message and message["tool_calls"] is not None:
            message["tool_calls"] = len(message["tool_calls"])
        if "input_ids" in message and message["input_ids"] is not None:
            message["input_ids"] = len(message["input_ids"])
        message["token_ids"] = len(message["token_ids"])
    result["tools"] = len(result["tools"])
    assert result["critical_error"] is None
    assert result["metrics"]["prorl"]["unused_sampling_params"]["api_key"] == "<redacted>"
    # scripts/run_swe.py: DEFAULT_SAMPLING_PARAMS; sums r.get("resolved") over the results.
    params = {
        "model": "hosted_vllm/Qwen/Qwen3-8B",
        "api_key": "mykey",
        "modify_params": False,
        "log_completions": False,
        "native_tool_calling": True,
        "temperature": 0.6,
        "top_p": 0.9,
        "max_iterations": 35,
    }
    inst = SWE_GYM_ROW | {"data_source": "swebench", "trajectory_id": 0}
    r = await http.post("/process", json={"instance": inst, "sampling_params": params})
    assert sum([r.json().get("resolved")]) == 1
    assert (await http.post("/stop")).status_code == 200


# -- sampling_params ------------------------------------------------------------------------------

EVERY_PRORL_KEY: dict[str, Any] = {
    "max_iterations": 3,
    "ensure_thinking_end_properly": False,
    "strict_loop_detector": False,
    "enable_vision": False,
    "enable_a11y_tree": False,
    "model": "hosted_vllm/m",
    "api_key": "k",
    "base_url": "http://x/v1",
    "api_version": None,
    "aws_access_key_id": "a",
    "aws_secret_access_key": "s",
    "aws_region_name": None,
    "openrouter_site_url": "u",
    "openrouter_app_name": "n",
    "num_retries": 4,
    "retry_multiplier": 2.0,
    "retry_min_wait": 5,
    "retry_max_wait": 30,
    "timeout": 30,
    "max_message_chars": 30000,
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 20,
    "custom_llm_provider": None,
    "max_input_tokens": None,
    "max_output_tokens": 512,
    "input_cost_per_token": None,
    "output_cost_per_token": None,
    "ollama_base_url": None,
    "drop_params": True,
    "modify_params": False,
    "disable_vision": None,
    "caching_prompt": True,
    "log_completions": False,
    "log_completions_folder": "/tmp/c",
    "custom_tokenizer": "Qwen/Qwen3-8B",
    "native_tool_calling": True,
    "reasoning_effort": "high",
    "seed": 7,
    "enable_thinking": False,
    "token_level_generation": True,
    "max_model_len": 8192,
    "max_tokens": 256,
}


async def test_every_prorl_sampling_key_is_accepted_and_v1_stays_strict(
    http: httpx.AsyncClient,
) -> None:
    assert set(EVERY_PRORL_KEY) == PRORL_KEYS
    countdown = {"data_source": "countdown", "numbers": [3, 4, 100], "target": 7}
    unused = {}
    for instance in (countdown, probe_instance()):
        r = await http.post(
            "/process", json={"instance": instance, "sampling_params": EVERY_PRORL_KEY}
        )
        assert r.status_code == 200, r.text
        unused[instance["data_source"]] = r.json()["metrics"]["prorl"]["unused_sampling_params"]
    for recorded in unused.values():
        assert recorded["api_key"] == recorded["aws_secret_access_key"] == "<redacted>"
        assert recorded["model"] == "hosted_vllm/m" and recorded["enable_thinking"] is False
    # countdown takes max_turns (max_iterations), seed and temperature: the rest is recorded.
    assert set(unused["countdown"]) == PRORL_KEYS - {"max_iterations", "seed", "temperature"}
    # raas's own routes still refuse a key they do not take, naming it.
    r = await http.post(
        "/v1/rollouts", json={"instance": countdown, "sampling_params": {"max_iterations": 3}}
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "sampling_params", "max_iterations"]
    # On /process, a key neither raas nor ProRL knows is refused too, and a renamed key's bad
    # value is named as the client sent it.
    for params, loc in [
        ({"temprature": 0.5}, ["body", "sampling_params", "temprature"]),
        ({"max_iterations": 0}, ["body", "sampling_params", "max_iterations"]),
        ({"max_output_tokens": "many"}, ["body", "sampling_params", "max_output_tokens"]),
    ]:
        row = SUM_ROW | {"trajectory_id": 0}
        r = await http.post("/process", json={"instance": row, "sampling_params": params})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == loc


async def test_renamed_limits_take_effect(http: httpx.AsyncClient, backend: ServerThread) -> None:
    await http.post("/add_llm_server", json={"address": f"{backend.url}/v1"})
    row = SUM_ROW | {"trajectory_id": 0}
    one_turn = await http.post(
        "/process", json={"instance": row, "sampling_params": {"max_iterations": 1}}
    )
    data = one_turn.json()
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    assert data["finish"] is False
    rollout = await rollout_of(http, data["job_id"])
    assert rollout["trajectory"]["stop_reason"] == "max_turns"
    tiny = await http.post(
        "/process", json={"instance": row, "sampling_params": {"max_model_len": 16}}
    )
    rollout = await rollout_of(http, tiny.json()["job_id"])
    assert rollout["trajectory"]["stop_reason"] == "max_context"


# -- failures, cancel -----------------------------------------------------------------------------


async def test_failures_map_to_critical_error_and_filter(http: httpx.AsyncClient) -> None:
    cases = {
        "raise": ("failed", "run", True, "infra"),  # infra: ProRL's critical_error
        "policy": ("failed", None, True, "policy"),  # the model's doing: not critical
        "ok": ("done", None, False, None),
    }
    for how, (state, critical, filtered, kind) in cases.items():
        body = {"instance": probe_instance(run=how), "sampling_params": {}}
        data = (await http.post("/process", json=body)).json()
        assert (data["state"], data["critical_error"], data["filter"]) == (
            state,
            critical,
            filtered,
        ), data
        assert data["error_kind"] == kind
        assert (data["error"] is None) == (how == "ok")
        assert isinstance(data["timing"]["run_time"], float)
        assert isinstance(data["timing"]["timeout_triggered"], bool)


async def test_cancel_by_the_name_a_client_gave(http: httpx.AsyncClient, probe: ProbeTask) -> None:
    body = {"instance": probe_instance(run="block"), "sampling_params": {}, "job_id": "g-1"}
    pending = asyncio.create_task(http.post("/process", json=body))
    for _ in range(int(WAIT_S / 0.01)):
        if ("g-1", "run") in probe.order:
            break
        await asyncio.sleep(0.01)
    r = await http.post("/cancel", json={"job_id": "g-1"})
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    data = (await asyncio.wait_for(pending, WAIT_S)).json()
    assert data["state"] == "cancelled" and data["critical_error"] == "timeout"
    assert data["filter"] is True and data["job_id"] == "g-1"
    # No rollout runs under the name any more: /cancel names the (finished) job of that id.
    r = await http.post("/cancel", json={"job_id": "g-1"})
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert (await http.post("/cancel", json={"job_id": "g-2"})).status_code == 404
