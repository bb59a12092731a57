"""The gateway's Anthropic Messages API: the real ``anthropic`` client (what Claude Code's own
client is built like) drives a job's session; raas records its calls as it records chat
completions' (the same tokens, masks and segments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest

from raas.api.app import create_app
from raas.llm.anthropic_messages import MessagesRequest
from raas.llm.openai_chat import render_prompt
from raas.llm.openai_types import ChatRequest, read
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from tests.agent import test_gateway
from tests.agent.test_gateway import Model, open_job, raas_app
from tests.support.policies import call

# The chat completions tests' fixtures: the scripted model behind a vLLM-protocol server.
backend, model = test_gateway.backend, test_gateway.model

BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


def client(app: Any, token: str | None, **options: Any) -> anthropic.AsyncAnthropic:
    """The SDK on ``app``; ``token`` its api_key (it sends ``Authorization: Bearer``)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    return anthropic.AsyncAnthropic(
        base_url="http://localhost", api_key=token, http_client=http, max_retries=0, **options
    )


def http(app: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://localhost")


async def test_a_streamed_tool_call_and_its_result_are_one_segment_of_the_models_tokens(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    model.answers += ["Let me look.\n" + call("bash", command="ls"), "There are 2 files."]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages: list[Any] = [{"role": "user", "content": "How many files are there?"}]
        system = [
            {"type": "text", "text": "You are careful."},
            {"type": "text", "text": "Be brief."},
        ]
        async with agent.messages.stream(
            model="claude-whatever", max_tokens=1000, system=system, messages=messages, tools=[BASH]
        ) as stream:
            first = await stream.get_final_message()
        assert first.stop_reason == "tool_use" and first.model == "tiny"
        text, use = first.content
        assert text.type == "text" and text.text == "Let me look."
        assert use.type == "tool_use" and use.name == "bash" and use.input == {"command": "ls"}
        assert first.usage.output_tokens == len(model.generated[0])
        messages += [
            first.to_param(),
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "a.py\nb.py"},
                    {"type": "text", "text": "Answer now."},
                ],
            },
        ]
        second = await agent.messages.create(
            model="m", max_tokens=1000, system=system, messages=messages, tools=[BASH]
        )
        assert second.stop_reason == "end_turn" and second.stop_sequence is None
        assert [(b.type, getattr(b, "text", None)) for b in second.content] == [
            ("text", "There are 2 files.")
        ]
        assert second.usage.input_tokens > first.usage.input_tokens

    (seg,) = session.segments  # the tool result continued the segment
    gen1, gen2 = model.generated
    assert [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == gen1 + gen2
    inserted = seg.response_ids[len(gen1) : -len(gen2)]
    assert seg.loss_mask == [1] * len(gen1) + [0] * len(inserted) + [1] * len(gen2)
    assert seg.logprobs == [-0.1] * len(gen1) + [0.0] * len(inserted) + [-0.1] * len(gen2)
    seen = model.tok.decode(inserted)
    assert "a.py" in seen and "Answer now." in seen and session.drift == 0
    assert "You are careful.\nBe brief." in model.prompts[0]
    assert [t["segment"] for t in session.trajectory.turns] == [0, 0]
    assert seg.invariant_error() is None


async def test_the_sdks_x_api_key_and_auth_token_both_reach_the_session(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    model.answers += ["One.", "Two."]
    async with raas_app(tmp_path, registry, backend[0], api_key="server-key") as (app, gateway):
        session = open_job(gateway)
        hi: Any = [{"role": "user", "content": "hi"}]
        # As Claude Code sends ANTHROPIC_API_KEY: x-api-key, no Authorization.
        keyed = client(app, None, default_headers={"X-Api-Key": session.token})
        reply = await keyed.messages.create(model="m", max_tokens=10, messages=hi)
        assert reply.content[0].type == "text" and reply.content[0].text == "One."
        # As it sends ANTHROPIC_AUTH_TOKEN: Authorization: Bearer.
        token = client(app, None, auth_token=session.token)
        count = await token.messages.count_tokens(model="m", messages=hi)
        assert count.input_tokens == len(render_prompt(model.tok, hi, None))
    assert session.calls == 1


async def test_no_token_is_a_401_in_anthropics_shape(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    hi: Any = [{"role": "user", "content": "hi"}]
    for key in (None, "server-key"):  # the gateway's own 401, and the middleware's
        async with (
            raas_app(tmp_path, registry, backend[0], api_key=key) as (app, gateway),
            http(app) as raw,
        ):
            session = open_job(gateway)
            for token in ("raas-guess", "server-key"):  # the server's key is no job token
                with pytest.raises(anthropic.AuthenticationError) as err:
                    await client(app, token).messages.create(model="m", max_tokens=5, messages=hi)
                assert err.value.status_code == 401
                assert isinstance(err.value.body, dict) and err.value.body["type"] == "error"
                assert err.value.body["error"]["type"] == "authentication_error"
            for path in ("/v1/messages", "/v1/messages/count_tokens"):
                r = await raw.post(path, json={"messages": hi, "max_tokens": 5})
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            # Through the session (as the sandbox's relay reaches it), a wrong x-api-key too.
            wrong = {"x-api-key": "raas-other"}
            status, _, body = await session.handle("POST", "/v1/messages", wrong, b"{}")
            assert status == 401 and json.loads(body)["type"] == "error"
            assert session.calls == 0


async def test_a_malformed_body_is_a_400_naming_the_field(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    hi: Any = [{"role": "user", "content": "hi"}]
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"messages": hi}, "max_tokens"),
        ({"messages": hi, "max_tokens": 0}, "max_tokens"),
        ({"messages": [], "max_tokens": 5}, "messages"),
        ({"messages": [{"role": "user", "content": []}], "max_tokens": 5}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [image]}], "max_tokens": 5},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "wizard", "content": "x"}], "max_tokens": 5}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}], "max_tokens": 5},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": hi,
                "max_tokens": 5,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0].type",
        ),
        ({"messages": hi, "max_tokens": 5, "tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ({"messages": hi, "max_tokens": 5, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"messages": hi, "max_tokens": 5, "temperature": -1}, "temperature"),
    ]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        async with http(app) as raw:
            auth = {"x-api-key": session.token}
            for body, field in cases:
                r = await raw.post("/v1/messages", json=body, headers=auth)
                assert r.status_code == 400, (body, r.text)
                answer = r.json()
                assert answer["type"] == "error", answer
                assert answer["error"]["type"] == "invalid_request_error"
                assert answer["error"]["message"].startswith(f"{field}:"), (field, answer)
            r = await raw.post("/v1/messages", content=b"{nope", headers=auth)
            assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        with pytest.raises(anthropic.BadRequestError):
            await client(app, session.token).messages.create(model="m", max_tokens=0, messages=hi)
    assert session.calls == 0


async def test_stop_sequences_max_tokens_and_ignored_thinking_blocks(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    model.answers += ["Hello STOP and more", "one two three four five six seven eight nine ten"]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages: Any = [{"role": "user", "content": "hi"}]
        first = await agent.messages.create(
            model="m", max_tokens=100, messages=messages, stop_sequences=["STOP"]
        )
        assert first.stop_reason == "stop_sequence" and first.stop_sequence == "STOP"
        assert first.content[0].type == "text" and first.content[0].text == "Hello "
        thought = {"type": "thinking", "thinking": "hm", "signature": "sig"}
        messages += [
            {"role": "assistant", "content": [thought, *first.to_param()["content"]]},
            {"role": "user", "content": "Count."},
        ]
        async with agent.messages.stream(
            model="m", max_tokens=4, messages=messages, thinking={"type": "disabled"}
        ) as stream:
            second = await stream.get_final_message()
        assert second.stop_reason == "max_tokens" and second.usage.output_tokens == 4
    (seg,) = session.segments  # the thinking block is ignored: the turn continues the segment
    assert "hm" not in model.prompts[1]
    # What was kept of the first call ends where the stop sequence began.
    assert [t["output_tokens"] for t in seg.turns] == [first.usage.output_tokens, 4]
    assert sum(seg.loss_mask) == first.usage.output_tokens + 4
    assert first.usage.output_tokens < len(model.generated[0])


async def test_no_backend_is_anthropics_529_overloaded(
    tmp_path: Path, registry: TaskRegistry
) -> None:
    app = create_app(ServeSettings(db=tmp_path / "gw.db", tokenizer="tiny"), registry)
    async with app.router.lifespan_context(app), http(app) as raw:
        session = open_job(app.state.service.gateway)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        r = await raw.post("/v1/messages", json=body, headers={"x-api-key": session.token})
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        spec = (await raw.get("/openapi.json")).json()
        documented = spec["paths"]["/v1/messages"]["post"]["responses"]
        assert {"200", "400", "401", "529"} <= set(documented)
        ref = documented["529"]["content"]["application/json"]["schema"]["$ref"]
        schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert set(r.json()) == set(schema["required"]) == {"type", "error"}


def test_a_messages_request_is_the_chat_conversation_it_says() -> None:
    """The translation: what Anthropic's shapes say is what OpenAI's would, message for message,
    so both are rendered, generated and merged alike."""
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Count"}, {"type": "text", "text": "the files."}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "ls will do", "signature": "s"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "a b"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "no such file",
                    "is_error": True,
                },
                {"type": "text", "text": "Go on."},
            ],
        },
    ]
    body = {"system": "Be brief.", "messages": messages, "tools": [BASH], "max_tokens": 9}
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Count\nthe files."},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "a b"},
            {"role": "tool", "tool_call_id": "t2", "content": "Error: no such file"},
            {"role": "user", "content": "Go on."},
        ],
        "tools": [{"type": "function", "function": {**BASH, "parameters": BASH["input_schema"]}}],
    }
    del chat["tools"][0]["function"]["input_schema"]
    request = read(MessagesRequest, json.dumps(body).encode())
    same = read(ChatRequest, json.dumps(chat).encode())
    assert request.conversation() == same.conversation()
    assert request.shown_tools() == same.shown_tools()
    hidden = read(MessagesRequest, json.dumps({**body, "tool_choice": {"type": "none"}}).encode())
    assert hidden.shown_tools() is None


