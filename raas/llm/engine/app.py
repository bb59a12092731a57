"""The engine's HTTP face: the part of vLLM's OpenAI-compatible protocol raas uses, plus weight
updates (behind the engine's key, from its weight directories only) and counters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

import raas
from raas.llm.engine.admin_key import AdminKeyMiddleware
from raas.llm.engine.completion import CompletionStream, GenerationResult, completion_response
from raas.llm.engine.generator import (
    Engine,
    EngineStopped,
    GenerationParams,
    PauseMode,
    PromptError,
    WeightsError,
    WeightUpdates,
)
from raas.llm.engine.protocol import (
    CompletionRequest,
    CompletionResponse,
    EngineErrorInfo,
    EngineStatsResponse,
    ErrorResponse,
    IsPausedResponse,
    ModelCard,
    ModelList,
    PauseResponse,
    UpdateWeightsRequest,
    UpdateWeightsResponse,
)
from raas.llm.engine.weight_dirs import PathRefused, WeightDirs
from raas.llm.models import cache_dir, load_model
from raas.llm.openai_chat import chat_answer, read_output, render_prompt
from raas.llm.openai_types import CHAT_RESPONSES, ChatRequest, OpenAIError, read
from raas.llm.toolcalls import HermesParser
from raas.llm.types import SamplingParams

log = logging.getLogger(__name__)

T = TypeVar("T")

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A request the engine cannot serve."},
    404: {"model": ErrorResponse, "description": "Unknown model name."},
}


class APIError(Exception):
    """An error answered in vLLM's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def create_engine_app(
    model_name: str,
    max_batch: int = 8,
    served_name: str | None = None,
    *,
    prefix_cache_tokens: int = 32768,
    api_key: str | None = None,
    weight_dirs: Iterable[str | Path] | None = None,
    weight_updates: WeightUpdates = "between_batches",
) -> FastAPI:
    """Load ``model_name`` ("smollm2", "tiny" or a checkpoint directory) and serve it.

    The model loads here, before the app is returned; the worker thread starts with the app's
    lifespan (or on the first request) and stops with it. ``api_key`` and ``weight_dirs`` are
    :func:`engine_app`'s.
    """
    model, tokenizer = load_model(model_name)
    engine = Engine(
        model,
        tokenizer,
        max_batch=max_batch,
        prefix_cache_tokens=prefix_cache_tokens,
        weight_updates=weight_updates,
    )
    return engine_app(engine, served_name or model_name, api_key=api_key, weight_dirs=weight_dirs)


