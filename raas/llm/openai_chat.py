"""OpenAI chat answers <-> raas's token world: what the gateway, the engine's and the oracle's chat
front ends share once a request is read (raas.llm.openai_types reads it).

A conversation is a list of *canonical* messages: ``role``, ``content`` (a string), and where
present ``tool_calls`` ([{id, name, arguments: dict}]), ``tool_call_id`` and ``name``. Canonical
messages compare equal when they say the same thing, whatever shape the client sent them in, which
is what prefix merging needs. A generation is read once (cut at a stop string, tool calls parsed:
:func:`read_output`) and answered by the same builders everywhere.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raas.llm.chat import encode, render_text, supports_tools
from raas.llm.openai_types import (
    AssistantMessage,
    CalledFunctionOut,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkToolCall,
    CompletionUsage,
    Delta,
    PromptTokensDetails,
    TokenLogprob,
    ToolCallOut,
    tool_call,
)
from raas.llm.toolcalls import ParsedOutput, ToolCallParser


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Do two canonical messages say the same? Tool-call ids and outer whitespace aside."""
    if a["role"] != b["role"] or a["content"].strip() != b["content"].strip():
        return False
    calls_a = [(c["name"], c["arguments"]) for c in a.get("tool_calls", [])]
    calls_b = [(c["name"], c["arguments"]) for c in b.get("tool_calls", [])]
    return calls_a == calls_b


def call_markup(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def template_messages(tokenizer: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages as the chat template takes them: tool calls as the template's own
    ``tool_calls`` where it renders tools, else as Hermes markup in the content."""
    native = supports_tools(tokenizer)
    out = []
    for m in messages:
        msg = {k: v for k, v in m.items() if k != "tool_calls"}
        calls = m.get("tool_calls")
        if calls and native:
            msg["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        elif calls:
            markup = "\n".join(call_markup(c["name"], c["arguments"]) for c in calls)
            msg["content"] = f"{m['content']}\n{markup}" if m["content"] else markup
        out.append(msg)
    return out


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The prompt's token ids: the model's chat template, tools included, ready to generate."""
    return encode(tokenizer, prompt_text(tokenizer, messages, tools))


def prompt_text(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> str:
    """The prompt as text (:func:`render_prompt` tokenizes it)."""
    return render_text(tokenizer, template_messages(tokenizer, messages), tools, True)


def cut_at_stop(tokenizer: Any, ids: list[int], stops: list[str]) -> tuple[int, str, str] | None:
    """Where the output first contains a stop string: the number of tokens that reach it (the
    rest the model would never have generated), the text before it, and the stop string."""
    if not stops:
        return None
    text = tokenizer.decode(ids, skip_special_tokens=True)
    hits = [text.find(s) for s in stops if s in text]
    if not hits:
        return None
    at = min(hits)
    stop = next(s for s in stops if text.find(s) == at)
    lo, hi = 1, len(ids)  # the fewest tokens whose text holds text[: at + len(stop)]
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= at + len(stop):
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:at], stop


@dataclass(frozen=True)
class ChatOutput:
    """What a generation said: its tokens up to a stop string, their text, the reply parsed."""

    ids: list[int]  # the rest, past the stop string, the model would never have generated
    text: str
    parsed: ParsedOutput
    finish_reason: str  # "stop" where a stop string cut it
    stop: str | None = None  # the stop string that cut it


def read_output(
    tokenizer: Any,
    ids: Sequence[int],
    finish_reason: str,
    stops: list[str],
    parser: ToolCallParser | None,
) -> ChatOutput:
    """A generation as the reply it makes: cut at the first stop string, tool calls parsed
    (``parser``: None where the model was shown no tools)."""
    ids = list(ids)
    cut = cut_at_stop(tokenizer, ids, stops)
    stop = None
    if cut is not None:
        ids, text, stop, finish_reason = ids[: cut[0]], cut[1], cut[2], "stop"
    else:
        text = str(tokenizer.decode(ids, skip_special_tokens=True))
    parsed = parser.parse(text) if parser is not None else ParsedOutput(content=text)
    return ChatOutput(ids, text, parsed, finish_reason, stop)


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: Sequence[float]) -> ChoiceLogprobs:
    """Each token's text and logprob, as Chat Completions' ``logprobs`` answers them."""
    return ChoiceLogprobs(
        content=[
            TokenLogprob(token=tokenizer.decode([t]), logprob=lp)
            for t, lp in zip(ids, logprobs, strict=False)
        ]
    )


def chat_completion(
    model: str,
    out: ChatOutput,
    prompt_tokens: int,
    cached_tokens: int = 0,
    logprobs: ChoiceLogprobs | None = None,
) -> ChatCompletion:
    """A Chat Completions answer (one choice) for a reply."""
    parsed, finish_reason = out.parsed, out.finish_reason
    calls = [
        ToolCallOut(
            id=c.id, function=CalledFunctionOut(name=c.name, arguments=json.dumps(c.arguments))
        )
        for c in parsed.calls
    ]
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"
    # OpenAI's content is null beside tool calls, else a string (empty when nothing was said)
    content = parsed.content or (None if calls else "")
    message = AssistantMessage(
        content=content, tool_calls=calls or None, tool_call_errors=parsed.errors
    )
    completion_tokens = len(out.ids)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[Choice(message=message, logprobs=logprobs, finish_reason=finish_reason)],
        usage=CompletionUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        ),
    )


def chat_answer(
    request: ChatRequest,
    model: str,
    tokenizer: Any,
    out: ChatOutput,
    logprobs: Sequence[float],
    prompt_tokens: int,
    cached_tokens: int = 0,
) -> tuple[str, bytes]:
    """The answer to ``request``: its content type and body, a chat completion (JSON) or, where
    the request streams, that completion as a Chat Completions event stream."""
    lps = token_logprobs(tokenizer, out.ids, logprobs) if request.logprobs else None
    completion = chat_completion(model, out, prompt_tokens, cached_tokens, lps)
    if request.stream:
        return "text/event-stream", sse_chunks(completion, request.include_usage)
    return "application/json", completion.model_dump_json().encode()


def reply_message(parsed: ParsedOutput) -> dict[str, Any]:
    """The canonical assistant message of a parsed reply (what the agent sends back next)."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        msg["tool_calls"] = [tool_call(c.id, c.name, c.arguments) for c in parsed.calls]
    return msg


def sse_chunks(completion: ChatCompletion, include_usage: bool) -> bytes:
    """A finished chat completion as a Chat Completions event stream."""
    choice = completion.choices[0]
    message = choice.message

    def chunk(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> str:
        event = ChatCompletionChunk(
            id=completion.id,
            created=completion.created,
            model=completion.model,
            choices=choices,
            usage=usage,
        )
        return f"data: {event.model_dump_json()}\n\n"

    first = Delta(
        role="assistant", content=message.content or "", tool_call_errors=message.tool_call_errors
    )
    deltas = [first]
    for i, call in enumerate(message.tool_calls or ()):
        deltas.append(Delta(tool_calls=[ChunkToolCall(index=i, **call.model_dump())]))
    events = [chunk([ChunkChoice(delta=d)]) for d in deltas]
    events.append(chunk([ChunkChoice(delta=Delta(), finish_reason=choice.finish_reason)]))
    if include_usage:
        events.append(chunk([], completion.usage))
    return "".join([*events, "data: [DONE]\n\n"]).encode()
