"""Harness agents on Harbor tasks (``"judge": "harbor"``): an agent program raas did not write
runs in the Harbor task's sandbox (its image, its caps, its service, its WORKDIR) against the
job's gateway session; EVAL is Harbor's verifier on a fresh fork of what it left. Whole jobs
through a pipeline, on the images built by test_harbor_verifier's fixture. The images tier
(``make test-images``); mini-swe-agent's test needs the agents environment as well (``make
agents-venv``; RAAS_AGENTS_VENV points elsewhere)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.llm.models import load_tokenizer
from raas.llm.pool import BackendPool
from raas.pipeline import JobRequest, Pipeline, PipelineConfig
from raas.settings import AgentSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.harness import HarnessTask
from raas.tasks.services import TaskServices
from tests.support import tiers
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call
from tests.tasks import test_harbor_verifier as verifier
from tests.tasks.test_harbor_policy_hacks import gold, shipped
from tests.tasks.test_harbor_verifier import instance, solve
from tests.tasks.test_harness import JOB_TIMEOUT_S, NoLLM, run_job

pytestmark = pytest.mark.images
services = verifier.services  # the module's fixture: one base image, one store

ROOT = Path(__file__).resolve().parents[2]


def harness(task: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``task`` (a Harbor instance) run by a harness agent, with ``fields``."""
    return {**task, "data_source": "harness", "judge": "harbor", **fields}


def served(base: TaskServices, llm: Any, agents: AgentSettings | None = None) -> TaskServices:
    """Services of ``base``'s sandboxes and image store (run_job closes its services) on
    ``llm``, with the tiny model's tokenizer."""
    return TaskServices(
        llm=llm,
        tokenizer_name="tiny",
        sandbox_config=base.sandbox_config,
        image_store=base.image_store,
        agents=agents or AgentSettings(),
    )


class Model:
    """A vLLM-protocol model server answering ``script(prompt)``, on a backend pool."""

    def __init__(self, script: Any) -> None:
        self.backend = AgentBackend(script)
        self.server = ServerThread(self.backend.app).start()
        self.llm = BackendPool()
        self.llm.add(self.server.url, "vllm", 8)

    def prompts(self) -> list[str]:
        return [load_tokenizer("tiny").decode(p) for p, _, _ in self.backend.returned]

    async def stop(self) -> None:
        await self.llm.stop()
        self.server.stop()


@pytest.fixture
async def model_of() -> AsyncIterator[Any]:
    started: list[Model] = []

    def start(script: Any) -> Model:
        started.append(Model(script))
        return started[-1]

    yield start
    for model in started:
        await model.stop()


async def test_the_reference_agent_solves_a_shipped_harbor_task_and_a_no_op_scores_zero(
    services: TaskServices, model_of: Any, tmp_path: Path
) -> None:
    """service-query: its answer is only in the image's service (its CMD on 127.0.0.1:8080),
    so the agent scores only where INIT started it, healthcheck passed, in the agent's own
    sandbox; the agent's shell is in the image's WORKDIR (/app)."""
    task = shipped("service-query")
    command = "pwd\n" + gold(task)

    def solves(prompt: str) -> str:
        if "[exit code" in prompt:  # the command's output came back
            return "Done." + call("finish", answer="done")
        return "I will query the service." + call("bash", command=command)

    model = model_of(solves)
    result = await run_job(tmp_path / "gold", harness(task), None, served(services, model.llm))
    metrics = result["metrics"]
    assert (result["state"], result["reward"]) == ("done", 1.0), (
        result["error"],
        metrics.get("agent_output"),
        metrics.get("verifier_output"),
    )
    assert metrics["harbor_task"] == "service-query" and metrics["stop_reason"] == "agent_exit_0"
    assert metrics["gateway_calls"] == 2 and metrics["rewards"] == {"reward": 1.0}
    first, second = model.prompts()
    assert task["files"]["instruction.md"].splitlines()[0] in first  # the instruction, as told
    assert "\n/app\n" in second  # pwd, in the image's WORKDIR
    # The trajectory is what the model generated, and what came back is masked out.
    traj = result["trajectory"]
    assert 0 < sum(traj["loss_mask"]) < len(traj["loss_mask"]) == len(traj["logprobs"])

    model = model_of(lambda prompt: "I cannot do this.")  # no tool call: the agent stops
    noop = await run_job(tmp_path / "noop", harness(task), None, served(services, model.llm))
    assert (noop["state"], noop["reward"]) == ("done", 0.0), noop["error"]
    assert "/app/reorder.txt is missing" in noop["metrics"]["verifier_output"]