def engine_app(
    engine: Engine,
    served_name: str,
    *,
    api_key: str | None = None,
    weight_dirs: Iterable[str | Path] | None = None,
) -> FastAPI:
    """Serve an existing :class:`Engine` under the model name ``served_name``.

    ``/update_weights`` needs ``api_key`` (without one it is refused to everyone) and loads only
    from ``weight_dirs`` (default: the model cache, :func:`~raas.llm.models.cache_dir`).
    """
    created = int(time.time())
    allowed = WeightDirs.of([cache_dir()] if weight_dirs is None else weight_dirs)
    tokenizer = engine.tokenizer

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        log.info(
            "engine ready: %s, max_model_len %d, max_batch %d",
            served_name,
            engine.max_model_len,
            engine.max_batch,
        )
        if api_key:
            log.info("weights load from %s", ", ".join(map(str, allowed.roots)))
        else:
            log.info("no API key (RAAS_API_KEY, --api-key-file): /update_weights is refused")
        try:
            yield
        finally:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(
        title="raas engine",
        version=raas.__version__,
        summary="A CPU inference engine speaking vLLM's OpenAI-compatible completions protocol",
        lifespan=lifespan,
    )
    app.add_middleware(AdminKeyMiddleware, api_key=api_key)
    app.state.engine = engine
    app.state.served_name = served_name

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        info = EngineErrorInfo(message=exc.message, type=exc.kind, param=exc.param, code=exc.status)
        return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=exc.status)

    @app.get("/health", tags=["system"])
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models", tags=["openai"])
    async def models() -> ModelList:
        card = ModelCard(
            id=served_name, created=created, root=served_name, max_model_len=engine.max_model_len
        )
        return ModelList(data=[card])

    @app.post(
        "/v1/completions", tags=["openai"], responses=_ERRORS, response_model=CompletionResponse
    )
    async def completions(body: CompletionRequest, request: Request) -> Response | Any:
        """vLLM's completions: token ids (or text) in; token ids, text and logprobs out, whole
        or (``stream``) as server-sent events while they are generated."""
        if body.model is not None and body.model != served_name:
            raise APIError(
                404, f"The model `{body.model}` does not exist.", "NotFoundError", "model"
            )
        if isinstance(body.prompt, str):
            prompt = [int(t) for t in tokenizer.encode(body.prompt)]
        else:
            prompt = list(body.prompt)
        max_tokens = body.max_tokens
        if max_tokens is None:
            max_tokens = max(engine.max_model_len - len(prompt), 1)  # too long: a 400 below
        params = GenerationParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=-1 if body.top_k is None else body.top_k,
            seed=body.seed,
            stop_token_ids=frozenset(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
            top_logprobs=body.logprobs or 0,
        )
        arrived = _Arrivals(asyncio.get_running_loop()) if body.stream else None
        try:
            future = engine.submit(prompt, params, arrived.put if arrived else None)
        except PromptError as e:
            raise APIError(400, str(e), "BadRequestError", e.param) from e
        except EngineStopped as e:
            raise APIError(503, str(e), "ServiceUnavailableError") from e
        if arrived is not None:
            future.add_done_callback(arrived.close)
            stream = CompletionStream(body, served_name, tokenizer)
            events = _streamed(stream, arrived, engine, future)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            result = await _unless_disconnected(request, asyncio.wrap_future(future))
        except EngineStopped as e:
            raise APIError(503, str(e), "ServiceUnavailableError") from e
        except ClientDisconnected as e:  # nobody reads this answer
            raise APIError(499, "the client closed the request", "ClientClosedRequest") from e
        finally:  # a client that left, or this handler cancelled: generate nothing more
            engine.abort(future)
        return completion_response(body, result, served_name, tokenizer)

    @app.post("/v1/chat/completions", tags=["openai"], responses=CHAT_RESPONSES)
    async def chat_completions(request: Request) -> Response:
        """OpenAI's chat completions (n=1), rendered with the model's chat template; Hermes tool
        calls in the reply come back as ``tool_calls``. ``stream`` sends the finished answer as
        events."""
        try:
            body = read(ChatRequest, await request.body()).for_model(served_name)
            tools = body.shown_tools()
            prompt = render_prompt(tokenizer, body.conversation(), tools)
            room = max(engine.max_model_len - len(prompt), 1)  # too long: a 400 below
            sp = body.sampling(SamplingParams(max_tokens=room))
            params = GenerationParams(
                max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, seed=sp.seed
            )
            try:
                future = engine.submit(prompt, params)
            except PromptError as e:
                raise OpenAIError(400, str(e), e.param) from e
        except OpenAIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        try:
            result = await _unless_disconnected(request, asyncio.wrap_future(future))
        except EngineStopped as e:
            raise APIError(503, str(e), "ServiceUnavailableError") from e
        except ClientDisconnected as e:
            raise APIError(499, "the client closed the request", "ClientClosedRequest") from e
        finally:
            engine.abort(future)
        parser = HermesParser() if tools else None
        out = read_output(tokenizer, result.token_ids, result.finish_reason, body.stops, parser)
        kind, answer = chat_answer(
            body, served_name, tokenizer, out, result.logprobs, len(prompt), result.cached_tokens
        )
        return Response(answer, media_type=kind)

    @app.post(
        "/update_weights",
        tags=["engine"],
        responses={
            401: {"model": ErrorResponse, "description": "Without the engine's API key."},
            403: {"model": ErrorResponse, "description": "A path outside --weights-dir."},
            422: {"description": "The checkpoint does not fit; old weights stay."},
        },
    )
    async def update_weights(body: UpdateWeightsRequest) -> Any:
        try:
            version = await engine.update_weights(body.path, allowed)
        except PathRefused as e:
            raise APIError(403, str(e), "PermissionDeniedError", "path") from e
        except WeightsError as e:
            detail = [{"loc": ["body", "path"], "msg": str(e), "type": "invalid_checkpoint"}]
            return JSONResponse({"detail": detail}, status_code=422)
        except EngineStopped as e:
            raise APIError(503, str(e), "ServiceUnavailableError") from e
        return UpdateWeightsResponse(weight_version=version)

    @app.post("/pause", tags=["engine"])
    async def pause(mode: PauseMode = "abort") -> PauseResponse:
        """vLLM's ``/pause`` (``?mode=``): ``keep`` freezes the generations in flight (they go on
        under the weights loaded meanwhile), ``wait`` lets them finish, ``abort`` ends them now
        with ``finish_reason`` ``abort`` and their tokens so far. Answers once paused; new
        requests wait for ``/resume``. Open, as vLLM's: raas's pool sends no key to a backend."""
        try:
            await engine.pause_async(mode)
        except EngineStopped as e:
            raise APIError(503, str(e), "ServiceUnavailableError") from e
        return PauseResponse(status="paused")

    @app.post("/resume", tags=["engine"])
    async def resume() -> PauseResponse:
        engine.resume()
        return PauseResponse(status="resumed")

    @app.get("/is_paused", tags=["engine"])
    async def is_paused() -> IsPausedResponse:
        return IsPausedResponse(is_paused=engine.paused)

    @app.get("/v1/engine/stats", tags=["engine"])
    async def stats() -> EngineStatsResponse:
        return EngineStatsResponse(
            model=served_name,
            max_batch=engine.max_batch,
            max_model_len=engine.max_model_len,
            paused=engine.paused,
            **engine.snapshot(),
        )

    return app


