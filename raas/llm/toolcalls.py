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
    content: str  # the text around the calls
    calls: list[ToolCall] = field(default_factory=list)
    # One message per malformed call: they go back to the model as an observation.
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...


class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them."""

    BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        out = ParsedOutput(content=self.BLOCK.sub("", text).strip())
        for i, match in enumerate(self.BLOCK.finditer(text)):
            body = match.group(1).strip()
            if not match.group(0).endswith("</tool_call>"):
                out.errors.append(f"tool call {i + 1} is not closed with </tool_call>")
                continue
            try:
                data = json.loads(body)
            except json.JSONDecodeError as e:
                out.errors.append(f"tool call {i + 1} is not valid JSON ({e.msg} at {e.pos})")
                continue
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                out.errors.append(f'tool call {i + 1} needs {{"name": ..., "arguments": {{...}}}}')
                continue
            arguments = data.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    out.errors.append(f"tool call {i + 1}: arguments is a string, not JSON")
                    continue
            if not isinstance(arguments, dict):
                out.errors.append(f"tool call {i + 1}: arguments must be an object")
                continue
            out.calls.append(ToolCall(f"call_{uuid.uuid4().hex[:12]}", data["name"], arguments))
        return out


PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser(), "qwen": HermesParser()}


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r} (have: {', '.join(sorted(PARSERS))})"
        ) from None
