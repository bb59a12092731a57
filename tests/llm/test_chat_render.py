"""raas's own render path (plain JSON messages straight to the compiled template) against
transformers' ``apply_chat_template``: the same text for every conversation it takes, and the
library's path for anything else."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from raas.llm.chat import render_plain, render_text, with_tools
from raas.llm.models import load_tokenizer

QWEN3 = (Path(__file__).parents[1] / "fixtures" / "qwen3_chat_template.jinja").read_text()
# A template that shows all it is given, keys and their order included, so any difference in
# what the two paths hand a template shows in the text.
PROBE = (
    "{% for m in messages %}{{ m | tojson }}\n{% endfor %}"
    "{{ tools | tojson }} {{ add_generation_prompt }} {{ eos_token }} {{ bos_token }}"
)
TEMPLATES = {"qwen3": QWEN3, "probe": PROBE}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
CALL = {
    "id": "c0",
    "type": "function",
    "function": {"name": "bash", "arguments": {"command": "ls"}},
}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "system and user": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 * 7?"},
    ],
    "no system": [{"role": "user", "content": "hi <|im_end|> there"}],
    "tool turns": [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "The tests fail."},
        {"role": "assistant", "content": "", "tool_calls": [CALL], "name": None},
        {"role": "tool", "tool_call_id": "c0", "name": "bash", "content": "a.py\nb.py"},
        {"role": "assistant", "content": "Fixed.", "reasoning_content": "the off-by-one"},
        {"role": "user", "content": "Thanks, now the docs."},
    ],
    "reasoning by another name": [
        {"role": "user", "content": "Think."},
        {"role": "assistant", "content": "42", "reasoning": "six sevens", "thinking": None},
    ],
    "numbers and nesting": [
        {"role": "user", "content": "x", "meta": {"n": 1, "f": 0.5, "ok": True, "l": [1, None]}},
    ],
}


@pytest.fixture(scope="module", params=["chatml", "qwen3", "probe"])
def tok(request: pytest.FixtureRequest) -> Any:
    tok = load_tokenizer("smollm2")
    if request.param in TEMPLATES:  # templates that render tools (and Qwen3 reasoning) itself
        tok = copy.deepcopy(tok)
        tok.chat_template = TEMPLATES[request.param]
    return tok


def library(tok: Any, messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
    """The full computation: transformers' own path."""
    shown = with_tools(tok, messages, tools)
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation}
    if tools and "tools" in tok.chat_template:
        kwargs["tools"] = tools
    return str(tok.apply_chat_template(shown, **kwargs))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no tools", "tools"])
@pytest.mark.parametrize("generation", [False, True], ids=["closed", "generation prompt"])
def test_the_plain_path_renders_what_transformers_renders(
    tok: Any, name: str, tools: Any, generation: bool
) -> None:
    messages = CONVERSATIONS[name]
    before = copy.deepcopy(messages)
    shown = tools if tools and "tools" in tok.chat_template else None
    plain = render_plain(tok, with_tools(tok, messages, tools), shown, generation)
    assert plain is not None  # the plain path took it
    assert plain == library(tok, messages, tools, generation)
    assert render_text(tok, messages, tools, generation) == plain
    assert messages == before  # the caller's messages are left as they were


@pytest.mark.parametrize(
    "odd",
    [
        {"role": "user", "content": "x", "meta": ("a", "tuple")},
        {"role": "user", "content": "x", "meta": {1: "a key that is no string"}},
        {"role": "user", "content": type("Sub", (str,), {})("a str subclass")},
    ],
    ids=["tuple", "int key", "str subclass"],
)
def test_anything_else_goes_to_transformers(tok: Any, odd: dict[str, Any]) -> None:
    messages = [{"role": "system", "content": "s"}, odd]
    assert render_plain(tok, messages, None, True) is None
    assert render_text(tok, messages, None, True) == library(tok, messages, None, True)
