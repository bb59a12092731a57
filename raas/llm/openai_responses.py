"""OpenAI's Responses API (``POST /v1/responses``) as pydantic models, and its translation to and
from raas's canonical chat (see raas.llm.openai_chat), so that Codex CLI or the ``openai``
package's ``responses`` drive a gateway session as a chat completions client does: the same
rendering, generation, parsing and recording.

Requests are read leniently, from the same parts as chat completions' (raas.llm.openai_types;
names and shapes are the ``openai`` package's, ``openai/types/responses/response_create_params.py``
and the items beside it, and what Codex CLI 0.169 sends). ``input`` is a string or a list of
items: ``message`` (a role and text parts: ``input_text``, ``output_text``), ``function_call``,
``function_call_output`` and ``reasoning`` (accepted and left out: no chat template renders an
earlier turn's reasoning); any other item, or a part that is not text, is a 400 naming it.
``tools`` are ``function`` tools and ``namespace`` tools of them (Codex's sub-agent tools: shown
by their own names; a call to one names its namespace, as OpenAI's does); OpenAI's hosted tools
(``web_search``, ``file_search``, ``code_interpreter``, ``image_generation``,
``computer_use_preview``, ``mcp``) are ignored, since no server of raas's runs them and the
model is simply not shown them; any other (``custom``, ``local_shell``...) is a 400 naming it.
The conversation is stateless: ``previous_response_id`` and ``conversation`` are refused (400),
the whole conversation comes in ``input`` (as Codex sends it, ``store: false``).
``parallel_tool_calls`` and ``tool_choice`` are echoed (sampling is never constrained by them);
``include``, ``reasoning``, ``text``, ``store``, ``prompt_cache_key``, ``client_metadata`` and
the rest are ignored.

Answers are the ``Response`` of ``openai/types/responses/response.py``, or where the request
streams, the events of ``response_stream_event.py`` that the SDK's ``responses.stream()``
accumulates into one, each with its ``sequence_number``; the whole answer at once, since raas
generates before it answers.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from raas.llm.openai_chat import ChatOutput
from raas.llm.openai_types import (
    Arguments,
    Content,
    Lenient,
    Message,
    OpenAIRequest,
    ToolCallErrors,
    custom_error,
    shown,
    tool_call,
)
from raas.llm.types import MaxTokens, SamplingParams

# -- request parts ------------------------------------------------------------------------------

# OpenAI's hosted tools (dated variants included): run by OpenAI's servers, never by the agent.
HOSTED_TOOL = re.compile(
    r"(web_search(_preview)?|file_search|code_interpreter|image_generation|computer_use_preview"
    r"|mcp)(_\d{4}_\d{2}_\d{2})?"
)


def _tool_type(value: Any) -> Any:
    if value in ("function", "namespace") or (
        isinstance(value, str) and HOSTED_TOOL.fullmatch(value)
    ):
        return value
    raise custom_error(
        "unsupported",
        'only "function" tools and namespaces of them are supported (hosted tools are ignored)',
    )


class ResponsesTool(Lenient):
    """A Responses API tool: a function (flat: type, name, description, parameters), a
    namespace of functions (its ``tools``), or a hosted tool, which the model is not shown."""

    type: Annotated[str, BeforeValidator(_tool_type)]
    name: StrictStr | None = Field(None, validate_default=True)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    tools: list[ResponsesTool] | None = None  # a namespace's

    @field_validator("name")
    @classmethod
    def _named(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("type") in ("function", "namespace"):
            raise custom_error("missing", "Field required")
        return value

    def functions(self) -> list[ResponsesTool]:
        """The function tools this tool is: itself, a namespace's own, or none."""
        if self.type == "namespace":
            return [f for t in self.tools or () for f in t.functions()]
        return [self] if self.type == "function" else []

    def spec(self) -> dict[str, Any]:
        """A function tool in Chat Completions' shape, as the chat template takes it."""
        keys = {"name", "description", "parameters"}
        return {"type": "function", "function": self.model_dump(include=keys, exclude_unset=True)}


