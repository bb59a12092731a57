"""raas's three OpenAI chat front ends (a job's gateway session, the embedded engine's and the
oracle's ``/v1/chat/completions``) read a request with one model and answer with the same builders,
so a field means the same on each: the same bad field is the same 400 naming it, ``stop`` cuts the
reply alike, ``n`` other than 1 is refused everywhere, ``stream`` and ``logprobs`` are honoured."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from raas.agent.gateway import Gateway
from raas.api.routes import gateway as gateway_routes
from raas.llm.chat import encode
from raas.llm.engine import create_engine_app
from raas.llm.models import load_tokenizer
from raas.llm.types import Generation, SamplingParams
from raas.oracle.app import oracle_app
from raas.oracle.model import Oracle
from raas.wire import Trajectory

FRONT_ENDS = ("gateway", "engine", "oracle")
HI: list[dict[str, Any]] = [{"role": "user", "content": "Say something."}]


class Scripted:
    """The gateway's model: always the same words, as token ids ending with the end of turn."""

    def __init__(self, tok: Any, text: str) -> None:
        self.ids = encode(tok, text) + [tok.eos_token_id]

    async def generate(self, job: str, prompt: list[int], params: SamplingParams) -> Generation:
        ids = self.ids[: params.max_tokens]
        return Generation(ids, [-0.5] * len(ids), "stop" if ids == self.ids else "length")


@pytest.fixture(scope="module")
def front_ends() -> Iterator[dict[str, tuple[FastAPI, str, str]]]:
    """Each front end's app, the API key it takes, and the model name it answers with."""
    tok = load_tokenizer("tiny")
    gateway = Gateway(Scripted(tok, "Hello there, world. How are you?"), lambda: tok, model="tiny")
    session = gateway.open("job", SamplingParams(max_tokens=64), Trajectory())
    served = FastAPI()
    served.include_router(gateway_routes.router)
    served.state.service = SimpleNamespace(gateway=gateway)
    engine = create_engine_app("tiny")
    oracle = oracle_app(Oracle(load_tokenizer("oracle")))
    yield {
        "gateway": (served, session.token, "tiny"),
        "engine": (engine, "none", "tiny"),
        "oracle": (oracle, "none", "oracle"),
    }
    engine.state.engine.shutdown()


def http(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front")


def client(front: tuple[FastAPI, str, str]) -> openai.AsyncOpenAI:
    app, key, _ = front
    return openai.AsyncOpenAI(base_url="http://front/v1", api_key=key, http_client=http(app))


async def post(front: tuple[FastAPI, str, str], body: dict[str, Any]) -> httpx.Response:
    app, key, _ = front
    async with http(app) as h:
        auth = {"Authorization": f"Bearer {key}"}
        return await h.post("/v1/chat/completions", json=body, headers=auth)


BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": -1}, "seed"),
    ({"n": 2}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0]",
    ),
    ({"tools": [{"type": "code"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"tool_choice": "always"}, "tool_choice"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop[0]"),
    ({"stream": "yes"}, "stream"),
    ({"logprobs": "x"}, "logprobs"),
    ({"stream_options": {"include_usage": 3}}, "stream_options.include_usage"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_FIELDS, ids=[p for _, p in BAD_FIELDS])
async def test_a_bad_field_is_the_same_400_naming_it_on_every_front_end(
    front_ends: dict[str, tuple[FastAPI, str, str]], fields: dict[str, Any], param: str
) -> None:
    answers = {}
    for name in FRONT_ENDS:
        response = await post(front_ends[name], {"messages": HI, **fields})
        assert response.status_code == 400, (name, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"].startswith(param)
        answers[name] = error["param"], error["message"]
    assert set(answers.values()) == {(param, answers["gateway"][1])}, answers


async def test_what_real_clients_send_beside_is_ignored_not_refused(
    front_ends: dict[str, tuple[FastAPI, str, str]],
) -> None:
    body = {
        "model": None,
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "hi", "name": "ann"},
        ],
        "frequency_penalty": 0,
        "parallel_tool_calls": True,
        "response_format": {"type": "text"},
        "user": "ann",
        "metadata": {"run": "1"},
        "max_tokens": 4,
    }
    for name in FRONT_ENDS:
        response = await post(front_ends[name], body)
        assert response.status_code == 200, (name, response.text)


@pytest.mark.parametrize("name", FRONT_ENDS)
async def test_stop_cuts_the_reply_where_the_stop_string_begins(
    front_ends: dict[str, tuple[FastAPI, str, str]], name: str
) -> None:
    agent = client(front_ends[name])
    whole = await agent.chat.completions.create(
        model=front_ends[name][2], messages=HI, temperature=0.0, max_tokens=12
    )
    text = whole.choices[0].message.content or ""
    assert len(text) >= 6, text
    stop = text[len(text) // 2 :][:2]
    cut = await agent.chat.completions.create(
        model=front_ends[name][2], messages=HI, temperature=0.0, max_tokens=12, stop=[stop, "§§"]
    )
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage and whole.usage and cut.usage.completion_tokens < whole.usage.completion_tokens


@pytest.mark.parametrize("name", FRONT_ENDS)
async def test_stream_and_logprobs_are_honoured_and_the_served_model_is_named(
    front_ends: dict[str, tuple[FastAPI, str, str]], name: str
) -> None:
    agent = client(front_ends[name])
    served = front_ends[name][2]
    reply = await agent.chat.completions.create(
        model=served, messages=HI, temperature=0.0, max_tokens=8, logprobs=True
    )
    assert reply.model == served and reply.usage is not None
    logprobs = reply.choices[0].logprobs
    assert logprobs and logprobs.content is not None
    assert len(logprobs.content) == reply.usage.completion_tokens
    stream = await agent.chat.completions.create(
        model=served,
        messages=HI,
        temperature=0.0,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        reply.choices[0].message.content
    )
    assert {c.model for c in chunks} == {served} and chunks[-1].usage == reply.usage


async def test_a_model_server_refuses_a_name_it_does_not_serve_the_gateway_takes_any(
    front_ends: dict[str, tuple[FastAPI, str, str]],
) -> None:
    for name in ("engine", "oracle"):
        response = await post(front_ends[name], {"model": "gpt-9", "messages": HI})
        assert response.status_code == 404, (name, response.text)
        assert response.json()["error"]["param"] == "model"
        assert response.json()["error"]["code"] == "model_not_found"
    # An agent is configured with whatever name its harness has: the job's model answers it.
    response = await post(front_ends["gateway"], {"model": "gpt-9", "messages": HI})
    assert response.status_code == 200 and response.json()["model"] == "tiny"
