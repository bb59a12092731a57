"""Google's Gemini API (``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent?alt=sse``, ``:countTokens``) as pydantic models, and its translation to
and from raas's canonical chat (see raas.llm.openai_chat), so that Gemini CLI (and the
``@google/genai`` SDK it is built on) drives a gateway session as an OpenAI client does: the same
rendering, generation, parsing and recording.

Requests are read leniently, as a compatibility route must (names and shapes are what the SDK
sends to the Gemini Developer API, ``generateContentParametersToMldev`` and the converters beside
it in ``@google/genai``): fields raas does not read (``safetySettings``, ``thinkingConfig``,
``responseMimeType``, ``thoughtSignature``...) are ignored, and so are thought parts (no chat
template renders an earlier turn's reasoning). A part holds ``text``, ``functionCall`` or
``functionResponse``; any other (``inlineData``, ``fileData``, code execution) is a 400 naming it.

Canonically, a ``model`` content's text parts, joined as the SDK's ``response.text`` joins them
(with nothing between), are the assistant's content and its ``functionCall`` parts its tool calls;
a ``user`` content's ``functionResponse`` parts are ``tool`` messages and its text parts, joined
by newlines, user messages, in the order sent. Gemini's call ids are optional (Gemini CLI makes up
its own, ``<name>__<id>``): a call without one gets ``call_<n>`` (its place in the conversation),
and a response is matched to the earliest unanswered call of its id, else of its name. A
response's content is what Gemini CLI puts in it, ``{"output": text}`` as the text and
``{"error": text}`` as ``Error: <text>``; any other response as its JSON.

Answers are a ``GenerateContentResponse`` (one candidate); streamed, that same response as one
server-sent event (raas generates before it answers, and the sandbox's relay buffers anyway).
Errors are Google's ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from itertools import groupby
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictStr,
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
from raas.llm.types import MaxTokens, SamplingParams, Seed, Temperature, TopP

# -- request parts ------------------------------------------------------------------------------


class FunctionCall(Lenient):
    name: StrictStr
    args: dict[str, Any] = {}
    id: StrictStr | None = None


class FunctionResponse(Lenient):
    name: StrictStr
    response: dict[str, Any] = {}
    id: StrictStr | None = None

    def text(self) -> str:
        """The response as the tool message's content (Gemini CLI's ``output`` and ``error``)."""
        if set(self.response) == {"output"} and isinstance(self.response["output"], str):
            return str(self.response["output"])
        if set(self.response) == {"error"} and isinstance(self.response["error"], str):
            return f"Error: {self.response['error']}"
        return json.dumps(self.response)


def _unsupported(value: Any) -> Any:
    if value is not None:
        raise PydanticCustomError(
            "unsupported", "only text, functionCall and functionResponse parts are supported"
        )
    return value


class Part(Lenient):
    """One part of a content: text (a thought when ``thought``), a function call or its
    response; a part of any other kind is refused by the field that holds it."""

    text: StrictStr | None = None
    thought: StrictBool | None = None
    function_call: FunctionCall | None = Field(None, alias="functionCall")
    function_response: FunctionResponse | None = Field(None, alias="functionResponse")
    inline_data: Any = Field(None, alias="inlineData")
    file_data: Any = Field(None, alias="fileData")
    executable_code: Any = Field(None, alias="executableCode")
    code_execution_result: Any = Field(None, alias="codeExecutionResult")

    @field_validator("inline_data", "file_data", "executable_code", "code_execution_result")
    @classmethod
    def _refused(cls, value: Any) -> Any:
        return _unsupported(value)

    @model_validator(mode="after")
    def _holds_one(self) -> Part:
        held = [self.text, self.function_call, self.function_response]
        if sum(v is not None for v in held) != 1:
            raise PydanticCustomError(
                "invalid_part", "a part holds one of text, functionCall or functionResponse"
            )
        return self

    @property
    def said(self) -> bool:
        """Text the model or the user said (not a thought)."""
        return self.text is not None and not self.thought


class Content(Lenient):
    role: Literal["user", "model"] = "user"
    parts: list[Part] = Field(min_length=1)

    @model_validator(mode="after")
    def _parts_of_the_role(self) -> Content:
        for i, part in enumerate(self.parts):
            misplaced = part.function_response if self.role == "model" else part.function_call
            if misplaced is not None:
                kind = "functionResponse" if self.role == "model" else "functionCall"
                owner = "user" if self.role == "model" else "model"
                raise PydanticCustomError(
                    "invalid_content",
                    "parts[{i}]: {kind} parts belong to {owner} contents",
                    {"i": i, "kind": kind, "owner": owner},
                )
        return self

    def texts(self) -> str:
        """The text parts said, joined by newlines (a system instruction's, a user's)."""
        return "\n".join(p.text or "" for p in self.parts if p.said)


def _schema(value: Any) -> Any:
    """A Gemini ``Schema`` (OpenAPI's subset, types in upper case: ``OBJECT``) as the JSON
    Schema a chat template shows: its types in lower case, through properties, items and
    anyOf."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _schema(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = _schema(out["items"])
    if isinstance(out.get("anyOf"), list):
        out["anyOf"] = [_schema(v) for v in out["anyOf"]]
    return out


class FunctionDeclaration(Lenient):
    name: StrictStr
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = Field(None, alias="parametersJsonSchema")

    def spec(self) -> dict[str, Any]:
        """In Chat Completions' shape, as the chat template takes it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters_json_schema is not None:
            function["parameters"] = self.parameters_json_schema
        elif self.parameters is not None:
            function["parameters"] = _schema(self.parameters)
        return {"type": "function", "function": function}


# Gemini's tools that run on Google's side: none of them can run here.
SERVER_TOOLS = (
    "googleSearch",
    "googleSearchRetrieval",
    "codeExecution",
    "urlContext",
    "computerUse",
    "fileSearch",
    "googleMaps",
    "retrieval",
    "enterpriseWebSearch",
    "mcpServers",
)


class Tool(Lenient):
    function_declarations: list[FunctionDeclaration] = Field([], alias="functionDeclarations")

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, value: Any) -> Any:
        named = [k for k in SERVER_TOOLS if isinstance(value, dict) and k in value]
        if named:
            raise PydanticCustomError(
                "unsupported",
                "{kind} tools are not supported: only functionDeclarations",
                {"kind": named[0]},
            )
        return value


class FunctionCallingConfig(Lenient):
    mode: StrictStr | None = None  # AUTO, ANY, VALIDATED, NONE


class ToolConfig(Lenient):
    function_calling_config: FunctionCallingConfig | None = Field(
        None, alias="functionCallingConfig"
    )


class GenerationConfig(Sampled):
    """What raas reads of ``generationConfig``: the sampling keys (recorded by Gemini's names)."""

    SENT: ClassVar[tuple[str, ...]] = (
        "temperature",
        "top_p",
        "seed",
        "max_output_tokens",
        "stop_sequences",
    )

    temperature: Temperature | None = None
    top_p: TopP | None = Field(None, alias="topP")
    seed: Seed | None = None
    max_output_tokens: MaxTokens | None = Field(None, alias="maxOutputTokens")
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, alias="stopSequences"
    )
    candidate_count: int | None = Field(None, alias="candidateCount")

    @field_validator("candidate_count")
    @classmethod
    def _one(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise PydanticCustomError("unsupported", "only 1 candidate: send n requests")
        return n


# -- the requests -------------------------------------------------------------------------------


def conversation(contents: list[Content], system: Content | None = None) -> list[Message]:
    """Gemini's contents (and system instruction) as canonical messages, each function response
    matched to its call (see the module's note)."""
    out: list[Message] = [{"role": "system", "content": system.texts()}] if system else []
    unanswered: list[dict[str, Any]] = []  # the calls of the conversation so far, in order
    n_calls = 0
    for content in contents:
        if content.role == "model":
            calls = []
            for part in content.parts:
                if part.function_call is not None:
                    call = part.function_call
                    calls.append(tool_call(call.id or f"call_{n_calls}", call.name, call.args))
                    n_calls += 1
            texts = "".join(p.text or "" for p in content.parts if p.said)
            message: Message = {"role": "assistant", "content": texts}
            if calls:
                message["tool_calls"] = calls
            unanswered += calls
            out.append(message)
            continue
        said = [p for p in content.parts if p.said or p.function_response is not None]
        before = len(out)
        for responses, run in groupby(said, key=lambda p: p.function_response is not None):
            if not responses:
                out.append({"role": "user", "content": "\n".join(p.text or "" for p in run)})
                continue
            for part in run:
                response = part.function_response
                assert response is not None
                out.append(
                    {
                        "role": "tool",
                        "content": response.text(),
                        "tool_call_id": _answered(unanswered, response),
                    }
                )
        if len(out) == before:  # thoughts alone: still a turn (no template renders no messages)
            out.append({"role": "user", "content": ""})
    return out


def _answered(unanswered: list[dict[str, Any]], response: FunctionResponse) -> str:
    """The id of the call ``response`` answers (taken off ``unanswered``): the earliest of its
    id, else of its name; a response to no call keeps its own id (or its name)."""
    for key, value in (("id", response.id), ("name", response.name)):
        for i, call in enumerate(unanswered):
            if value is not None and call[key] == value:
                return str(unanswered.pop(i)["id"])
    return response.id or response.name


class GenerateContentRequest(Sampled):
    """``:generateContent`` and ``:streamGenerateContent``: what raas reads of them (max
    tokens capped at the job's)."""

    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | None = Field(None, alias="systemInstruction")
    tools: list[Tool] | None = None
    tool_config: ToolConfig | None = Field(None, alias="toolConfig")
    generation_config: GenerationConfig | None = Field(None, alias="generationConfig")

    def conversation(self) -> list[Message]:
        return conversation(self.contents, self.system_instruction)

    def shown_tools(self) -> list[dict[str, Any]] | None:
        specs = [d.spec() for t in self.tools or () for d in t.function_declarations]
        config = self.tool_config.function_calling_config if self.tool_config else None
        hidden = config is not None and (config.mode or "").upper() == "NONE"
        return None if not specs or hidden else specs

    @property
    def config(self) -> GenerationConfig:
        return self.generation_config or GenerationConfig.model_validate({})

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        config = self.config
        return requested(
            defaults,
            config.max_output_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            seed=config.seed,
        )

    @property
    def stops(self) -> list[str]:
        return list(self.config.stop_sequences or ())

    def sent_sampling(self) -> dict[str, Any]:
        return self.config.sent_sampling()

    def override_of(self, job: SamplingParams) -> OpenAIError | None:
        err = self.config.override_of(job)
        if err is None:
            return None
        where = "generationConfig."
        return replace(err, message=where + err.message, param=where + (err.param or ""))


class CountTokensRequest(Lenient):
    """``:countTokens``: the SDK sends ``contents`` alone; the API also takes a whole
    ``generateContentRequest`` (its system instruction and tools counted too)."""

    contents: list[Content] | None = Field(None, min_length=1)
    generate_content_request: GenerateContentRequest | None = Field(
        None, alias="generateContentRequest"
    )

    @model_validator(mode="after")
    def _one_of(self) -> CountTokensRequest:
        if self.contents is None and self.generate_content_request is None:
            raise PydanticCustomError("missing", "contents (or generateContentRequest) is required")
        return self

    def conversation(self) -> list[Message]:
        if self.generate_content_request is not None:
            return self.generate_content_request.conversation()
        return conversation(self.contents or [])

    def shown_tools(self) -> list[dict[str, Any]] | None:
        request = self.generate_content_request
        return request.shown_tools() if request is not None else None


# -- answers ------------------------------------------------------------------------------------


# Answers: the fields by Gemini's own (camelCase) names, as they are sent.


class FunctionCallOut(BaseModel):
    id: str
    name: str
    args: dict[str, Any]


class PartOut(BaseModel):
    text: str | None = None
    functionCall: FunctionCallOut | None = None


class ContentOut(BaseModel):
    role: Literal["model"] = "model"
    parts: list[PartOut]


FinishReason = Literal["STOP", "MAX_TOKENS"]


class Candidate(BaseModel):
    content: ContentOut
    finishReason: FinishReason
    index: int = 0


class UsageMetadata(BaseModel):
    promptTokenCount: int
    candidatesTokenCount: int
    totalTokenCount: int
    cachedContentTokenCount: int = 0


class GenerateContentResponse(BaseModel):
    """A generateContent answer (and, streamed, its one event)."""

    candidates: list[Candidate]
    usageMetadata: UsageMetadata
    modelVersion: str
    responseId: str
    tool_call_errors: ToolCallErrors = None


class CountTokensResponse(BaseModel):
    """A countTokens answer: the rendered prompt's length."""

    totalTokens: int


class GoogleErrorInfo(BaseModel):
    code: int
    message: str
    status: str


class GoogleErrorBody(BaseModel):
    """Google's error body."""

    error: GoogleErrorInfo


# google.rpc's canonical codes by HTTP status (a 503 is UNAVAILABLE, which Google's clients
# retry as they retry a 429).
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_answer(err: OpenAIError) -> tuple[int, dict[str, Any]]:
    """A request error as Google answers it: its status and body."""
    status = err.status
    code = STATUSES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    body = GoogleErrorBody(error=GoogleErrorInfo(code=status, message=err.message, status=code))
    return status, body.model_dump()


def generate_content_response(
    model: str, out: ChatOutput, prompt_tokens: int, cached_tokens: int = 0
) -> GenerateContentResponse:
    """The answer for a reply: its text as a part (also when nothing else was said, so that the
    parts are never empty), each tool call a ``functionCall`` part."""
    parsed = out.parsed
    parts: list[PartOut] = []
    if parsed.content or not parsed.calls:
        parts.append(PartOut(text=parsed.content))
    parts += [
        PartOut(functionCall=FunctionCallOut(id=c.id, name=c.name, args=c.arguments))
        for c in parsed.calls
    ]
    # Gemini ends a turn of function calls with STOP too; a stop sequence is a STOP.
    reason: FinishReason = "MAX_TOKENS" if out.finish_reason == "length" else "STOP"
    return GenerateContentResponse(
        candidates=[Candidate(content=ContentOut(parts=parts), finishReason=reason)],
        usageMetadata=UsageMetadata(
            promptTokenCount=prompt_tokens,
            candidatesTokenCount=len(out.ids),
            totalTokenCount=prompt_tokens + len(out.ids),
            cachedContentTokenCount=cached_tokens,
        ),
        modelVersion=model,
        responseId=uuid.uuid4().hex,
        tool_call_errors=parsed.errors,
    )


def content_answer(
    stream: bool, model: str, out: ChatOutput, prompt_tokens: int, cached_tokens: int = 0
) -> tuple[str, bytes]:
    """The answer: its content type and body, the response (JSON) or, streamed, the response
    as one server-sent event (``data: {...}``, as ``alt=sse`` sends each chunk)."""
    response = generate_content_response(model, out, prompt_tokens, cached_tokens)
    data = response.model_dump_json(exclude_none=True).encode()
    if stream:
        return "text/event-stream", b"data: " + data + b"\r\n\r\n"
    return "application/json", data