ItemType = Literal["message", "function_call", "function_call_output", "reasoning"]
# The fields each item type must carry (OpenAI's, which its clients always send).
REQUIRED: dict[str, tuple[ItemType, ...]] = {
    "role": ("message",),
    "name": ("function_call",),
    "call_id": ("function_call", "function_call_output"),
}


class InputItem(Lenient):
    """One item of a Responses API ``input``: a message, a function call, its output, or the
    model's reasoning (which no chat template renders, so it is left out)."""

    type: ItemType = "message"
    role: Literal["system", "developer", "user", "assistant"] | None = Field(
        None, validate_default=True
    )
    content: Content = []
    name: StrictStr | None = Field(None, validate_default=True)
    arguments: Arguments = {}
    call_id: StrictStr | None = Field(None, validate_default=True)
    output: Content = []

    @field_validator("role", "name", "call_id")
    @classmethod
    def _required(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and info.data.get("type") in REQUIRED[info.field_name or ""]:
            raise custom_error("missing", "Field required")
        return value


def _input(value: Any) -> Any:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return value
    raise custom_error("invalid_input", "must be a string or a non-empty list of items")


def _stateless(value: Any) -> Any:
    if value is not None:
        raise custom_error(
            "unsupported", "not supported (raas keeps no responses): send the whole conversation"
        )
    return value


Stateless = Annotated[None, BeforeValidator(_stateless)]


class ResponsesRequest(OpenAIRequest):
    """``POST /v1/responses``: what raas reads of it (the whole conversation in ``input``)."""

    input: Annotated[list[InputItem], BeforeValidator(_input), Field(min_length=1)]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    max_output_tokens: MaxTokens | None = None
    parallel_tool_calls: StrictBool | None = None
    stream: StrictBool | None = None
    store: StrictBool | None = None
    include: list[str] | None = None
    previous_response_id: Stateless = None
    # Named apart from conversation(), which every request of the gateway answers.
    stored_conversation: Stateless = Field(None, alias="conversation")

    def conversation(self) -> list[Message]:
        """The canonical conversation: the instructions as a system message, then the items (a
        function call joins the assistant message before it, as a chat turn holds its calls)."""
        messages: list[Message] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        for item in self.input:
            if item.type == "message":
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role, "content": "".join(item.content)})
            elif item.type == "function_call":
                call = tool_call(item.call_id or "", item.name or "", item.arguments)
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif item.type == "function_call_output":
                content = "".join(item.output)
                messages.append({"role": "tool", "content": content, "tool_call_id": item.call_id})
        return messages

    def shown_tools(self) -> list[dict[str, Any]] | None:
        """The function tools, a namespace's among them (by their own names), as the chat
        template takes them."""
        return shown([f.spec() for t in self.tools or () for f in t.functions()], self.tool_choice)

    def namespace_of(self, name: str) -> str | None:
        """The namespace whose function ``name`` is, if any (a call to it names it)."""
        for tool in self.tools or ():
            if tool.type == "namespace" and any(f.name == name for f in tool.functions()):
                return tool.name
        return None

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        return self._sampling(defaults, self.max_output_tokens)


# -- answers ------------------------------------------------------------------------------------

