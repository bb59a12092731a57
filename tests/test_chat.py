"""Chat rendering with the real SmolLM2 tokenizer: deltas, tools, the no-drift invariant."""

from __future__ import annotations

from typing import Any

import pytest

from raas.llm.chat import (
    TokenTrajectory,
    encode,
    observation_delta,
    render_text,
    supports_tools,
    tools_prompt,
)
from raas.llm.models import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("smollm2")


def test_delta_after_an_assistant_turn(tok: Any) -> None:
    delta = observation_delta(tok, [{"role": "tool", "content": "ok"}])
    assert tok.decode(delta) == "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"


def test_tools_go_into_the_system_prompt_when_the_template_has_none(tok: Any) -> None:
    assert not supports_tools(tok)
    text = render_text(tok, [{"role": "system", "content": "Be brief."}], TOOLS)
    assert "Be brief." in text and tools_prompt(TOOLS) in text


def test_token_trajectory_equals_the_rendered_conversation(tok: Any) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "List the files."},
    ]
    traj = TokenTrajectory(encode(tok, render_text(tok, messages, TOOLS, True)))
    outputs = [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
        "Done: a.py and b.py.",
    ]
    last: list[int] = []
    for i, text in enumerate(outputs):
        traj.next_prompt()
        last = encode(tok, text) + [tok.eos_token_id]  # what a model emits, end token included
        traj.add_generated(last, [-0.5] * len(last))
        messages.append({"role": "assistant", "content": text})
        if i == 0:
            observation = [{"role": "tool", "content": "a.py\nb.py"}]
            traj.add_inserted(observation_delta(tok, observation))
            messages += observation
    traj.check(last)
    # Token for token what the template renders for the whole conversation.
    whole = render_text(tok, messages, TOOLS)
    assert tok.decode(traj.ids) == whole.removesuffix("\n")
    assert traj.loss_mask.count(1) == sum(len(encode(tok, t)) + 1 for t in outputs)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 0)


def test_the_invariant_catches_drift(tok: Any) -> None:
    traj = TokenTrajectory([1, 2, 3])
    traj.next_prompt()
    traj.add_generated([4, 5], [-1.0, -1.0])
    traj.prompt_ids[1] = 99  # something re-tokenized an earlier turn
    with pytest.raises(AssertionError):
        traj.check([4, 5])
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        traj.add_generated([1, 2], [0.0])
