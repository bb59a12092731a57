"""The oracle's HTTP face: the engine's part of vLLM's protocol, answered by :class:`Oracle`.

``/health``, ``/v1/models``, ``/v1/completions`` (token ids in, token ids and logprobs out, with
the same request model as the engine) and ``/v1/chat/completions`` (rendered with the
tokenizer's template; Hermes tool calls in the reply come back as ``tool_calls``), plus
``/v1/oracle/stats``. It has no weights: ``/update_weights`` is a 422 that says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

import raas
from raas.llm.chat import encode
from raas.llm.engine.completion import CompletionStream, completion_response, whole_stream
from raas.llm.engine.protocol import (
    CompletionRequest,
    CompletionResponse,
    EngineErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from raas.llm.openai_chat import chat_answer, read_output, render_prompt
from raas.llm.openai_types import CHAT_RESPONSES, ChatRequest, OpenAIError, read
from raas.llm.toolcalls import HermesParser
from raas.llm.types import SamplingParams
from raas.oracle.model import Oracle

MAX_MODEL_LEN = 1 << 20  # the oracle has no context limit of its own


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    info = EngineErrorInfo(message=message, type=kind, param=param, code=status)
    return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=status)


def oracle_app(oracle: Oracle, served_name: str = "oracle") -> FastAPI:
    created = int(time.time())
    tokenizer = oracle.tokenizer
    app = FastAPI(
        title="raas oracle",
        version=raas.__version__,
        summary="Gold tool-call trajectories for raas's bundled tasks, over vLLM's protocol",
    )
    app.state.oracle = oracle

    @app.get("/health", tags=["system"])
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models", tags=["openai"])
    async def models() -> ModelList:
        card = ModelCard(
            id=served_name, created=created, root=served_name, max_model_len=MAX_MODEL_LEN
        )
        return ModelList(data=[card])

    @app.post("/v1/completions", tags=["openai"], response_model=None)
    async def completions(
        body: CompletionRequest,
    ) -> CompletionResponse | JSONResponse | StreamingResponse:
        if body.model is not None and body.model != served_name:
            message = f"The model `{body.model}` does not exist."
            return _error(404, message, "NotFoundError", "model")
        if isinstance(body.prompt, str):
            prompt = encode(tokenizer, body.prompt)
        else:
            prompt = list(body.prompt)
        out = await asyncio.to_thread(
            oracle.generate,
            prompt,
            body.max_tokens or MAX_MODEL_LEN,
            frozenset(body.stop_token_ids or ()),
        )
        if not body.logprobs:
            out = dataclasses.replace(out, top_logprobs=None)
        if body.stream:  # whole already: one chunk
            stream = CompletionStream(body, served_name, tokenizer)
            return StreamingResponse(whole_stream(stream, out), media_type="text/event-stream")
        return completion_response(body, out, served_name, tokenizer)

    @app.post("/v1/chat/completions", tags=["openai"], responses=CHAT_RESPONSES)
    async def chat_completions(request: Request) -> Response:
        try:
            body = read(ChatRequest, await request.body()).for_model(served_name)
        except OpenAIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        tools = body.shown_tools()
        prompt = render_prompt(tokenizer, body.conversation(), tools)
        max_tokens = body.sampling(SamplingParams(max_tokens=MAX_MODEL_LEN)).max_tokens
        gen = await asyncio.to_thread(oracle.generate, prompt, max_tokens)
        parser = HermesParser() if tools else None
        out = read_output(tokenizer, gen.token_ids, gen.finish_reason, body.stops, parser)
        kind, answer = chat_answer(body, served_name, tokenizer, out, gen.logprobs, len(prompt))
        return Response(answer, media_type=kind)

    @app.post("/update_weights", tags=["engine"])
    async def update_weights() -> JSONResponse:
        msg = "the oracle has no weights to update"
        detail = [{"loc": ["body", "path"], "msg": msg, "type": "no_weights"}]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/v1/oracle/stats", tags=["oracle"])
    async def stats() -> dict[str, Any]:
        counts = {"sabotage": oracle.sabotage, "seed": oracle.seed, "tasks": len(oracle.tasks)}
        return {**counts, **oracle.counts}

    return app


def create_oracle_app(
    sabotage: float = 0.0,
    seed: int = 0,
    served_name: str | None = None,
    rows: tuple[Path, ...] = (),
) -> FastAPI:
    """The oracle on SmolLM2's tokenizer (what raas renders prompts with by default); ``rows``:
    JSONL files of SWE rows with their gold patches, answered beside the bundles."""
    from raas.llm.models import load_tokenizer

    oracle = Oracle(load_tokenizer("oracle"), sabotage, seed, rows)
    return oracle_app(oracle, served_name or "oracle")


def serve_oracle(app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
