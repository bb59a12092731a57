"""Chat rendering with the real SmolLM2 tokenizer: deltas, tools, the no-drift invariant."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from raas.llm.chat import (
    _backend,
    encode,
    observation_delta,
    render_text,
    supports_tools,
    tools_prompt,
    turn_delta,
)
from raas.llm.models import load_tokenizer
from raas.wire import Trajectory

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
    traj = Trajectory(prompt_ids=encode(tok, render_text(tok, messages, TOOLS, True)))
    outputs = [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
        "Done: a.py and b.py.",
    ]
    for i, text in enumerate(outputs):
        traj.next_prompt()
        generated = encode(tok, text) + [tok.eos_token_id]  # what a model emits, end included
        traj.add_generated(generated, [-0.5] * len(generated))
        messages.append({"role": "assistant", "content": text})
        if i == 0:
            observation = [{"role": "tool", "content": "a.py\nb.py"}]
            traj.add_inserted(observation_delta(tok, observation))
            messages += observation
    assert traj.invariant_error() is None
    # Token for token what the template renders for the whole conversation.
    whole = render_text(tok, messages, TOOLS)
    assert tok.decode(traj.ids) == whole.removesuffix("\n")
    assert traj.loss_mask.count(1) == sum(len(encode(tok, t)) + 1 for t in outputs)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 0)


def test_a_turn_cut_short_is_closed_with_the_end_of_turn_token(tok: Any) -> None:
    observation = [{"role": "tool", "content": "ok"}]
    delta = observation_delta(tok, observation)
    eos = tok.eos_token_id
    assert turn_delta(tok, [5, 6, eos], observation) == delta  # the model closed it itself
    assert turn_delta(tok, [5, 6], observation) == [eos, *delta]  # cut at max_tokens or a stop
    assert turn_delta(tok, [], observation) == [eos, *delta]


def test_the_invariant_catches_drift() -> None:
    traj = Trajectory(prompt_ids=[1, 2, 3])
    traj.next_prompt()
    traj.add_generated([4, 5], [-1.0, -1.0])
    assert traj.invariant_error() is None
    traj.prompt_ids[1] = 99  # something re-tokenized an earlier turn
    assert traj.invariant_error() == (
        "prompt 0 given to the model is not a prefix of the trajectory's ids"
    )
    traj.next_prompt()  # a later prompt that holds the change does not hide it
    traj.add_generated([6], [-1.0])
    assert traj.invariant_error() == (
        "prompt 0 given to the model is not a prefix of the trajectory's ids"
    )
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        traj.add_generated([1, 2], [0.0])


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("loss_mask", [1, 1, 1], "2 response_ids but 3 loss_mask and 2 logprobs"),
        ("loss_mask", [1, 2], "loss_mask holds values other than 0 and 1"),
        ("logprobs", [-1.0, float("-inf")], "logprobs holds values that are not finite numbers"),
        ("logprobs", [-1.0, float("nan")], "logprobs holds values that are not finite numbers"),
    ],
)
def test_the_invariant_catches_what_a_trainer_cannot_use(
    field: str, value: list[Any], reason: str
) -> None:
    traj = Trajectory(prompt_ids=[1, 2, 3])
    traj.next_prompt()
    traj.add_generated([4, 5], [-1.0, -1.0])
    setattr(traj, field, value)
    assert traj.invariant_error() == reason


TEXTS = [
    "",
    "plain words, and   runs of  spaces\n\n\ttabs",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",  # special tokens in the text
    "an emoji 🤖, accents: café naïve, and CJK: 训练",
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>',
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_gives_the_tokenizers_own_ids(text: str) -> None:
    tok = copy.deepcopy(load_tokenizer("smollm2"))  # (its settings are changed below)
    assert _backend(tok) is not None  # the fast way is taken
    assert encode(tok, text) == tok.encode(text, add_special_tokens=False)
    tok.split_special_tokens = True  # special tokens in a text read as plain text
    assert _backend(tok) is None
    assert encode(tok, text) == tok.encode(text, add_special_tokens=False)
    tok.split_special_tokens = False
    tok.backend_tokenizer.encode_special_tokens = False  # (transformers' encode set it)
    assert _backend(tok) is not None
    tok.backend_tokenizer.enable_truncation(max_length=3)  # left on by someone
    assert _backend(tok) is None
    assert encode(tok, text) == tok.encode(text, add_special_tokens=False)


def test_a_tokenizer_of_another_kind_encodes_its_own_way() -> None:
    tok = load_tokenizer("smollm2")

    class Wrapped:
        def __init__(self) -> None:
            self._tokenizer = tok.backend_tokenizer  # not transformers' class: not used

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [7]

    assert encode(Wrapped(), "hello") == [7]
