"""Agent frameworks from PyPI and npm as harness agents: mini-swe-agent, Qwen Code, Pi,
OpenCode, Claude Code, Gemini CLI and Codex, unmodified, in a bwrap sandbox, each through the API
it speaks (chat completions, Anthropic's Messages, Gemini's, OpenAI's Responses).

Needs the agents environments (``make agents-venv`` builds .venv-agents, ``make agents-node``
.agents-node; ``RAAS_AGENTS_VENV`` and ``RAAS_AGENTS_NODE`` point elsewhere); ``make
test-harness-agents`` builds them and runs these tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from raas.llm.models import load_tokenizer
from raas.llm.pool import BackendPool
from raas.sandbox import BwrapConfig, SandboxLimits
from raas.sandbox.pydeps import staged_binds
from raas.settings import AgentSettings
from raas.tasks.datasets import bundled
from raas.tasks.harness import AGENTS_DIR, AGENTS_INSIDE
from raas.tasks.harness_node import NODE_AGENTS, NODE_MODULES_INSIDE, node_environment
from raas.tasks.services import TaskServices
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call
from tests.tasks.test_harness import run_job

pytestmark = pytest.mark.harness_agents

ROOT = Path(__file__).resolve().parents[2]
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
        llm=llm,
        tokenizer_name="tiny",
        sandbox_config=BwrapConfig(),
        agents=AgentSettings(agents_venv=agents_venv),
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
    for package in NODE_AGENTS.values():
        if not (env / "node_modules" / package / "package.json").is_file():
            pytest.fail(f"no {package} in {env}: `make agents-node` builds it")
    # The first copy of the environment where the sandbox's user can read it (600 MB) can
    # outlast run_job's wait on a loaded machine: made here, once, as INIT makes it.
    node = node_environment(env, "pi")
    staged_binds("openai", {str(AGENTS_DIR): AGENTS_INSIDE, **node.binds()})
    return env


@dataclass(frozen=True)
class NpmAgent:
    """An npm agent's own tools, as its package declares them (names and arguments), and what
    it says: who it is (its system prompt), that an edit was made."""

    whoami: str
    read: Callable[[str], str]  # the call that reads a file
    edit: Callable[[str, str, str], str]  # the call that replaces a line of it
    edited: str  # what the edit tool answers, {path} in it
    shell: Callable[[str], str]  # the call that runs a command
    # Whether it runs under the sandbox's address-space limit a process (RLIMIT_AS, 4 GiB).
    address_space_limit: bool = True


NPM_AGENTS = {
    # @qwen-code/qwen-code 0.15.10, cli.js: ToolNames (read_file, edit, run_shell_command).
    "qwen-code": NpmAgent(
        whoami="You are Qwen Code",
        read=lambda path: call("read_file", file_path=path),
        edit=lambda path, old, new: call("edit", file_path=path, old_string=old, new_string=new),
        edited="The file: {path} has been updated.",
        shell=lambda command: call("run_shell_command", command=command),
    ),
    # @mariozechner/pi-coding-agent 0.73.1, dist/core/tools: read, edit (edits[]), bash.
    "pi": NpmAgent(
        whoami="operating inside pi, a coding agent harness",
        read=lambda path: call("read", path=path),
        edit=lambda path, old, new: call(
            "edit", path=path, edits=[{"oldText": old, "newText": new}]
        ),
        edited="Successfully replaced 1 block(s) in {path}.",
        shell=lambda command: call("bash", command=command),
    ),
    # opencode-ai 1.18.33, its opencode-linux-x64 binary: read, edit, bash (filePath...).
    "opencode": NpmAgent(
        whoami="You are opencode",
        read=lambda path: call("read", filePath=path),
        edit=lambda path, old, new: call("edit", filePath=path, oldString=old, newString=new),
        edited="Edit applied successfully.",
        shell=lambda command: call("bash", command=command),
        # Bun's JavaScriptCore fails now and then under a 4 GiB RLIMIT_AS (SIGILL, SIGABRT, a
        # hang: 3 runs of 11 here), never without it (11 of 11); the sandbox's cgroup caps it.
        address_space_limit=False,
    ),
    # @anthropic-ai/claude-code 2.1.332 (Anthropic's Messages API), its sdk-tools.d.ts: Read,
    # Edit, Bash (file_path, old_string, new_string, command).
    "claude-code": NpmAgent(
        whoami="You are a Claude agent",
        read=lambda path: call("Read", file_path=path),
        # It sends an Edit back as its schema parsed it, replace_all first: a call without it
        # would not be the turn the gateway answered, and the next call a segment of its own.
        edit=lambda path, old, new: call(
            "Edit", replace_all=False, file_path=path, old_string=old, new_string=new
        ),
        edited="The file {path} has been updated successfully.",
        shell=lambda command: call("Bash", command=command, description="Run the tests"),
    ),
    # @google/gemini-cli 0.61.0 (Gemini's API), its bundle: read_file, replace (an
    # instruction too), run_shell_command.
    "gemini": NpmAgent(
        whoami="You are Gemini CLI",
        read=lambda path: call("read_file", file_path=path),
        edit=lambda path, old, new: call(
            "replace",
            file_path=path,
            instruction="Compare the indices, not the values.",
            old_string=old,
            new_string=new,
        ),
        edited="Successfully modified file: {path} (1 replacements).",
        shell=lambda command: call("run_shell_command", command=command),
    ),
    # @openai/codex 0.169.0 (the Responses API): exec_command (cmd) for all, a patch through
    # its apply_patch command, which Codex applies itself.
    "codex": NpmAgent(
        whoami="You are a coding agent running in the Codex CLI",
        read=lambda path: call("exec_command", cmd=f"cat {path}"),
        edit=lambda path, old, new: call(
            "exec_command",
            cmd=f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {path}\n@@\n"
            f"-{old}\n+{new}\n*** End Patch\nEOF",
        ),
        edited="Success. Updated the following files:",
        shell=lambda command: call("exec_command", cmd=command),
    ),
}


@pytest.mark.parametrize("name", list(NPM_AGENTS))
async def test_an_npm_agent_fixes_a_bundled_swe_instance_through_the_gateway(
    name: str, tmp_path: Path, agents_node: Path
) -> None:
    """The agent's own CLI (from npm, on the host's node, headless, every tool allowed) in the
    sandbox, through the relay and the job's gateway session, against a vLLM-protocol model
    that answers in that agent's own tool calls: it reads the file, edits it, runs the tests and
    answers; EVAL runs the hidden tests on the diff; its four calls are one segment of exactly
    the model's tokens; nothing of it is left running."""
    agent = NPM_AGENTS[name]
    row = bundled("swe")[0]
    instance = {k: v for k, v in row.items() if k != "gold_patch"}
    [minus] = [line for line in row["gold_patch"].splitlines() if line.startswith("-    ")]
    [plus] = [line for line in row["gold_patch"].splitlines() if line.startswith("+    ")]
    path = "/workspace/repo/" + row["gold_patch"].split("+++ b/")[1].split("\n")[0]
    # PATCHED-42 in the output, not in the command the prompt shows (quotes, not $((6*7)):
    # Gemini CLI refuses a command with a substitution in it).
    tests = "python3 -m unittest 2>&1 | tail -1 && echo PATCHED-4''2"

    def model(prompt: str) -> str:
        if "PATCHED-42" in prompt:  # the tests' output came back: done
            return "The tests pass now."
        if agent.edited.format(path=path) in prompt:
            return "Now the tests." + agent.shell(tests)
        if "has_close_elements(numbers" in prompt:  # the file, read
            old, new = minus[1:], plus[1:]  # whole lines, indented
            return "I will fix the comparison." + agent.edit(path, old, new)
        return "Let me read the file." + agent.read(path)

    backend = AgentBackend(model, logprob=lambda i, token: -((token * 7 + i) % 1000 + 1) / 1000)
    server = ServerThread(backend.app).start()
    llm = BackendPool()
    llm.add(server.url, "vllm", 8)
    limits = SandboxLimits() if agent.address_space_limit else SandboxLimits(memory_bytes=None)
    sandbox_config = BwrapConfig(limits=limits)
    services = TaskServices(
        llm=llm,
        tokenizer_name="tiny",
        sandbox_config=sandbox_config,
        agents=AgentSettings(agents_node=agents_node),
    )
    job = {**instance, "data_source": "harness", "judge": "swe", "agent": name}
    try:
        result = await run_job(tmp_path, job, None, services)
    finally:
        await llm.stop()
        server.stop()
    metrics = result["metrics"]
    assert (result["state"], result["reward"]) == ("done", 1.0), metrics.get("agent_output")
    assert metrics["stop_reason"] == "agent_exit_0"
    assert f"The tests pass now.\n{name}: exit 0" in metrics["agent_output"]
    assert "if idx != idx2:" in metrics["artifact"]["patch"]

    # The agent's own prompt reached the model, and the task in it.
    prompts = [load_tokenizer("tiny").decode(p) for p, _, _ in backend.returned]
    assert agent.whoami in prompts[0]
    assert row["problem_statement"].splitlines()[0] in prompts[0]
    # Its four calls are one segment: exactly the generated tokens and their logprobs.
    turns = result["trajectory"].get("turns") or []
    said = (name, [(t.get("segment"), t.get("rewritten")) for t in turns], metrics["agent_output"])
    assert (metrics["gateway_calls"], metrics["gateway_segments"]) == (4, 1), said
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
    # The sandbox took the agent's processes with it (node, the shells its tool started).
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
