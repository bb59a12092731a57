"""Anthropic's Messages API (``POST /v1/messages``) as pydantic models, and its translation to and
from raas's canonical chat (see raas.llm.openai_chat), so that Claude Code or the ``anthropic``
package drives a gateway session as an OpenAI client does: the same rendering, generation,
parsing and recording.

Requests are read leniently, as a compatibility route must (names and shapes are the
``anthropic`` package's, ``anthropic/types/message_create_params.py`` and the block params beside
it): fields raas does not read (``cache_control``, ``metadata``, ``thinking``, ``top_k``...) are
ignored, and so are thinking blocks (no chat template renders an earlier turn's reasoning). A
message's content is a string or a list of ``text``, ``tool_use`` and ``tool_result`` blocks;
any other block (an image, a document, a server tool's) is a 400 naming it. Canonically, a user
message's ``tool_result`` blocks are ``tool`` messages (``Error: `` before the content of one that
``is_error``) and its text blocks, joined by newlines, user messages, in the order sent; an
assistant message's text blocks are its content and its ``tool_use`` blocks its tool calls.

Answers are Anthropic's ``Message`` (``anthropic/types/message.py``), or where the request
streams, the events ``anthropic/lib/streaming/_messages.py`` accumulates into one (the whole
answer at once: raas generates before it answers).
"""

from __future__ import annotations

import json
import uuid
from itertools import groupby
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from raas.llm.openai_chat import ChatOutput
from raas.llm.openai_types import (
    Lenient,
    Message,
    OpenAIError,
    Sampled,
    ToolCallErrors,
    requested,
    tool_call,
)
from raas.llm.types import MaxTokens, SamplingParams, Temperature, TopP

# -- request parts ------------------------------------------------------------------------------

BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


def _block_type(value: Any) -> Any:
    if value in BLOCKS:
        return value
    raise PydanticCustomError(
        "unsupported", "only text, tool_use, tool_result and thinking blocks are supported"
    )


def _texts(value: Any) -> Any:
    """A string, or a list of text blocks, as one string (the blocks joined by newlines)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in value
    ):
        return "\n".join(b["text"] for b in value)
    raise PydanticCustomError("invalid_content", "must be a string or a list of text blocks")


Texts = Annotated[str, BeforeValidator(_texts)]


class Block(Lenient):
    """One content block: ``text``; ``tool_use`` (id, name, input); ``tool_result``
    (tool_use_id, content, is_error); ``thinking`` and ``redacted_thinking`` (ignored)."""

    type: Annotated[str, BeforeValidator(_block_type)]
    text: StrictStr | None = Field(None, validate_default=True)
    id: StrictStr | None = None
    name: StrictStr | None = Field(None, validate_default=True)
    input: dict[str, Any] = {}
    tool_use_id: StrictStr | None = Field(None, validate_default=True)
    content: Texts = ""
    is_error: StrictBool = False

    @field_validator("text", "name", "tool_use_id")
    @classmethod
    def _required(cls, value: str | None, info: ValidationInfo) -> str | None:
        needed_by = {"text": "text", "name": "tool_use", "tool_use_id": "tool_result"}
        if value is None and info.data.get("type") == needed_by[info.field_name or ""]:
            raise PydanticCustomError("missing", "Field required")
        return value

    def result(self) -> Message:
        """A ``tool_result`` block as a canonical tool message."""
        content = f"Error: {self.content}" if self.is_error else self.content
        return {"role": "tool", "content": content, "tool_call_id": self.tool_use_id}


def _blocks(value: Any) -> Any:
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class InputMessage(Lenient):
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[Block], BeforeValidator(_blocks), Field(min_length=1)]

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> InputMessage:
        misplaced = "tool_result" if self.role == "assistant" else "tool_use"
        if any(b.type == misplaced for b in self.content):
            owner = "user" if misplaced == "tool_result" else "assistant"
            raise PydanticCustomError(
                "invalid_content",
                "{kind} blocks belong to {owner} messages",
                {"kind": misplaced, "owner": owner},
            )
        return self

    def canonical(self) -> list[Message]:
        if self.role == "assistant":
            return [self._assistant()]
        # Runs of text blocks, each a message of the role, between tool results, in order.
        said = [b for b in self.content if b.type in ("text", "tool_result")]
        out: list[Message] = []
        for results, run in groupby(said, key=lambda b: b.type == "tool_result"):
            if results:
                out += [b.result() for b in run]
            else:
                out.append({"role": self.role, "content": "\n".join(b.text or "" for b in run)})
        # Thinking blocks alone: still a turn of the role (no template renders no messages).
        return out or [{"role": self.role, "content": ""}]

    def _assistant(self) -> Message:
        texts = [b.text or "" for b in self.content if b.type == "text"]
        msg: Message = {"role": "assistant", "content": "\n".join(texts)}
        calls = [
            tool_call(b.id or "", b.name or "", b.input)
            for b in self.content
            if b.type == "tool_use"
        ]
        if calls:
            msg["tool_calls"] = calls
        return msg


def _custom_only(value: Any) -> Any:
    if value not in (None, "custom"):
        raise PydanticCustomError(
            "unsupported", "only custom tools (name, description, input_schema) are supported"
        )
    return value


class Tool(Lenient):
    type: Annotated[Literal["custom"] | None, BeforeValidator(_custom_only)] = None
    name: StrictStr
    description: str | None = None
    input_schema: dict[str, Any]

    def spec(self) -> dict[str, Any]:
        """In Chat Completions' shape, as the chat template takes it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.input_schema
        return {"type": "function", "function": function}


