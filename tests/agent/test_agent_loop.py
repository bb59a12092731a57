"""The agent loop with a scripted policy, the real tokenizer and a real sandbox."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from raas.agent.loop import AgentLoop, LoopConfig, LoopParams
from raas.agent.tools import select_tools
from raas.llm.chat import encode
from raas.llm.models import load_tokenizer
from raas.llm.types import Generation, NoBackendAvailable, SamplingParams
from raas.sandbox import BwrapConfig, Sandbox, create_sandbox
from raas.tasks.protocol import InvalidInstance, parse_params
from raas.wire import Trajectory


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class Scripted:
    """A 'policy' that answers each turn with the next scripted text (end token included)."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tok = tokenizer
        self.turns = list(turns)
        self.prompts: list[list[int]] = []
        # Each turn's token versions from a backend that reports them: turn i's tokens before
        # ``switch[i]`` get version ``versions[i]``, the rest the next version (no entry: none).
        self.versions: list[int] = []
        self.switch: list[int] = []

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        text = self.turns.pop(0) if self.turns else "I am done."
        ids = [*encode(self.tok, text), self.tok.eos_token_id]
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"  # as a server stops at the limit
        versions = None
        turn = len(self.prompts) - 1
        if turn < len(self.versions):
            at, v = self.switch[turn], self.versions[turn]
            versions = [v if i < at else v + 1 for i in range(len(ids))]
        return Generation(
            ids, [-0.25] * len(ids), finish, backend="scripted", policy_versions=versions
        )


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("smollm2")


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with create_sandbox(BwrapConfig()) as sb:
        yield sb


def start() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "Go."}]


async def run(
    tok: Any, sandbox: Sandbox, turns: list[str], **cfg: Any
) -> tuple[Trajectory, Any, Scripted]:
    policy = Scripted(tok, turns)
    tools = select_tools(["bash", "editor", "finish", "think"])
    loop = AgentLoop(policy, tok, tools, sandbox, LoopConfig(**cfg))
    traj = Trajectory()
    result = await loop.run("job", start(), traj)
    return traj, result, policy


async def test_parallel_calls_run_in_order_and_finish_ends(tok: Any, sandbox: Sandbox) -> None:
    turns = [
        call("bash", command="echo one > /workspace/f") + call("bash", command="cat /workspace/f"),
        call("think", thought="looks right") + call("finish", answer="one"),
    ]
    traj, result, policy = await run(tok, sandbox, turns)
    assert (result.stop_reason, result.answer) == ("finish", "one")
    tool_messages = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["[exit code 0]", "one\n[exit code 0]"]
    ids = [c["id"] for c in traj.turns[0]["tool_calls"]]
    assert [m["tool_call_id"] for m in tool_messages] == ids
    # No drift: every prompt the policy saw is a prefix; the end is the last prompt + output.
    for prompt in policy.prompts:
        assert traj.prompt_ids + traj.response_ids[: len(prompt) - len(traj.prompt_ids)] == prompt
    last = [*encode(tok, turns[-1]), tok.eos_token_id]
    assert traj.prompt_ids + traj.response_ids == policy.prompts[-1] + last
    assert traj.invariant_error() is None
    assert sum(traj.loss_mask) == sum(len(encode(tok, t)) + 1 for t in turns)


async def test_each_turn_records_the_policy_versions_of_its_tokens(
    tok: Any, sandbox: Sandbox
) -> None:
    """One version for a turn whose tokens all came from one policy, one a token where an
    update landed mid-generation, and null where the backend said nothing."""
    turns = [call("think", thought="a"), call("think", thought="b"), call("finish", answer="c")]
    policy = Scripted(tok, turns)
    policy.versions, policy.switch = [3, 4], [10**6, 2]  # turn 1 changes after 2 tokens
    loop = AgentLoop(policy, tok, select_tools(["think", "finish"]), sandbox, LoopConfig())
    traj = Trajectory()
    await loop.run("job", start(), traj)
    first, second, third = traj.turns
    assert first["policy_version"] == 3 and "policy_versions" not in first
    n = second["output_tokens"]
    assert second["policy_versions"] == [4, 4] + [5] * (n - 2) and "policy_version" not in second
    assert third["policy_version"] is None  # a backend that says nothing of its weights
    assert traj.policy_version_range() == (3, 5)
    # Token by token (the dashboard's token view, the export): the generated tokens carry
    # their turn's versions in order, the inserted ones (observations) none.
    per_token = traj.token_policy_versions()
    assert per_token is not None and len(per_token) == len(traj.response_ids)
    generated = [v for v, m in zip(per_token, traj.loss_mask, strict=True) if m == 1]
    counts = [t["output_tokens"] for t in traj.turns]
    assert generated == [3] * counts[0] + second["policy_versions"] + [None] * counts[2]
    assert all(v is None for v, m in zip(per_token, traj.loss_mask, strict=True) if m == 0)


async def test_format_errors_go_back_to_the_model(tok: Any, sandbox: Sandbox) -> None:
    turns = ["<tool_call>{broken</tool_call>", call("finish", answer="x")]
    traj, result, _ = await run(tok, sandbox, turns)
    assert result.stop_reason == "finish"
    assert traj.messages[3]["content"].startswith("Format error: tool call 1 is not valid JSON")
    assert [t["malformed_tool_calls"] for t in traj.turns] == [1, 0]
    assert traj.malformed_tool_calls() == 1