# -- what an agent program leaves behind (a shell line as the program: no model) --------------

PLANT = (
    'mkdir -p /logs/verifier && echo \'{"reward": 1, "exists": 1}\' > /logs/verifier/reward.json'
)
DAEMON = (
    "nohup sh -c 'while :; do [ -e /tests/check.py ] && echo 12 > /app/answer.txt;"
    " sleep 0.01; done' >/dev/null 2>&1 & disown; echo 0 > /app/answer.txt"
)


async def scored(services: TaskServices, tmp_path: Path, command: str, task: Any = None) -> Any:
    """The result of a harness job on ``task`` (default: test_harbor_verifier's sum task)
    whose agent program is the shell line ``command``."""
    job = harness(task or instance(), agent_command=command)
    return await run_job(tmp_path, job, None, served(services, NoLLM()))


async def test_a_reward_file_the_agent_program_plants_is_not_read(
    services: TaskServices, tmp_path: Path
) -> None:
    # /logs is a link into /app in this image: the program can write the verifier's file.
    planted = await scored(services, tmp_path / "a", PLANT + " && rm /app/data.txt")
    assert (planted["state"], planted["reward"]) == ("done", 0.0), planted["metrics"]
    assert "wrote neither" in planted["metrics"]["verifier_error"]
    control = await scored(services, tmp_path / "b", PLANT + "; " + solve())
    assert control["reward"] == 1.0, control["metrics"]


async def test_a_daemon_the_agent_program_leaves_running_does_not_reach_the_verifier(
    services: TaskServices, tmp_path: Path
) -> None:
    left = await scored(services, tmp_path / "a", DAEMON)
    assert (left["state"], left["reward"]) == ("done", 0.0), left["metrics"]
    control = await scored(services, tmp_path / "b", DAEMON.replace("echo 0 >", "echo 12 >"))
    assert control["reward"] == 1.0, control["metrics"]