class ToolChoice(Lenient):
    """``none`` hides the tools; ``any`` and a named ``tool`` show them, sampling unconstrained."""

    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = Field(None, validate_default=True)

    @field_validator("name")
    @classmethod
    def _named(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("type") == "tool":
            raise PydanticCustomError("missing", "Field required")
        return value


# -- the requests -------------------------------------------------------------------------------


class CountTokensRequest(Lenient):
    """``POST /v1/messages/count_tokens``: the conversation and tools of a message request."""

    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    system: Texts | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None

    def conversation(self) -> list[Message]:
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        return [*system, *(c for m in self.messages for c in m.canonical())]

    def shown_tools(self) -> list[dict[str, Any]] | None:
        hidden = self.tool_choice is not None and self.tool_choice.type == "none"
        return None if not self.tools or hidden else [t.spec() for t in self.tools]


class MessagesRequest(CountTokensRequest, Sampled):
    """``POST /v1/messages``: what raas reads of it (max tokens capped at the job's)."""

    SENT: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "max_tokens", "stop_sequences")

    max_tokens: MaxTokens
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    stream: StrictBool | None = None

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        return requested(defaults, self.max_tokens, temperature=self.temperature, top_p=self.top_p)

    @property
    def stops(self) -> list[str]:
        return list(self.stop_sequences or ())


# -- answers ------------------------------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class AnthropicMessage(BaseModel):
    """A Messages API answer."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: Usage
    tool_call_errors: ToolCallErrors = None


class TokensCount(BaseModel):
    """A count_tokens answer: the rendered prompt's length."""

    input_tokens: int


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error body."""

    type: Literal["error"]
    error: AnthropicErrorInfo


# Anthropic's error types by status; a server that cannot serve now is its 529 "overloaded".
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
OVERLOADED = 529


def error_answer(err: OpenAIError) -> tuple[int, dict[str, Any]]:
    """A request error as Anthropic answers it: its status (503: 529) and body."""
    status = OVERLOADED if err.status == 503 else err.status
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = AnthropicErrorBody(
        type="error", error=AnthropicErrorInfo(type=kind, message=err.message)
    )
    return status, body.model_dump()


def stop_reason(out: ChatOutput) -> StopReason:
    if out.finish_reason == "length":
        return "max_tokens"
    if out.parsed.calls:
        return "tool_use"
    return "stop_sequence" if out.stop is not None else "end_turn"


def anthropic_message(model: str, out: ChatOutput, prompt_tokens: int) -> AnthropicMessage:
    """A Messages answer for a reply: its text as a block (also when nothing else was said, so
    that the content is never empty), each tool call a ``tool_use`` block."""
    parsed = out.parsed
    content: list[TextBlock | ToolUseBlock] = []
    if parsed.content or not parsed.calls:
        content.append(TextBlock(text=parsed.content))
    content += [ToolUseBlock(id=c.id, name=c.name, input=c.arguments) for c in parsed.calls]
    reason = stop_reason(out)
    return AnthropicMessage(
        id=f"msg_{uuid.uuid4().hex}",
        model=model,
        content=content,
        stop_reason=reason,
        stop_sequence=out.stop if reason == "stop_sequence" else None,
        usage=Usage(input_tokens=prompt_tokens, output_tokens=len(out.ids)),
        tool_call_errors=parsed.errors,
    )


def sse_events(message: AnthropicMessage) -> bytes:
    """A finished message as the Messages API's event stream: message_start (no content yet),
    each block's start, one delta (its text, or its input as JSON) and stop, then message_delta
    (the stop reason and usage) and message_stop."""
    events: list[dict[str, Any]] = []
    start = message.model_dump()
    start.update(content=[], stop_reason=None, stop_sequence=None)
    start["usage"]["output_tokens"] = 0
    events.append({"type": "message_start", "message": start})
    for i, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            opened: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block.text}
        else:
            opened = {**block.model_dump(), "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.input)}
        events.append({"type": "content_block_start", "index": i, "content_block": opened})
        events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message.stop_reason, "stop_sequence": message.stop_sequence},
            "usage": message.usage.model_dump(),
        }
    )
    events.append({"type": "message_stop"})
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def messages_answer(
    request: MessagesRequest, model: str, out: ChatOutput, prompt_tokens: int
) -> tuple[str, bytes]:
    """The answer to ``request``: its content type and body, a message (JSON) or, where the
    request streams, that message as the Messages API's event stream."""
    message = anthropic_message(model, out, prompt_tokens)
    if request.stream:
        return "text/event-stream", sse_events(message)
    return "application/json", message.model_dump_json().encode()
