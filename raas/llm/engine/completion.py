"""A generation, and the vLLM completions response built from it: torch-free, so that the
embedded engine and the oracle answer ``/v1/completions`` with one and the same code."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from raas.llm.engine.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
    WeightVersionSpan,
)


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int]  # including the stop token (EOS or a stop id) that ended it
    logprobs: list[float]  # one per token of token_ids
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str  # "stop", "length", or "abort" (ended by a pause, see Engine.pause)
    stop_reason: int | None  # the stop token id, None for EOS and length
    stopped_on_token: bool  # the last token is the EOS or stop token that ended generation
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    weight_version: int = 0  # the engine's weight version when the generation finished
    # The weight version each token of token_ids was sampled under; empty where not known
    # (the oracle, which has no weights).
    weight_versions: list[int] = field(default_factory=list)


_FINISH: dict[str, Literal["stop", "length", "abort"]] = {"stop": "stop", "abort": "abort"}


def completion_response(
    body: CompletionRequest, result: GenerationResult, served_name: str, tokenizer: Any
) -> CompletionResponse:
    """vLLM's answer to ``body``: text, token ids and logprobs as its flags ask."""
    tokens = result.token_ids
    shown = tokens
    if result.stopped_on_token and not body.include_stop_str_in_output:
        shown = tokens[:-1]  # like vLLM: the stop token is in token_ids, not in the text
    choice = CompletionChoice(
        text=str(tokenizer.decode(shown, skip_special_tokens=body.skip_special_tokens)),
        token_ids=tokens if body.return_token_ids else None,
        prompt_token_ids=result.prompt_token_ids if body.return_token_ids else None,
        logprobs=None if body.logprobs is None else completion_logprobs(body, result, tokenizer),
        finish_reason=_FINISH.get(result.finish_reason, "length"),
        stop_reason=result.stop_reason,
    )
    return CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=served_name,
        choices=[choice],
        usage=usage_of(result),
        **version_fields(result),
    )


def usage_of(result: GenerationResult) -> Usage:
    prompt_tokens, tokens = len(result.prompt_token_ids), len(result.token_ids)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=tokens,
        total_tokens=prompt_tokens + tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=result.cached_tokens),
    )


def version_fields(result: GenerationResult) -> dict[str, Any]:
    """The response's ``weight_version`` and ``weight_versions`` (SGLang's names and span shape
    in its ``meta_info``), or nothing where the tokens' versions are not known."""
    versions = result.weight_versions
    if len(versions) != len(result.token_ids):
        return {}
    spans: list[WeightVersionSpan] = []
    for i, version in enumerate(versions):
        if spans and spans[-1].version == version:
            spans[-1].end = i + 1
        else:
            spans.append(WeightVersionSpan(version=version, start=i, end=i + 1))
    return {"weight_version": result.weight_version, "weight_versions": spans}


def completion_logprobs(
    body: CompletionRequest, result: GenerationResult, tokenizer: Any
) -> CompletionLogprobs:
    """Each token's name (its text, or ``token_id:N``), offset and logprob, and the
    alternatives when the result carries them (the sampled token always among them)."""
    names: dict[int, str] = {}

    def name(token: int) -> str:
        if token not in names:
            names[token] = (
                f"token_id:{token}"
                if body.return_tokens_as_token_ids
                else str(tokenizer.decode([token], skip_special_tokens=False))
            )
        return names[token]

    strings = [name(t) for t in result.token_ids]
    offsets = [0, *itertools.accumulate(len(s) for s in strings)][: len(strings)]
    top = None
    if result.top_logprobs is not None:
        top = []
        for token, logprob, alternatives in zip(
            result.token_ids, result.logprobs, result.top_logprobs, strict=True
        ):
            entry = {name(t): lp for t, lp in alternatives}
            entry.setdefault(name(token), logprob)
            top.append(entry)
    return CompletionLogprobs(
        text_offset=offsets, token_logprobs=result.logprobs, tokens=strings, top_logprobs=top
    )


class CompletionStream:
    """vLLM's streamed answer to ``body`` (``stream: true``), as server-sent events: a chunk for
    each batch of new tokens (their ``token_ids``, logprobs and text), the last one with the
    finish reason and raas's weight versions (spans over the whole generation, as in the whole
    answer), a usage chunk where ``stream_options.include_usage`` asks, then ``[DONE]``. The
    last token is held back until the end: whether it is the stop token, whose text is not
    shown, is known only then."""

    def __init__(self, body: CompletionRequest, served_name: str, tokenizer: Any) -> None:
        self.body, self.served_name, self.tokenizer = body, served_name, tokenizer
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.sent = 0  # tokens sent so far
        self.text_sent = 0  # characters of text sent so far (the logprobs' offsets go on)

    def tokens(self, token_ids: list[int], logprobs: list[float]) -> bytes:
        """A chunk of new tokens."""
        return self._chunk(token_ids, logprobs, token_ids, None, None, {})

    def end(self, result: GenerationResult) -> bytes:
        """The last chunk (the tokens not sent yet, the finish reason), usage, ``[DONE]``."""
        rest = result.token_ids[self.sent :]
        shown = rest
        if result.stopped_on_token and not self.body.include_stop_str_in_output:
            shown = rest[:-1]  # like vLLM: the stop token is in token_ids, not in the text
        finish = _FINISH.get(result.finish_reason, "length")
        out = self._chunk(
            rest,
            result.logprobs[self.sent :],
            shown,
            finish,
            result.stop_reason,
            version_fields(result),
        )
        options = self.body.stream_options
        if options is not None and options.include_usage:
            usage = usage_of(result).model_dump()
            out += self._event({**self._head(), "choices": [], "usage": usage})
        return out + DONE

    def error(self, message: str, kind: str, code: int) -> bytes:
        """An error in the stream, in vLLM's shape, then ``[DONE]``."""
        error = {"message": message, "type": kind, "param": None, "code": code}
        return self._event({"error": error}) + DONE

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.served_name,
        }

    def _chunk(
        self,
        token_ids: list[int],
        logprobs: list[float],
        shown: list[int],
        finish: str | None,
        stop_reason: int | None,
        extra: dict[str, Any],
    ) -> bytes:
        body = self.body
        text = str(self.tokenizer.decode(shown, skip_special_tokens=body.skip_special_tokens))
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = token_ids
        if body.logprobs is not None:
            part = GenerationResult([], token_ids, logprobs, None, "length", None, False)
            values = completion_logprobs(body, part, self.tokenizer)
            values.text_offset = [self.text_sent + x for x in values.text_offset]
            choice["logprobs"] = values.model_dump()
        self.sent += len(token_ids)
        self.text_sent += len(text)
        return self._event({**self._head(), "choices": [choice], **_dumped(extra)})

    @staticmethod
    def _event(data: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _dumped(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: [s.model_dump() for s in v] if isinstance(v, list) else v for k, v in fields.items()}


async def whole_stream(stream: CompletionStream, result: GenerationResult) -> AsyncIterator[bytes]:
    """The stream of a generation that is already whole (the oracle's): one chunk and the end."""
    yield stream.end(result)
