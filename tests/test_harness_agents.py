"""Agent frameworks from PyPI and npm as harness agents: mini-swe-agent and Qwen Code, unmodified,
in a bwrap sandbox.

Needs the agents environments (``make agents-venv`` builds .venv-agents, ``make agents-node``
.agents-node; ``RAAS_AGENTS_VENV`` and ``RAAS_AGENTS_NODE`` point elsewhere); ``make
test-harness-agents`` builds them and runs these tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raas.llm.models import load_tokenizer
from raas.llm.pool import BackendPool
from raas.sandbox import BwrapConfig
from raas.tasks.datasets import bundled
from raas.tasks.harness_node import NODE_MODULES_INSIDE
from raas.tasks.services import TaskServices
from tests.llm_servers import AgentBackend, ServerThread
from tests.policies import call
from tests.test_harness import run_job

pytestmark = pytest.mark.harness_agents

ROOT = Path(__file__).resolve().parent.parent
FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="module")
def agents_venv() -> Path:
    venv = Path(os.environ.get("RAAS_AGENTS_VENV") or ROOT / ".venv-agents")
    if not list(venv.glob("lib/python3.*/site-packages/minisweagent")):
        pytest.fail(f"no mini-swe-agent in {venv}: `make agents-venv` builds it")
    return venv


async def test_mini_swe_agent_fixes_a_bundled_swe_instance_through_the_gateway(
    tmp_path: Path, agents_venv: Path
) -> None:
    """mini-swe-agent's own `mini` command (litellm, its mini.yaml, its bash tool) in the
    sandbox, through the relay and the job's gateway session, against a vLLM-protocol model
    that answers in tool calls: it applies the fix, runs the tests, submits; EVAL runs the
    hidden tests on the diff; the trajectory is what the model generated."""
    row = bundled("swe")[0]
    instance = {k: v for k, v in row.items() if k != "gold_patch"}
    fix = (
        f"cd /workspace/repo && git apply <<'RAAS_EOF'\n{row['gold_patch'].rstrip()}\nRAAS_EOF\n"
        "python3 -m unittest 2>&1 | tail -1 && echo PATCHED-$((6*7))"
    )

    def model(prompt: str) -> str:
        if "PATCHED-42" in prompt:  # the fix's output came back: submit
            return "The tests pass." + call("bash", command=FINISH)
        return "I will apply the fix." + call("bash", command=fix)

    backend = AgentBackend(model, logprob=lambda i, token: -((token * 7 + i) % 1000 + 1) / 1000)
    server = ServerThread(backend.app).start()
    llm = BackendPool()
    llm.add(server.url, "vllm", 8)
    services = TaskServices(
        llm=llm, tokenizer_name="tiny", sandbox_config=BwrapConfig(), agents_venv=agents_venv
    )
    job = {**instance, "data_source": "harness", "judge": "swe", "agent": "mini-swe-agent"}
    try:
        result = await run_job(tmp_path, job, None, services)
    finally:
        await llm.stop()
        server.stop()
    metrics = result["metrics"]
    assert (result["state"], result["reward"]) == ("done", 1.0), (
        result["error"],
        metrics.get("agent_output"),
    )
    assert metrics["stop_reason"] == "agent_exit_0"
    assert "mini-swe-agent: exit 0, status 'Submitted'" in metrics["agent_output"]
    assert "if idx != idx2:" in metrics["artifact"]["patch"]

    # mini-swe-agent's own prompt (its instance template and bash tool) reached the model.
    (p1, gen1, lp1), (p2, gen2, lp2) = backend.returned
    prompt = load_tokenizer("tiny").decode(p1)
    assert "Please solve this issue" in prompt and FINISH in prompt and '"bash"' in prompt
    assert row["problem_statement"].splitlines()[0] in prompt
    # Its two calls are one segment: exactly the generated tokens and their logprobs.
    assert (metrics["gateway_calls"], metrics["gateway_segments"]) == (2, 1)
    traj = result["trajectory"]
    observation = traj["response_ids"][len(gen1) : -len(gen2)]
    assert traj["response_ids"] == gen1 + observation + gen2
    assert traj["loss_mask"] == [1] * len(gen1) + [0] * len(observation) + [1] * len(gen2)
    assert traj["logprobs"] == lp1 + [0.0] * len(observation) + lp2
    assert p2 == p1 + gen1 + observation


@pytest.fixture(scope="module")
def agents_node() -> Path:
    env = Path(os.environ.get("RAAS_AGENTS_NODE") or ROOT / ".agents-node")
    if not (env / "node_modules/@qwen-code/qwen-code/cli.js").is_file():
        pytest.fail(f"no Qwen Code in {env}: `make agents-node` builds it")
    return env


async def test_qwen_code_fixes_a_bundled_swe_instance_through_the_gateway(
    tmp_path: Path, agents_node: Path
) -> None:
    """Qwen Code's own CLI (npm's @qwen-code/qwen-code, on the host's node, headless, every
    tool approved) in the sandbox, through the relay and the job's gateway session, against a
    vLLM-protocol model that answers in Qwen Code's own tool calls (read_file, edit,
    run_shell_command: its names and arguments, as its package declares them): it reads the
    file, edits it, runs the tests and answers; EVAL runs the hidden tests on the diff; its
    four calls are one segment of exactly the model's tokens; nothing of it is left running."""
    row = bundled("swe")[0]
    instance = {k: v for k, v in row.items() if k != "gold_patch"}
    [minus] = [line for line in row["gold_patch"].splitlines() if line.startswith("-    ")]
    [plus] = [line for line in row["gold_patch"].splitlines() if line.startswith("+    ")]
    path = "/workspace/repo/" + row["gold_patch"].split("+++ b/")[1].split("\n")[0]
    tests = "python3 -m unittest 2>&1 | tail -1 && echo PATCHED-$((6*7))"

    def model(prompt: str) -> str:
        if "PATCHED-42" in prompt:  # the tests' output came back: done
            return "The tests pass now."
        if f"The file: {path} has been updated." in prompt:  # the edit tool's answer
            return "Now the tests." + call("run_shell_command", command=tests)
        if "has_close_elements(numbers" in prompt:  # the file, read
            edit = {"old_string": minus[1:].strip(), "new_string": plus[1:].strip()}
            return "I will fix the comparison." + call("edit", file_path=path, **edit)
        return "Let me read the file." + call("read_file", file_path=path)

    backend = AgentBackend(model, logprob=lambda i, token: -((token * 7 + i) % 1000 + 1) / 1000)
    server = ServerThread(backend.app).start()
    llm = BackendPool()
    llm.add(server.url, "vllm", 8)
    services = TaskServices(
        llm=llm, tokenizer_name="tiny", sandbox_config=BwrapConfig(), agents_node=agents_node
    )
    job = {**instance, "data_source": "harness", "judge": "swe", "agent": "qwen-code"}
    try:
        result = await run_job(tmp_path, job, None, services)
    finally:
        await llm.stop()
        server.stop()
    metrics = result["metrics"]
    assert (result["state"], result["reward"]) == ("done", 1.0), metrics.get("agent_output")
    assert metrics["stop_reason"] == "agent_exit_0"
    assert "The tests pass now.\nqwen-code: exit 0" in metrics["agent_output"]
    assert "if idx != idx2:" in metrics["artifact"]["patch"]

    # Qwen Code's own prompt and tools reached the model, and the task as its prompt.
    prompts = [load_tokenizer("tiny").decode(p) for p, _, _ in backend.returned]
    assert "You are Qwen Code" in prompts[0]
    for tool in ('"read_file"', '"edit"', '"run_shell_command"', '"old_string"'):
        assert tool in prompts[0]
    assert row["problem_statement"].splitlines()[0] in prompts[0]
    # Its four calls are one segment: exactly the generated tokens and their logprobs.
    assert (metrics["gateway_calls"], metrics["gateway_segments"]) == (4, 1)
    traj = result["trajectory"]
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for (prompt, gen, lp), (after, _, _) in zip(
        backend.returned, [*backend.returned[1:], (None, None, None)], strict=True
    ):
        response, mask, logprobs = response + gen, mask + [1] * len(gen), logprobs + lp
        if after is not None:  # each prompt extends the one before and its answer
            assert after[: len(prompt) + len(gen)] == prompt + gen
            observation = after[len(prompt) + len(gen) :]
            response += observation
            mask += [0] * len(observation)
            logprobs += [0.0] * len(observation)
    assert (traj["response_ids"], traj["loss_mask"]) == (response, mask)
    assert traj["logprobs"] == logprobs
    # The sandbox took Qwen Code's processes with it (node, the shells its tool started).
    assert not _running(NODE_MODULES_INSIDE)


def _running(needle: str) -> list[str]:
    """The command lines of this host's processes that name ``needle``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if needle in line:
            found.append(line)
    return found
