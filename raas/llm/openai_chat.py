"""OpenAI chat shapes <-> raas's token world: what the gateway and the engine's
/v1/chat/completions share.

Requests are read leniently (what real clients send: content as a string, a list of text parts or
null; tool-call arguments as a JSON string) into *canonical* messages: ``role``, ``content`` (a
string), and where present ``tool_calls`` ([{id, name, arguments: dict}]), ``tool_call_id`` and
``name``. Canonical messages compare equal when they say the same thing, whatever shape the client
sent them in, which is what prefix merging needs. Errors are :class:`OpenAIError`, answered in
OpenAI's shape ``{"error": {message, type, param, code}}``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import ValidationError

from raas.llm.chat import encode, render_text, supports_tools
from raas.llm.toolcalls import ParsedOutput
from raas.llm.types import SamplingParams

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class OpenAIError(Exception):
    """A request error, answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (
            status, message, param, kind, code,
        )  # fmt: skip

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (an empty body is ``{}``), else a 400."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, RecursionError) as e:
        raise OpenAIError(
            400, f"the body is not valid JSON: {e}", None, code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "the body must be a JSON object", None, code="invalid_json")
    return data


def bad(param: str, message: str, status: int = 400) -> OpenAIError:
    return OpenAIError(status, f"{param}: {message}", param, code="invalid_value")


def text_of(content: Any, param: str) -> str:
    """A message's content as one string: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])  # text, input_text, output_text
            else:
                raise bad(f"{param}[{i}]", "only text content parts are supported")
        return "".join(texts)
    raise bad(param, "must be a string, a list of text parts or null")


def arguments_of(raw: Any, param: str) -> dict[str, Any]:
    """Tool-call arguments, sent as a JSON string (OpenAI) or an object."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise bad(param, f"is not valid JSON ({e.msg})") from None
    if not isinstance(raw, dict):
        raise bad(param, "must be a JSON object")
    return raw


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def chat_messages(raw: Any, param: str = "messages") -> list[dict[str, Any]]:
    """Chat Completions ``messages`` as canonical messages."""
    if not isinstance(raw, list) or not raw:
        raise bad(param, "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        where = f"{param}[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role", f"must be one of {', '.join(sorted(ROLES))}")
        msg: dict[str, Any] = {
            "role": "system" if role == "developer" else "tool" if role == "function" else role,
            "content": text_of(m.get("content"), f"{where}.content"),
        }
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise bad(f"{where}.tool_calls", "must be a list")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad(f"{where}.tool_calls[{j}].function.name", "is required")
                args = arguments_of(
                    fn.get("arguments"), f"{where}.tool_calls[{j}].function.arguments"
                )
                msg["tool_calls"].append(tool_call(str(c.get("id") or ""), fn["name"], args))
        if msg["role"] == "tool":
            if m.get("tool_call_id") is not None:
                msg["tool_call_id"] = str(m["tool_call_id"])
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        out.append(msg)
    return out


def chat_tools(raw: Any, param: str = "tools") -> list[dict[str, Any]] | None:
    """Function tools in Chat Completions' shape ``{"type": "function", "function": {...}}``."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad(param, "must be a list of tools")
    tools = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{param}[{i}]", 'must be {"type": "function", "function": {"name": ...}}')
        tools.append({"type": "function", "function": fn})
    return tools or None


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
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls
            ]  # fmt: skip
        elif calls:
            markup = "\n".join(call_markup(c["name"], c["arguments"]) for c in calls)
            msg["content"] = f"{m['content']}\n{markup}" if m["content"] else markup
        out.append(msg)
    return out


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The prompt's token ids: the model's chat template, tools included, ready to generate."""
    return encode(
        tokenizer, render_text(tokenizer, template_messages(tokenizer, messages), tools, True)
    )


def sampling(
    defaults: SamplingParams, body: dict[str, Any], max_tokens_keys: tuple[str, ...]
) -> SamplingParams:
    """``defaults`` with the request's temperature, top_p and max tokens. A request's max tokens
    is capped at the default's (the job's budget); any value out of range is a 400 naming it."""
    update: dict[str, Any] = {}
    for key in ("temperature", "top_p", "seed"):
        if body.get(key) is not None:
            update[key] = body[key]
    for key in max_tokens_keys:
        if body.get(key) is not None:
            value = body[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(key, "must be a positive integer")
            update["max_tokens"] = min(value, defaults.max_tokens)
    if not update:
        return defaults
    try:
        return SamplingParams.model_validate({**defaults.model_dump(), **update})
    except ValidationError as e:
        err = e.errors()[0]
        param = str(err["loc"][0]) if err["loc"] else "body"
        if param == "max_tokens":
            param = max_tokens_keys[0]
        raise bad(param, err["msg"]) from None


def stop_strings(raw: Any, param: str = "stop") -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(s, str) and s for s in raw) or len(raw) > 4:
        raise bad(param, "must be a non-empty string or a list of at most 4")
    return list(raw)


def cut_at_stop(tokenizer: Any, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """Where the output first contains a stop string: the number of tokens that reach it (the
    rest the model would never have generated), and the text before the stop string."""
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
    return lo, text[:at]


def chat_completion(
    model: str,
    parsed: ParsedOutput,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Chat Completions answer (one choice) for a parsed reply."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in parsed.calls
        ]  # fmt: skip
        if finish_reason == "stop":
            finish_reason = "tool_calls"
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        },
    }


def reply_message(parsed: ParsedOutput) -> dict[str, Any]:
    """The canonical assistant message of a parsed reply (what the agent sends back next)."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        msg["tool_calls"] = [tool_call(c.id, c.name, c.arguments) for c in parsed.calls]
    return msg


def sse_chunks(completion: dict[str, Any], include_usage: bool) -> bytes:
    """A finished chat completion as a Chat Completions event stream."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {k: completion[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": message["content"] or ""}]
    for i, call in enumerate(message.get("tool_calls", [])):
        deltas.append({"tool_calls": [{"index": i, **call}]})
    events = [
        {**base, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]}
        for d in deltas
    ]
    events.append(
        {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                              "finish_reason": choice["finish_reason"]}]}
    )  # fmt: skip
    if include_usage:
        events.append({**base, "choices": [], "usage": completion["usage"]})
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()
