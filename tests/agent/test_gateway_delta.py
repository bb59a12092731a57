"""A continuing gateway call tokenizes only its new messages: its segment keeps the text of its
latest rendering up to the last end-of-turn token, and the prompt is still exactly the
template's rendering of the whole conversation."""

from __future__ import annotations

import copy
from typing import Any

from raas.llm.chat import encode, split_point
from raas.llm.models import load_tokenizer
from raas.llm.openai_chat import prompt_text, render_prompt
from raas.llm.openai_types import ChatRequest
from tests.agent.test_gateway import BASH
from tests.agent.test_gateway_thinking import chat, session_of

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


class Counting:
    """A tokenizer that records each text it encodes."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.encoded: list[str] = []

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.encoded.append(text)
        return list(self.tok.encode(text, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)


def canonical(messages: list[Any]) -> list[dict[str, Any]]:
    return ChatRequest.model_validate({"messages": messages}).conversation()


async def test_a_continuing_call_tokenizes_only_the_new_messages() -> None:
    tok = Counting(load_tokenizer("tiny"))
    session, llm = session_of(tok, [TOOL_CALL] * 3 + ["Done."])
    messages: list[Any] = [
        {"role": "system", "content": "You are a careful engineer. " * 20},
        {"role": "user", "content": "How many files are there?"},
    ]
    for turn in range(4):
        tok.encoded.clear()
        reply = await chat(session, messages, tools=[BASH])
        # the prompt is the whole conversation's rendering, token for token
        assert llm.prompts[-1] == render_prompt(tok.tok, canonical(messages), [BASH])
        if turn:  # nothing before the latest assistant turn is tokenized again
            whole = prompt_text(tok.tok, canonical(messages), [BASH])
            assert sum(map(len, tok.encoded)) < len(whole) // 3
            assert not any("careful engineer" in text for text in tok.encoded)
        if turn < 3:
            (tc,) = reply["tool_calls"]
            messages += [reply, {"role": "tool", "tool_call_id": tc["id"], "content": "a b"}]
    (seg,) = session.segments
    assert session.drift == 0 and seg.invariant_error() is None
    kept = [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m]
    assert kept == [t for ids in llm.generated for t in ids]


def test_a_rendering_splits_after_its_last_end_of_turn_token() -> None:
    tok = load_tokenizer("tiny")
    text = prompt_text(tok, [{"role": "user", "content": "hi"}], None)
    cut = split_point(tok, text)
    assert cut is not None and text[:cut].endswith(tok.eos_token)
    assert encode(tok, text) == encode(tok, text[:cut]) + encode(tok, text[cut:])
    assert split_point(tok, "no end of turn here") is None
    plain = copy.deepcopy(tok)  # one that reads special tokens in a text as plain text
    plain.split_special_tokens = True
    assert split_point(plain, text) is None