async def test_a_call_records_the_sampling_it_sent_and_a_fixed_server_refuses_a_change(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    async with raas_app(tmp_path, registry, backend[0], gateway_fixed_sampling=True) as (
        app,
        gateway,
    ):
        session = open_job(gateway, temperature=0.7)
        agent = client(app, session.token)
        hi: Any = [{"role": "user", "content": "hi"}]
        # This SDK has no temperature argument (older ones, and Claude Code, send one).
        with pytest.raises(anthropic.BadRequestError) as err:
            await agent.messages.create(
                model="m", max_tokens=5, messages=hi, extra_body={"temperature": 0.0}
            )
        body = err.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("temperature:")
        await agent.messages.create(
            model="m",
            max_tokens=5,
            messages=hi,
            stop_sequences=["END"],
            extra_body={"temperature": 0.7},
        )
    (turn,) = session.trajectory.turns
    assert turn["sampling_sent"] == {"temperature": 0.7, "max_tokens": 5, "stop_sequences": ["END"]}
    assert turn["sampling"]["max_tokens"] == 5 and turn["sampling"]["temperature"] == 0.7


async def test_a_tool_use_that_cannot_be_read_is_text_with_its_error_streamed_or_not(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    broken = '<tool_call>{"name": "bash", "arguments": "ls"}</tool_call>'  # arguments not JSON
    model.answers += [broken, broken]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        ask: Any = {"model": "m", "max_tokens": 50, "tools": [BASH]}
        ask["messages"] = [{"role": "user", "content": "ls"}]
        message = await agent.messages.create(**ask)
        async with agent.messages.stream(**ask) as stream:
            streamed = await stream.get_final_message()
    for answer in (message, streamed):
        (block,) = answer.content  # no tool_use: the call as the model wrote it
        assert block.type == "text" and block.text == broken and answer.stop_reason == "end_turn"
    (error,) = (message.model_extra or {})["tool_call_errors"]
    assert error == "tool call 1: arguments is a string, not JSON"
    assert [t["malformed_tool_calls"] for t in session.trajectory.turns] == [1, 1]
