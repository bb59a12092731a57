"""A generation, and the vLLM completions response built from it: torch-free, so that the
embedded engine and the oracle answer ``/v1/completions`` with one and the same code."""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

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
    prompt_tokens = len(result.prompt_token_ids)
    return CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=served_name,
        choices=[choice],
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(tokens),
            total_tokens=prompt_tokens + len(tokens),
            prompt_tokens_details=PromptTokensDetails(cached_tokens=result.cached_tokens),
        ),
        **version_fields(result),
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