class ClientDisconnected(Exception):
    pass


class _Arrivals:
    """Tokens handed from the engine's thread to the event loop that streams them; ``None``
    once the generation has ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()

    def put(self, token: int, logprob: float) -> None:
        self._hand((token, logprob))

    def close(self, _: object = None) -> None:
        self._hand(None)

    def _hand(self, item: tuple[int, float] | None) -> None:
        # On the engine's thread: a loop already closed (the server stopping) has nobody to tell.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def batch(self) -> tuple[list[tuple[int, float]], bool]:
        """The tokens that arrived since the last batch (waiting for one), and whether the
        generation has ended."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        ended = None in items
        return [x for x in items if x is not None], ended


async def _streamed(
    stream: CompletionStream,
    arrived: _Arrivals,
    engine: Engine,
    future: Future[GenerationResult],
) -> AsyncIterator[bytes]:
    """The events of a streamed completion, each batch of tokens as it comes (the last one held
    back: see CompletionStream); a client that leaves ends the generation."""
    held: list[tuple[int, float]] = []
    try:
        ended = False
        while not ended:
            tokens, ended = await arrived.batch()
            held += tokens
            ready, held = held[:-1], held[-1:]
            if ready:
                yield stream.tokens([t for t, _ in ready], [lp for _, lp in ready])
        try:
            yield stream.end(await asyncio.wrap_future(future))
        except EngineStopped as e:
            yield stream.error(str(e), "ServiceUnavailableError", 503)
        except Exception as e:  # a prefill that failed: said in the stream, as vLLM does
            log.exception("a streamed generation failed")
            yield stream.error(f"{type(e).__name__}: {e}", "InternalServerError", 500)
    finally:  # a client that left: generate nothing more
        engine.abort(future)


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it and raise
    :class:`ClientDisconnected`. The request body must have been read."""
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((job, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        job.cancel()  # nothing to do once it has finished
    if job.done() and not job.cancelled():
        return job.result()
    raise ClientDisconnected


async def _disconnect(request: Request) -> None:
    """Return when the client has gone. Once the body has been read, the server's ``receive``
    blocks until then."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # more body than expected: do not spin on a server that answers
