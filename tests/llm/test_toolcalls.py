from __future__ import annotations

import pytest

from raas.llm.toolcalls import HermesParser, get_parser


def test_parses_several_calls_and_keeps_the_text() -> None:
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>{"name": "finish", "arguments": "{\\"answer\\": \\"42\\"}"}</tool_call>'
    )
    out = HermesParser().parse(text)
    assert out.content == "Let me look."
    assert [(c.name, c.arguments) for c in out.calls] == [
        ("bash", {"command": "ls"}),
        ("finish", {"answer": "42"}),
    ]
    assert len({c.id for c in out.calls}) == 2 and not out.errors


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{not json}</tool_call>", "is not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "x", "arguments": {}}', "not closed"),
    ],
)
def test_malformed_calls_become_errors_not_exceptions(text: str, error: str) -> None:
    out = HermesParser().parse(text)
    assert out.calls == [] and len(out.errors) == 1 and error in out.errors[0]
    assert out.content == text  # the call it could not read stays in the text, as written


def test_only_the_calls_read_leave_the_text() -> None:
    good = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    out = HermesParser().parse(f"Two calls.\n{good}\n<tool_call>{{oops</tool_call>")
    assert [c.name for c in out.calls] == ["ls"] and len(out.errors) == 1
    assert out.content == "Two calls.\n\n<tool_call>{oops</tool_call>"


def test_parsers_by_name() -> None:
    assert isinstance(get_parser("qwen"), HermesParser)
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        get_parser("xml")