Status = Literal["completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Status = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text
    namespace: str | None = None  # the namespace tool the function is one of
    status: Literal["completed"] = "completed"


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # raas's backends report none (OpenAI's clients require it)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class ResponseObject(BaseModel):
    """A Responses API answer."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    incomplete_details: IncompleteDetails | None = None
    error: None = None
    model: str
    instructions: str | None
    output: list[OutputMessage | OutputFunctionCall]
    parallel_tool_calls: bool = True
    tool_choice: Any
    tools: list[dict[str, Any]]
    temperature: float
    top_p: float
    max_output_tokens: int | None
    metadata: dict[str, str] = {}
    usage: ResponseUsage
    tool_call_errors: ToolCallErrors = None


def response_object(
    request: ResponsesRequest,
    model: str,
    out: ChatOutput,
    params: SamplingParams,
    prompt_tokens: int,
    cached_tokens: int = 0,
) -> ResponseObject:
    """A Responses API answer for a reply: its text as a message, each tool call an item; cut
    short by max tokens (and no call read), ``incomplete``."""
    parsed = out.parsed
    incomplete = out.finish_reason == "length" and not parsed.calls
    status: Status = "incomplete" if incomplete else "completed"
    output: list[OutputMessage | OutputFunctionCall] = []
    if parsed.content or not parsed.calls:
        text = OutputText(text=parsed.content)
        output.append(OutputMessage(id=f"msg_{uuid.uuid4().hex}", status=status, content=[text]))
    for c in parsed.calls:
        output.append(
            OutputFunctionCall(
                id=f"fc_{uuid.uuid4().hex}",
                call_id=c.id,
                name=c.name,
                arguments=json.dumps(c.arguments),
                namespace=request.namespace_of(c.name),
            )
        )
    return ResponseObject(
        id=f"resp_{uuid.uuid4().hex}",
        created_at=int(time.time()),
        status=status,
        incomplete_details=IncompleteDetails() if incomplete else None,
        model=model,
        instructions=request.instructions,
        output=output,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        tool_choice=request.tool_choice or "auto",
        tools=[t.model_dump(exclude_unset=True) for t in request.tools or ()],
        temperature=params.temperature,
        top_p=params.top_p,
        max_output_tokens=request.max_output_tokens,
        usage=ResponseUsage(
            input_tokens=prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
            output_tokens=len(out.ids),
            total_tokens=prompt_tokens + len(out.ids),
        ),
        tool_call_errors=parsed.errors,
    )


Event = dict[str, Any]


def _item_events(index: int, item: dict[str, Any]) -> list[Event]:
    """One output item's events: added (in progress, empty), its content or arguments, done."""
    at = {"output_index": index}
    ref = {"item_id": item["id"], **at}
    opened = {**item, "status": "in_progress"}
    middle: list[Event]
    if item["type"] == "function_call":
        opened["arguments"] = ""
        args = item["arguments"]
        middle = [
            {"type": "response.function_call_arguments.delta", **ref, "delta": args},
            {"type": "response.function_call_arguments.done", **ref, "arguments": args},
        ]
    else:
        opened["content"] = []
        middle = []
        for i, part in enumerate(item["content"]):
            on = {**ref, "content_index": i}
            text = part["text"]
            middle += [
                {"type": "response.content_part.added", **on, "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **on, "delta": text, "logprobs": []},
                {"type": "response.output_text.done", **on, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **on, "part": part},
            ]
    return [
        {"type": "response.output_item.added", **at, "item": opened},
        *middle,
        {"type": "response.output_item.done", **at, "item": item},
    ]


def sse_events(response: ResponseObject) -> bytes:
    """A finished response as the Responses API's event stream: response.created and
    response.in_progress (in progress, no output, no usage yet), each output item's events,
    then response.completed (or response.incomplete, as OpenAI ends a response cut short)."""
    final = response.model_dump()
    snapshot = {**final, "status": "in_progress", "incomplete_details": None}
    snapshot.update(output=[], usage=None)
    events: list[Event] = [
        {"type": "response.created", "response": snapshot},
        {"type": "response.in_progress", "response": snapshot},
    ]
    for index, item in enumerate(final["output"]):
        events += _item_events(index, item)
    events.append({"type": f"response.{response.status}", "response": final})
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n"
        for n, e in enumerate(events)
    ).encode()


def responses_answer(response: ResponseObject, stream: bool) -> tuple[str, bytes]:
    """The answer to a request: its content type and body, ``response`` (JSON) or, where the
    request streams, that response as the Responses API's event stream."""
    if stream:
        return "text/event-stream", sse_events(response)
    return "application/json", response.model_dump_json().encode()