# A verifier that looks for anything of the harness: a bind of the agent program's (anything in
# /.raas but the action server), the agent's variables, the harness's files, a session token
# (raas-<43 characters>) in any file it can read. It pays 1 where it finds one.
LOOKS_FOR_THE_HARNESS = r"""#!/bin/bash
mkdir -p /logs/verifier
seen=$(
  ls -A /.raas | grep -vx inside | sed 's|^|/.raas/|'
  env | grep -E '^(OPENAI|ANTHROPIC|GEMINI|GOOGLE_GEMINI|RAAS)_' | cut -d= -f1
  ls -d /tmp/raas-harness 2>/dev/null
  grep -rlsE --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr \
    'raas-[A-Za-z0-9_-]{43}' /
)
echo "seen: $seen"
if [ -n "$seen" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


async def test_the_verifier_sees_nothing_of_the_harness(
    services: TaskServices, tmp_path: Path
) -> None:
    """The agent program's binds (the launchers, openai's packages), its variables (the
    session's token among them) and the harness's files stay with the agent's sandbox: the
    verifier's fork gets the agent's files and the server's own binds only."""
    task = instance()
    task["files"] = {**task["files"], "tests/test.sh": LOOKS_FOR_THE_HARNESS}
    quiet = await scored(services, tmp_path / "a", "echo 0 > /app/answer.txt", task)
    assert (quiet["state"], quiet["reward"]) == ("done", 0.0), quiet["metrics"]["verifier_output"]
    # Control: a token the program itself writes among its files is found (and judged).
    told = await scored(services, tmp_path / "b", 'echo "$OPENAI_API_KEY" > /app/key.txt', task)
    assert told["reward"] == 1.0 and "/app/key.txt" in told["metrics"]["verifier_output"]


async def test_each_job_of_a_group_gets_the_tasks_service_again(
    services: TaskServices, model_of: Any, tmp_path: Path
) -> None:
    """A group of rollouts of one task runs INIT once and forks its sandbox for each job: a
    fork carries files, not processes, so service-query's service is started again in it."""
    task = shipped("service-query")

    def solves(prompt: str) -> str:
        if "[exit code" in prompt:
            return call("finish", answer="done")
        return call("bash", command=gold(task))

    model = model_of(solves)
    registry = TaskRegistry()
    registry.register(HarnessTask())
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    group_services = served(services, model.llm)
    pipeline = Pipeline(
        registry,
        store,
        PipelineConfig(job_timeout_s=JOB_TIMEOUT_S, cancel_grace_s=1),
        services=group_services,
    )
    await pipeline.start()
    try:
        ids = ["g-0", "g-1"]
        await pipeline.submit(
            [JobRequest.of(harness(task), job_id=i, group="service-query") for i in ids]
        )
        views = [await pipeline.wait(i, JOB_TIMEOUT_S + 60) for i in ids]
    finally:
        await pipeline.stop()
        await group_services.close()
        await store.close()
    for view in views:
        assert view is not None and view.result is not None, view
        result = view.result.model_dump(mode="json")
        assert (result["state"], result["reward"]) == ("done", 1.0), (
            result["error"],
            (result["metrics"] or {}).get("agent_output"),
            (result["metrics"] or {}).get("verifier_output"),
        )


async def test_the_harbor_pages_example_scores_what_its_agent_did(
    services: TaskServices, tmp_path: Path
) -> None:
    """docs/harbor.md's instance, its agent a shell line here: 1 once hello is written, else 0."""
    page = (ROOT / "docs" / "harbor.md").read_text()
    section = page.split("## Running a harness agent on a Harbor task", 1)[1]
    example = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    example.pop("agent")
    wrote = await scored(services, tmp_path / "a", "echo hello > hello.txt", example)
    assert (wrote["state"], wrote["reward"]) == ("done", 1.0), wrote["metrics"]
    idle = await scored(services, tmp_path / "b", "true", example)
    assert (idle["state"], idle["reward"]) == ("done", 0.0), idle["metrics"]


# -- mini-swe-agent, from PyPI, unmodified --------------------------------------------------------

FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.mark.harness_agents
async def test_mini_swe_agent_solves_a_harbor_task(
    services: TaskServices, model_of: Any, tmp_path: Path
) -> None:
    """mini-swe-agent's own `mini` (litellm, its mini.yaml, its bash tool) in the Harbor task's
    image, whose python3 (Debian's 3.11) is the agents environment's minor version."""
    venv = Path(os.environ.get("RAAS_AGENTS_VENV") or ROOT / ".venv-agents")
    if not list(venv.glob("lib/python3.*/site-packages/minisweagent")):
        why = f"no mini-swe-agent in {venv}: `make agents-venv` builds it"
        if tiers.selected("harness_agents"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    command = solve() + " && echo SOLVED-$((6*7))"

    def solves(prompt: str) -> str:
        if "SOLVED-42" in prompt:  # the command's output came back: submit
            return "The answer is written." + call("bash", command=FINISH)
        return "I will sum the numbers." + call("bash", command=command)

    model = model_of(solves)
    agents = AgentSettings(agents_venv=venv)
    job = harness(instance(), agent="mini-swe-agent")
    result = await run_job(tmp_path, job, None, served(services, model.llm, agents))
    metrics = result["metrics"]
    assert (result["state"], result["reward"]) == ("done", 1.0), (
        result["error"],
        metrics.get("agent_output"),
        metrics.get("verifier_output"),
    )
    assert "mini-swe-agent: exit 0, status 'Submitted'" in metrics["agent_output"]
    assert (metrics["gateway_calls"], metrics["gateway_segments"]) == (2, 1)
    assert "Write the sum of the numbers" in model.prompts()[0]
