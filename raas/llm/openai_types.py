"""OpenAI's chat shapes as pydantic models: the one reading of a request for every OpenAI front end
(the gateway, the embedded engine's and the oracle's chat completions), and the answers they send.

Requests are read leniently, as compatibility routes must (field names and shapes are the ``openai``
package's, ``openai/types/chat/completion_create_params.py``; raas.llm.openai_responses reads the
Responses API's from the same parts): a field raas does not read is ignored, a message's content
may be a string, a list of text parts or null, and tool-call arguments a JSON string or an
object. A field raas does read and cannot take is a 400 in OpenAI's error shape whose
``param`` names it (``messages[0].role``). What a request says becomes *canonical* messages:
``role``, ``content`` (a string), and where present ``tool_calls`` ([{id, name, arguments: dict}]),
``tool_call_id`` and ``name`` (see raas.llm.openai_chat).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from raas.llm.types import MaxTokens, SamplingParams, Seed, Temperature, TopP

Message = dict[str, Any]  # a canonical message


def _nothing(value: list[str] | None) -> bool:
    return not value


# raas's own key of an answer (its SDK models keep keys they do not know): why each tool call the
# model wrote could not be read, its markup left in the text; absent where every call was read.
ToolCallErrors = Annotated[
    list[str] | None,
    Field(
        exclude_if=_nothing,
        description="Why each tool call the model wrote could not be read (its markup stays in"
        " the text); absent where every call was read.",
    ),
]


@dataclass
class OpenAIError(Exception):
    """A request error, answered as ``{"error": {"message", "type", "param", "code"}}``."""

    status: int
    message: str
    param: str | None = None
    kind: str = "invalid_request_error"
    code: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        info = OpenAIErrorInfo(
            message=self.message, type=self.kind, param=self.param, code=self.code
        )
        return OpenAIErrorBody(error=info).model_dump()


def bad(param: str, message: str, status: int = 400) -> OpenAIError:
    return OpenAIError(status, f"{param}: {message}", param, code="invalid_value")


RequestT = TypeVar("RequestT", bound=BaseModel)


def read(model: type[RequestT], body: bytes) -> RequestT:
    """A JSON request body (empty: ``{}``) as ``model``, else a 400 naming the first bad field."""
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            reason = err.get("ctx", {}).get("error", err["msg"])
            raise OpenAIError(
                400, f"the body is not valid JSON: {reason}", code="invalid_json"
            ) from None
        if not err["loc"]:
            raise OpenAIError(400, "the body must be a JSON object", code="invalid_json") from None
        raise bad(param_of(err["loc"]), err["msg"]) from None


def param_of(loc: tuple[int | str, ...]) -> str:
    """A pydantic error's location as OpenAI names a field: ``messages[0].content[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


class Lenient(BaseModel):
    # A compatibility route: what a real client sends and raas does not read is ignored.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


# -- request parts ------------------------------------------------------------------------------


def custom_error(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, message)


def _content(value: Any) -> Any:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return value
    raise custom_error("invalid_content", "must be a string, a list of text parts or null")