async def test_the_loop_guard_stops_repeated_actions(tok: Any, sandbox: Sandbox) -> None:
    _traj, result, policy = await run(
        tok, sandbox, [call("bash", command="ls")] * 10, repeat_limit=3
    )
    assert result.stop_reason == "loop" and len(policy.prompts) == 3


async def test_plain_text_ends_the_loop_and_a_reply_cut_at_max_tokens_says_length(
    tok: Any, sandbox: Sandbox
) -> None:
    answer = "The answer is 42, because six times seven is forty-two."
    _traj, plain, _ = await run(tok, sandbox, [answer], max_tokens=64)
    assert plain.stop_reason == "no_tool_call"
    traj, cut, _ = await run(tok, sandbox, [answer], max_tokens=5)
    assert cut.stop_reason == traj.stop_reason == "length"
    assert traj.turns[0]["finish_reason"] == "length" and len(traj.response_ids) == 5


async def test_turn_and_context_limits(tok: Any, sandbox: Sandbox) -> None:
    steps = [call("bash", command=f"echo {i}") for i in range(10)]
    traj, result, policy = await run(tok, sandbox, steps, max_turns=2)
    assert result.stop_reason == "max_turns" and len(policy.prompts) == 2
    assert traj.invariant_error() is None
    limit = len(policy.prompts[0]) + 40
    traj, result, _ = await run(tok, sandbox, steps, max_context_tokens=limit)
    assert result.stop_reason == "max_context" and traj.invariant_error() is None
    assert len(traj.ids) < limit


async def test_unknown_tools_and_bad_arguments_are_observations(tok: Any, sandbox: Sandbox) -> None:
    turns = [call("rm_rf", path="/"), call("editor", command="view"), call("finish")]
    traj, result, _ = await run(tok, sandbox, turns)
    tool_messages = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_messages[0].startswith("Error: there is no tool 'rm_rf'")
    assert tool_messages[1].startswith("Error: editor needs path")
    assert result.stop_reason == "finish"


def config(params: dict[str, Any], **defaults: Any) -> LoopConfig:
    """What an agent task makes of a request's sampling_params."""
    return LoopConfig.of(parse_params(LoopParams, params, "the loop", **defaults))


def test_sampling_params_reach_the_config_and_unknown_keys_are_errors() -> None:
    cfg = config({"temperature": 0.3, "max_turns": 4, "max_tokens": 64, "seed": 1})
    assert (cfg.max_turns, cfg.max_tokens, cfg.sampling.temperature, cfg.sampling.seed) == (
        4,
        64,
        0.3,
        1,
    )
    with pytest.raises(InvalidInstance) as exc:
        config({"temprature": 0.3})
    assert (exc.value.loc, exc.value.kind) == (("sampling_params", "temprature"), "extra_forbidden")
    # Bounds and real ints: no float, bool or out-of-range value reaches a backend.
    for bad in ({"max_turns": 2.5}, {"seed": -1}, {"seed": 2**63}, {"top_p": 0}, {"top_k": True}):
        with pytest.raises(InvalidInstance):
            config(bad)
    # null keeps the default, as trainers send it
    assert config({"seed": None, "max_turns": None}, max_turns=6).max_turns == 6


async def test_a_loop_that_fails_before_a_turn_says_no_stop_reason(
    tok: Any, sandbox: Sandbox
) -> None:
    class Down:
        async def generate(self, *args: Any) -> Generation:
            raise NoBackendAvailable("every LLM backend is down")

    loop = AgentLoop(Down(), tok, select_tools(["finish"]), sandbox, LoopConfig())
    traj = Trajectory()
    with pytest.raises(NoBackendAvailable):
        await loop.run("job", start(), traj)
    assert traj.stop_reason is None and traj.turns == []  # not "max_turns": none was taken


async def test_only_calls_that_touch_the_sandbox_wait_for_a_checkpoints_read(
    tok: Any, sandbox: Sandbox
) -> None:
    waited: list[int] = []  # the turn numbers (done so far) at which the tools waited
    turns_done = [0]

    async def after_turn(turns: int, trajectory: Trajectory) -> None:
        turns_done[0] = turns

    async def before_tools() -> None:
        waited.append(turns_done[0])

    turns = [
        call("think", thought="plan"),  # turn 0: thinks only (nothing to wait for)
        call("bash", command="echo x > /workspace/f"),  # turn 1: the sandbox
        call("think", thought="ok") + call("editor", command="view", path="/workspace/f"),
        call("finish", answer="done"),  # turn 3
    ]
    policy = Scripted(tok, turns)
    tools = select_tools(["bash", "editor", "finish", "think"])
    loop = AgentLoop(
        policy, tok, tools, sandbox, LoopConfig(), after_turn=after_turn, before_tools=before_tools
    )
    result = await loop.run("job", start(), Trajectory())
    assert result.stop_reason == "finish"
    assert waited == [1, 2]  # turns 1 and 2 (bash; think with the editor), not 0 or 3
