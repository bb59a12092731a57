"""The subset of vLLM's OpenAI-compatible protocol that the engine speaks, as pydantic models.

Field names and the response shape are vLLM's, so one client serves both. Unknown fields are
rejected (422 naming the field) instead of being silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = Field(False, description="A last chunk with the usage.")
    continuous_usage_stats: bool = Field(False, description="Not supported: only false.")

    @field_validator("continuous_usage_stats")
    @classmethod
    def _continuous(cls, value: bool) -> bool:
        if value:
            raise ValueError("usage on every chunk is not supported: use include_usage")
        return value


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: list[int] | str = Field(description="Token ids (or text, tokenized by the engine).")
    max_tokens: int | None = Field(
        16, ge=1, description="Tokens to generate at most; null: up to the context length."
    )
    temperature: float | None = Field(1.0, ge=0.0, description="<= 1e-5 means greedy.")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(-1, description="-1 (or 0): off.")
    seed: int | None = Field(
        None, ge=-(2**63), lt=2**64, description="Same seed, same prompt: same tokens."
    )
    stop_token_ids: list[int] | None = None
    logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="Return the raw logprob of each token, and this many "
        "alternatives per position (0: none).",
    )
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    n: int = 1
    stream: bool = Field(False, description="Server-sent events, a chunk per batch of tokens.")
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    stop: list[str] | str | None = Field(
        None, description="Stop strings are not supported (use stop_token_ids); only empty."
    )

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list):
            if any(isinstance(v, list | str) for v in value):
                raise ValueError(
                    "one prompt per request: send a list of token ids (or one string), not a list "
                    "of prompts; concurrent requests are batched together"
                )
            if not value:
                raise ValueError("the prompt is empty")
        elif isinstance(value, str) and not value:
            raise ValueError("the prompt is empty")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value < -1:
            raise ValueError("top_k must be -1 (off), 0 (off) or positive")
        return value

    @field_validator("n")
    @classmethod
    def _n(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported: send n requests (they are batched together)")
        return value

    @field_validator("stream")
    @classmethod
    def _stream(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("logprobs"):
            raise ValueError(
                "logprobs alternatives are not streamed: send logprobs 0 (each token's own"
                " logprob is streamed) or stream false"
            )
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise ValueError("only with stream true")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: list[str] | str | None) -> list[str] | str | None:
        if value:
            raise ValueError("stop strings are not supported: use stop_token_ids")
        return value


class CompletionLogprobs(BaseModel):
    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]] | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"]  # abort: ended by a pause "abort"
    stop_reason: int | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class WeightVersionSpan(BaseModel):
    """The generated tokens ``[start, end)`` were all sampled under weight version ``version``."""

    version: int
    start: int
    end: int


class CompletionResponse(BaseModel):
    """vLLM's completion response, plus two fields of raas's engine that vLLM has not (named
    and shaped as SGLang's ``meta_info``): which weights generated the tokens."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    weight_version: int | None = Field(
        None, description="raas: the engine's weight version when the generation finished."
    )
    weight_versions: list[WeightVersionSpan] | None = Field(
        None,
        description="raas: the weight version of every generated token, as contiguous spans "
        "over the choice's token_ids (one span unless a weight update landed mid-generation).",
    )


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "raas"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        min_length=1,
        description="A .safetensors file, or a directory with model.safetensors or a sharded "
        "model.safetensors.index.json.",
    )


class PauseResponse(BaseModel):
    """vLLM's answers to ``/pause`` and ``/resume``."""

    status: Literal["paused", "resumed"]


class IsPausedResponse(BaseModel):
    is_paused: bool


class UpdateWeightsResponse(BaseModel):
    ok: bool = True
    weight_version: int


class EngineStatsResponse(BaseModel):
    model: str
    requests: int = Field(description="Generations finished.")
    generated_tokens: int = Field(
        description="Tokens generated, counted as they are (also those of aborted generations)."
    )
    aborted: int = Field(
        description="Generations given up because their client disconnected or cancelled them."
    )
    prefix_cache_hits: int
    cached_tokens: int
    batches: int
    decode_steps: int
    weight_version: int
    running: int = Field(description="Sequences in the batch now.")
    waiting: int = Field(description="Requests queued for a place in the batch.")
    paused: bool = Field(description="Paused (POST /pause) until POST /resume.")
    prefix_cache_entries: int
    prefix_cache_tokens: int
    max_batch: int
    max_model_len: int


class EngineErrorInfo(BaseModel):
    """What went wrong, in vLLM's error body (a job's failure is raas.wire.ErrorInfo)."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """vLLM's (and OpenAI's) error body."""

    error: EngineErrorInfo