def _text_part(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return value["text"]  # text, input_text, output_text
    raise custom_error("unsupported_content", "only text content parts are supported")


# A message's content: a string, a list of text parts (or strings), or null; read as its texts.
Content = Annotated[list[Annotated[str, BeforeValidator(_text_part)]], BeforeValidator(_content)]


def _arguments(value: Any) -> Any:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise PydanticCustomError(
                "invalid_json", "is not valid JSON ({reason})", {"reason": e.msg}
            ) from None
    if not isinstance(value, dict):
        raise custom_error("invalid_arguments", "must be a JSON object")
    return value


# Tool-call arguments: a JSON string (what OpenAI sends) or an object.
Arguments = Annotated[dict[str, Any], BeforeValidator(_arguments)]


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required") or isinstance(value, dict):
        return value
    raise custom_error("invalid_value", 'must be "none", "auto", "required" or a named function')


# "none" hides the tools; a named function (a dict) is shown with the rest, sampling unconstrained.
ToolChoice = Annotated[
    Literal["none", "auto", "required"] | dict[str, Any] | None, BeforeValidator(_tool_choice)
]


def _one_or_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


Stop = Annotated[
    list[Annotated[str, Field(min_length=1)]],
    BeforeValidator(_one_or_list),
    Field(max_length=4),
]


def _function_only(value: Any) -> Any:
    if value != "function":
        raise custom_error("unsupported", 'only "function" tools are supported')
    return value


FunctionType = Annotated[Literal["function"], BeforeValidator(_function_only)]


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


class FunctionSpec(BaseModel):
    """A function tool's definition, handed to the chat template as the client wrote it."""

    model_config = ConfigDict(extra="allow")

    name: StrictStr
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(Lenient):
    type: FunctionType
    function: FunctionSpec

    def spec(self) -> dict[str, Any]:
        return {"type": "function", "function": self.function.model_dump(exclude_unset=True)}


class CalledFunction(Lenient):
    name: StrictStr
    arguments: Arguments = {}


class MessageToolCall(Lenient):
    id: str | None = None
    function: CalledFunction


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content = []
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def canonical(self) -> Message:
        role = {"developer": "system", "function": "tool"}.get(self.role, self.role)
        msg: Message = {"role": role, "content": "".join(self.content)}
        if self.role == "assistant" and self.tool_calls:
            msg["tool_calls"] = [
                tool_call(c.id or "", c.function.name, c.function.arguments)
                for c in self.tool_calls
            ]
        if role == "tool":
            if self.tool_call_id is not None:
                msg["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                msg["name"] = self.name
        return msg


class StreamOptions(Lenient):
    include_usage: StrictBool = False


# The sampling keys a request may send, recorded on each gateway call; those that change how
# a job's tokens are drawn, which a server that fixes the job's sampling refuses to change.
SENT_SAMPLING = (
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "stop",
)
FIXED_SAMPLING = ("temperature", "top_p", "seed")


class Sampled(Lenient):
    """A request that may set sampling keys (``SENT``, the names it sends them by): what it sent,
    and whether that changes how the job's tokens are drawn."""

    SENT: ClassVar[tuple[str, ...]] = ()

    def sent_sampling(self) -> dict[str, Any]:
        """The sampling keys this request set, as sent (for the call's record)."""
        return {self.name_of(k): getattr(self, k) for k in self.SENT if k in self.model_fields_set}

    def name_of(self, key: str) -> str:
        """A field's name as the request sends it (its alias: Gemini's ``topP``)."""
        alias = type(self).model_fields[key].alias
        return alias or key

    def override_of(self, job: SamplingParams) -> OpenAIError | None:
        """The 400 for a request that changes how the job's tokens are drawn (a temperature,
        top_p or seed other than the job's), naming the first such parameter; else None. A
        max tokens is no override: it is capped at the job's, and ends a turn sooner at most."""
        for key in FIXED_SAMPLING:
            if key not in self.model_fields_set:
                continue
            sent, kept = getattr(self, key), getattr(job, key)
            if sent is not None and sent != kept:
                name = self.name_of(key)
                return OpenAIError(
                    400,
                    f"{name}: this server keeps each job's sampling ({key}={kept!r}), and this"
                    f" call asked for {name}={sent!r}; leave it out or send the job's value",
                    name,
                    code="sampling_override",
                )
        return None


class OpenAIRequest(Sampled):
    """What both requests share: the model's name, tool_choice, and the sampling keys (a
    request's max tokens is capped at the default's: the job's budget, the context's room)."""

    SENT: ClassVar[tuple[str, ...]] = SENT_SAMPLING

    model: str | None = None
    tool_choice: ToolChoice = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None

    def for_model(self, served: str) -> Self:
        """This request where it names no model or ``served``, else a 404: a model server (the
        engine, the oracle) serves one name. The gateway takes any (an agent is configured with
        whatever name its harness has) and answers with the job's model."""
        if self.model not in (None, served):
            raise OpenAIError(
                404,
                f"The model `{self.model}` does not exist.",
                "model",
                "NotFoundError",
                "model_not_found",
            )
        return self

    def _sampling(self, defaults: SamplingParams, max_tokens: int | None) -> SamplingParams:
        keys = ("temperature", "top_p", "seed")
        return requested(defaults, max_tokens, **{key: getattr(self, key) for key in keys})


def requested(
    defaults: SamplingParams, max_tokens: int | None, **keys: float | int | None
) -> SamplingParams:
    """``defaults`` with the sampling keys a request sets (None: not set), its max tokens capped
    at the default's (the job's budget, the context's room)."""
    update: dict[str, Any] = {key: value for key, value in keys.items() if value is not None}
    if max_tokens is not None:
        update["max_tokens"] = min(max_tokens, defaults.max_tokens)
    return defaults.model_copy(update=update) if update else defaults


def shown(tools: list[dict[str, Any]], choice: ToolChoice) -> list[dict[str, Any]] | None:
    """The tools the model is shown: none without any, or under tool_choice "none"."""
    return None if not tools or choice == "none" else tools


# -- the requests -------------------------------------------------------------------------------


class ChatRequest(OpenAIRequest):
    """``POST /v1/chat/completions``: what raas reads of it."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    n: int | None = None
    stop: Stop | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: StrictBool | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None

    @field_validator("n")
    @classmethod
    def _only_one(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise custom_error("unsupported", "only n=1 is supported: send n requests")
        return n

    def conversation(self) -> list[Message]:
        return [m.canonical() for m in self.messages]

    def shown_tools(self) -> list[dict[str, Any]] | None:
        return shown([t.spec() for t in self.tools or ()], self.tool_choice)

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        # max_completion_tokens replaced max_tokens in OpenAI's API; a client may send either.
        most = self.max_completion_tokens if self.max_completion_tokens else self.max_tokens
        return self._sampling(defaults, most)

    @property
    def stops(self) -> list[str]:
        return list(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# -- answers ------------------------------------------------------------------------------------


class OpenAIErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    """OpenAI's error body."""

    error: OpenAIErrorInfo


class CalledFunctionOut(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunctionOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_errors: ToolCallErrors = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[Any] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage


class ChunkToolCall(ToolCallOut):
    index: int


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None
    tool_call_errors: ToolCallErrors = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


# What a chat completions route answers, for a FastAPI route's OpenAPI entry (``responses=``).
CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": ChatCompletion,
        "description": "The answer; an event stream of its chunks where the request streams.",
    },
    400: {"model": OpenAIErrorBody, "description": "A field raas cannot take, named in ``param``."},
    404: {"model": OpenAIErrorBody, "description": "Unknown model name."},
}
