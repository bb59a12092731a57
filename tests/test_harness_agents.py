"""Agent frameworks from PyPI as harness agents: mini-swe-agent, unmodified, in a bwrap sandbox.

Needs the agents environment (``make agents-venv`` builds .venv-agents; ``RAAS_AGENTS_VENV``
points elsewhere); ``make test-harness-agents`` builds it and runs these tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raas.llm.models import load_tokenizer
from raas.llm.pool import BackendPool
from raas.sandbox import BwrapConfig
from raas.tasks.datasets import bundled
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
    assert (result["state"], result["reward"]) == ("done", 1.0), (result["error"], metrics)
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
