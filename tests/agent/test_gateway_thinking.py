"""Thinking models behind the gateway: a chat template that drops earlier reasoning (Qwen3's)
makes a new segment instead of drifting silently; where the template only adds the new messages,
the segment continues."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from raas.agent.gateway import GatewaySession
from raas.llm.chat import encode
from raas.llm.models import load_tokenizer
from raas.llm.openai_chat import render_prompt
from raas.llm.types import Generation, SamplingParams
from raas.wire import Trajectory
from tests.agent.test_gateway import BASH

QWEN3 = (Path(__file__).parents[1] / "fixtures" / "qwen3_chat_template.jinja").read_text()
THOUGHT = "<think>\nTwo and two make four.\n</think>\n\n"


class Scripted:
    """A Generator that answers the scripted texts in order, as their canonical token ids."""

    def __init__(self, tok: Any, answers: list[str]) -> None:
        self.tok, self.answers = tok, answers
        self.prompts: list[list[int]] = []
        self.generated: list[list[int]] = []

    async def generate(self, session: str, prompt: list[int], params: SamplingParams) -> Generation:
        self.prompts.append(prompt)
        ids = encode(self.tok, self.answers.pop(0)) + [self.tok.eos_token_id]
        self.generated.append(ids)
        return Generation(ids, [-0.5] * len(ids), "stop")


@pytest.fixture(scope="module")
def chatml() -> Any:
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def qwen3() -> Any:
    tok = copy.deepcopy(load_tokenizer("tiny"))  # not the shared one: its template is Qwen3's
    tok.chat_template = QWEN3
    return tok


def session_of(tok: Any, answers: list[str]) -> tuple[GatewaySession, Scripted]:
    llm = Scripted(tok, answers)
    return GatewaySession("job", llm, tok, SamplingParams(max_tokens=64), Trajectory()), llm


async def chat(session: GatewaySession, messages: list[Any], **extra: Any) -> dict[str, Any]:
    """One chat completion through the session; the reply message, as the agent sends it back."""
    body = json.dumps({"model": "m", "messages": messages, **extra}).encode()
    headers = {"authorization": f"Bearer {session.token}"}
    status, _, answer = await session.handle("POST", "/v1/chat/completions", headers, body)
    assert status == 200, answer
    message: dict[str, Any] = json.loads(answer)["choices"][0]["message"]
    return {k: v for k, v in message.items() if v is not None}


async def a_second_question(session: GatewaySession) -> list[Any]:
    """Asks, gets the reasoned answer, asks again: the conversation of the second call."""
    messages: list[Any] = [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    reply = await chat(session, messages)
    assert reply["content"] == THOUGHT.strip() + "\n\n4"  # the reasoning goes back as it came
    messages += [reply, {"role": "user", "content": "And 3 + 3?"}]
    await chat(session, messages)
    return messages


async def test_a_template_that_drops_earlier_reasoning_starts_a_new_segment(qwen3: Any) -> None:
    session, llm = session_of(qwen3, [THOUGHT + "4", "<think>\nThree.\n</think>\n\n6"])
    messages = await a_second_question(session)
    first, second = session.segments
    # The second prompt is the template's: the first answer's reasoning is gone from it...
    assert llm.prompts[1] == render_prompt(qwen3, messages, None) == second.prompt_ids
    assert "Two and two" not in qwen3.decode(llm.prompts[1])
    # ...and each segment holds exactly what its model saw and generated: nothing drifted.
    assert first.prompt_ids == llm.prompts[0] and first.response_ids == llm.generated[0]
    assert second.response_ids == llm.generated[1] and second.loss_mask == [1] * len(
        llm.generated[1]
    )
    assert [(t["segment"], t["rewritten"], t["drift"]) for t in session.trajectory.turns] == [
        (0, False, False),
        (1, True, False),
    ]
    metrics = session.metrics()
    assert (metrics["gateway_segments"], metrics["gateway_rewrites"]) == (2, 1)
    assert metrics["gateway_drift"] == 0


async def test_a_template_that_keeps_earlier_reasoning_continues_the_segment(chatml: Any) -> None:
    session, llm = session_of(chatml, [THOUGHT + "4", "<think>\nThree.\n</think>\n\n6"])
    await a_second_question(session)
    (seg,) = session.segments
    kept = [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m]
    assert kept == llm.generated[0] + llm.generated[1]
    assert llm.prompts[1] == seg.prompt_ids + seg.response_ids[: -len(llm.generated[1])]
    assert session.metrics()["gateway_rewrites"] == 0 and session.drift == 0


async def after_a_reasoned_tool_call(session: GatewaySession) -> None:
    messages: list[Any] = [{"role": "user", "content": "How many files?"}]
    reply = await chat(session, messages, tools=[BASH])
    (tc,) = reply["tool_calls"]
    messages += [reply, {"role": "tool", "tool_call_id": tc["id"], "content": "a.py b.py"}]
    await chat(session, messages, tools=[BASH])


async def test_a_tool_result_keeps_the_reasoning_of_its_turn_and_continues(qwen3: Any) -> None:
    # Qwen3 keeps the reasoning of the turns after the latest user message: one segment.
    tool_call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    session, llm = session_of(qwen3, ["<think>\nList them.\n</think>\n\n" + tool_call, "Two."])
    await after_a_reasoned_tool_call(session)
    (seg,) = session.segments
    kept = [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m]
    assert kept == llm.generated[0] + llm.generated[1] and session.drift == 0
    assert "List them." in qwen3.decode(llm.prompts[1])


async def test_where_the_delta_is_exact_the_segment_continues_and_drift_is_counted(
    qwen3: Any,
) -> None:
    # Compact JSON: the template re-renders the call with spaces, so its rendering does not
    # extend the kept tokens; but a tool result leaves the earlier turns as they were, so the
    # delta is exact and the call continues the segment (drift: the model's own tokens differ).
    tool_call = '<tool_call>{"name":"bash","arguments":{"command":"ls"}}</tool_call>'
    session, llm = session_of(qwen3, ["<think>\nList them.\n</think>\n\n" + tool_call, "Two."])
    await after_a_reasoned_tool_call(session)
    (seg,) = session.segments
    assert [(t["drift"], t["rewritten"]) for t in seg.turns] == [(False, False), (True, False)]
    kept = [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m]
    assert kept == llm.generated[0] + llm.generated[1]
    assert llm.prompts[1] == seg.prompt_ids + seg.response_ids[: -len(llm.generated[1])]
