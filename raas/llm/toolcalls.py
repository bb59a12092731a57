"""Finding tool calls in generated text. Hermes/Qwen format now; others plug in by name."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    content: str  # the text around the calls read; a call that could not be read stays in it
    calls: list[ToolCall] = field(default_factory=list)
    # One message per malformed call: raas's loop sends them back to the model as observations,
    # the gateway answers them beside the text (``tool_call_errors``).
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them."""

    BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        out = ParsedOutput(content="")
        kept, end = [], 0  # the text outside the calls read (a malformed one is kept whole)
        for i, match in enumerate(self.BLOCK.finditer(text)):
            read = self._read(match, i + 1)
            if isinstance(read, str):
                out.errors.append(read)
                continue
            out.calls.append(ToolCall(f"call_{uuid.uuid4().hex[:12]}", *read))
            kept.append(text[end : match.start()])
            end = match.end()
        kept.append(text[end:])
        out.content = "".join(kept).strip()
        return out

    def _read(self, match: re.Match[str], n: int) -> tuple[str, dict[str, Any]] | str:
        """The call's name and arguments, or why it cannot be read."""
        body = match.group(1).strip()
        if not match.group(0).endswith("</tool_call>"):
            return f"tool call {n} is not closed with </tool_call>"
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            return f"tool call {n} is not valid JSON ({e.msg} at {e.pos})"
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return f'tool call {n} needs {{"name": ..., "arguments": {{...}}}}'
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return f"tool call {n}: arguments is a string, not JSON"
        if not isinstance(arguments, dict):
            return f"tool call {n}: arguments must be an object"
        return data["name"], arguments


PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser(), "qwen": HermesParser()}


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r} (have: {', '.join(sorted(PARSERS))})"
        ) from None
