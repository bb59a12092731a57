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
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import raas
from raas.llm.chat import encode
from raas.llm.engine.completion import completion_response
from raas.llm.engine.protocol import (
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from raas.llm.openai_chat import (
    OpenAIError,
    bad,
    chat_completion,
    chat_messages,
    chat_tools,
    json_object,
    render_prompt,
    sampling,
)
from raas.llm.toolcalls import HermesParser, ParsedOutput
from raas.llm.types import SamplingParams
from raas.oracle.model import Oracle

MAX_MODEL_LEN = 1 << 20  # the oracle has no context limit of its own


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


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
        card = ModelCard(id=served_name, created=created, root=served_name,
                         max_model_len=MAX_MODEL_LEN)  # fmt: skip
        return ModelList(data=[card])

    @app.post("/v1/completions", tags=["openai"], response_model=None)
    async def completions(body: CompletionRequest) -> CompletionResponse | JSONResponse:
        if body.model is not None and body.model != served_name:
            return _error(404, f"The model `{body.model}` does not exist.", "NotFoundError",
                          "model")  # fmt: skip
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
        return completion_response(body, out, served_name, tokenizer)

    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat_completions(request: Request) -> Any:
        try:
            body = json_object(await request.body())
            if body.get("stream"):
                raise bad("stream", "streaming is not supported here")
            messages = chat_messages(body.get("messages"))
            tools = None if body.get("tool_choice") == "none" else chat_tools(body.get("tools"))
            params = sampling(SamplingParams(max_tokens=MAX_MODEL_LEN), body,
                              ("max_completion_tokens", "max_tokens"))  # fmt: skip
        except OpenAIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        prompt = render_prompt(tokenizer, messages, tools)
        out = await asyncio.to_thread(oracle.generate, prompt, params.max_tokens)
        text = str(tokenizer.decode(out.token_ids, skip_special_tokens=True))
        parsed = HermesParser().parse(text) if tools else ParsedOutput(content=text)
        return chat_completion(served_name, parsed, out.finish_reason, len(prompt),
                               len(out.token_ids))  # fmt: skip

    @app.post("/update_weights", tags=["engine"])
    async def update_weights() -> JSONResponse:
        detail = [{"loc": ["body", "path"], "msg": "the oracle has no weights to update",
                   "type": "no_weights"}]  # fmt: skip
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/v1/oracle/stats", tags=["oracle"])
    async def stats() -> dict[str, Any]:
        return {"sabotage": oracle.sabotage, "seed": oracle.seed, "tasks": len(oracle.tasks),
                **oracle.counts}  # fmt: skip

    return app


def create_oracle_app(
    sabotage: float = 0.0, seed: int = 0, served_name: str | None = None
) -> FastAPI:
    """The oracle on SmolLM2's tokenizer (what raas renders prompts with by default)."""
    from raas.llm.models import load_tokenizer

    return oracle_app(Oracle(load_tokenizer("oracle"), sabotage, seed), served_name or "oracle")


def serve_oracle(app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
