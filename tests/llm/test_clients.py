"""raas's client of a vLLM stream (raas.llm.clients) against a hostile or broken server: what
it streams is refused as it comes where it is wrong, and nothing it sends holds the client past
the stall timeout without a token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from raas.llm.clients import VLLMClient
from raas.llm.types import BackendError, LiveCall, SamplingParams
from tests.support.llm_servers import ServerThread

PROMPT = [5, 6, 7]
PARAMS = SamplingParams(max_tokens=5)
# What a test waits at most for an answer that should come at once, and the stall timeout of
# every test but the stall's (0.3 s there): a loaded machine may pause a server for a moment.
WAIT_S = 30.0

Events = Callable[[], AsyncIterator[bytes]]


def event(data: Any) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def chunk(ids: list[int] | None, values: list[float] | None, **choice: Any) -> bytes:
    """One vLLM completion chunk of ``ids`` (None: an older vLLM's, names only)."""
    logprobs = None
    if values is not None:
        names = [f"token_id:{t}" for t in ids or []]
        logprobs = {"token_logprobs": values, "tokens": names if ids is not None else []}
    body: dict[str, Any] = {"index": 0, "text": "", "logprobs": logprobs, **choice}
    if ids is not None:
        body["token_ids"] = ids
    return event({"id": "c", "object": "text_completion", "choices": [body]})


@pytest.fixture
def serve() -> Iterator[Callable[[Events], str]]:
    """A server whose /v1/completions streams what ``events()`` yields."""
    threads: list[ServerThread] = []

    def start(events: Events) -> str:
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request) -> StreamingResponse:
            await request.body()
            return StreamingResponse(events(), media_type="text/event-stream")

        threads.append(ServerThread(app).start())
        return threads[-1].url

    yield start
    for thread in threads:
        thread.stop()


async def generate(url: str, live: LiveCall | None = None, stall_timeout_s: float = WAIT_S) -> Any:
    client = VLLMClient(url, model="m", stall_timeout_s=stall_timeout_s)
    try:
        return await asyncio.wait_for(client.generate(PROMPT, PARAMS, live=live), WAIT_S)
    finally:
        await client.aclose()


async def test_a_well_formed_stream_is_read(serve: Callable[[Events], str]) -> None:
    async def events() -> AsyncIterator[bytes]:
        yield chunk([1, 2], [-0.1, -0.2])
        yield b": a comment\n\n"
        yield chunk([3], [-0.3], finish_reason="length")
        yield b"data: [DONE]\n\n"

    live = LiveCall("b", time.monotonic())
    gen = await generate(serve(events), live)
    assert gen.token_ids == [1, 2, 3] and gen.logprobs == [-0.1, -0.2, -0.3]
    assert live.tokens == 3


async def test_a_stream_that_sends_only_pings_is_a_stall(serve: Callable[[Events], str]) -> None:
    # Bytes keep coming (comments, empty events), so the socket's read timeout never fires:
    # without a token for the stall timeout it is a stall all the same, not a wait forever.
    async def events() -> AsyncIterator[bytes]:
        yield chunk([1], [-0.1])
        while True:
            yield b": ping\n\n"
            yield event({"id": "c", "choices": []})
            await asyncio.sleep(0.01)

    with pytest.raises(BackendError, match="stalled") as caught:
        await generate(serve(events), stall_timeout_s=0.3)
    assert caught.value.transient


async def test_tokens_without_ids_are_counted_against_max_tokens(
    serve: Callable[[Events], str],
) -> None:
    # token_ids empty, but logprobs' lists go on growing: held no further than max_tokens.
    async def events() -> AsyncIterator[bytes]:
        while True:
            values = [-0.1] * 100
            names = ["token_id:1"] * 100
            body = {"index": 0, "token_ids": [], "logprobs": {"token_logprobs": values}}
            body["logprobs"]["tokens"] = names
            yield event({"choices": [body]})
            await asyncio.sleep(0)

    with pytest.raises(BackendError, match="streamed more than max_tokens=5"):
        await generate(serve(events))


async def test_logprobs_that_come_a_chunk_late_are_refused(serve: Callable[[Events], str]) -> None:
    # The whole answer's lengths agree (2 ids, 2 logprobs), but token 1 came with none and
    # token 2 with two: the logprob beside token 1 is not its own.
    async def events() -> AsyncIterator[bytes]:
        yield chunk([1], None)
        yield chunk([2], [-0.5, -0.7], finish_reason="length")
        yield b"data: [DONE]\n\n"

    with pytest.raises(BackendError, match="1 tokens with 0 logprobs"):
        await generate(serve(events))


async def test_a_second_choice_is_not_appended_to_the_first(
    serve: Callable[[Events], str],
) -> None:
    async def events() -> AsyncIterator[bytes]:
        yield chunk([1], [-0.1])
        yield chunk([2], [-0.2], index=1)
        yield b"data: [DONE]\n\n"

    with pytest.raises(BackendError, match="streamed choice 1, not 0"):
        await generate(serve(events))


async def test_a_stream_that_switches_shape_is_refused(serve: Callable[[Events], str]) -> None:
    # ids first, then an older vLLM's names only: the ids would not say every token.
    async def events() -> AsyncIterator[bytes]:
        yield chunk([1], [-0.1])
        yield event(
            {
                "choices": [
                    {"index": 0, "logprobs": {"token_logprobs": [-0.2], "tokens": ["token_id:2"]}}
                ]
            }
        )
        yield b"data: [DONE]\n\n"

    with pytest.raises(BackendError, match=r"token_ids in some events only|1 token ids but 2"):
        await generate(serve(events))


async def test_a_stream_of_another_shape_is_refused_saying_so(
    serve: Callable[[Events], str],
) -> None:
    async def events() -> AsyncIterator[bytes]:
        yield event({"choices": [5]})  # a choice that is no object
        yield b"data: [DONE]\n\n"

    with pytest.raises(BackendError, match="unexpected completion stream shape: Attribute"):
        await generate(serve(events))
