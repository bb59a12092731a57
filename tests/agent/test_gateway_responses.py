"""The gateway's Responses API, streamed as Codex CLI calls it: the real ``openai`` client's
``responses.stream`` (the SDK's own accumulator) drives a job's session; raas records its calls
as it records chat completions' (the same tokens, masks and segments)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, get_args

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from raas.agent.gateway import GatewaySession
from raas.tasks import TaskRegistry
from tests.agent import test_gateway
from tests.agent.test_gateway import Model, client, open_job, raas_app
from tests.conftest import FIXTURES
from tests.support.policies import call

# The chat completions tests' fixtures: the scripted model behind a vLLM-protocol server.
backend, model = test_gateway.backend, test_gateway.model

BASH = {
    "type": "function",
    "name": "bash",
    "description": "Run a shell command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}
# What Codex sends beside the conversation (codex-rs ResponsesApiRequest).
CODEX = {
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "reasoning": {"effort": "medium", "summary": "auto"},
    "prompt_cache_key": "conversation-1",
}
# The openai package's event types by their type (its union is discriminated by the SDK's own
# means, which pydantic does not read): each event is validated as the one it says it is.
EVENTS = {
    get_args(kind.model_fields["type"].annotation)[0]: kind
    for kind in get_args(get_args(ResponseStreamEvent)[0])
}


@asynccontextmanager
async def job_http(
    tmp_path: Path, registry: TaskRegistry, llm: str
) -> AsyncIterator[tuple[GatewaySession, httpx.AsyncClient]]:
    """A job's session on a fresh server, and a plain HTTP client that sends its token."""
    async with raas_app(tmp_path, registry, llm) as (app, gateway):
        session = open_job(gateway)
        auth = {"Authorization": f"Bearer {session.token}"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=auth
        ) as http:
            yield session, http


def read_events(body: str) -> list[Any]:
    """A raw event stream as the ``openai`` package's own event types (validated: a field of the
    wrong type or a missing one fails), each ``event:`` line its event's type."""
    events = []
    for block in body.strip().split("\n\n"):
        name, data = block.split("\n")
        fields = json.loads(data.removeprefix("data: "))
        event = EVENTS[fields["type"]].model_validate(fields)
        assert name == f"event: {event.type}"
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


async def test_a_streamed_two_call_tool_conversation_is_one_segment_of_the_models_tokens(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += ["Let me look.\n" + call("bash", command="ls"), "There are 2 files."]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        items: list[Any] = [{"type": "message", "role": "user", "content": "How many files?"}]
        async with agent.responses.stream(
            model="codex", instructions="Be brief.", input=items, tools=[BASH], **CODEX
        ) as stream:
            kinds = [event.type async for event in stream]
            first = await stream.get_final_response()
        assert kinds == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        message, fc = first.output
        assert message.type == "message" and first.output_text == "Let me look."
        assert fc.type == "function_call" and fc.name == "bash"
        assert json.loads(fc.arguments) == {"command": "ls"} and fc.call_id
        assert first.usage and first.usage.output_tokens == len(model.generated[0])
        # Codex sends back its reasoning items (none here: one of an earlier model is ignored),
        # the output items as they came, and the call's output.
        reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"}
        items += [reasoning, *(o.model_dump(exclude_none=True) for o in first.output)]
        items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "a b"})
        async with agent.responses.stream(
            model="codex", instructions="Be brief.", input=items, tools=[BASH], **CODEX
        ) as stream:
            second = await stream.get_final_response()
        assert second.output_text == "There are 2 files." and second.status == "completed"
        assert [o.type for o in second.output] == ["message"]

    (seg,) = session.segments
    gen1, gen2 = model.generated
    assert [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == gen1 + gen2
    assert seg.response_ids[: len(gen1)] == gen1 and seg.response_ids[-len(gen2) :] == gen2
    assert "a b" in model.tok.decode(seg.response_ids[len(gen1) : -len(gen2)])
    assert session.drift == 0 and [t["segment"] for t in session.trajectory.turns] == [0, 0]
    assert seg.invariant_error() is None


async def test_the_events_are_openais_own_types_and_a_reply_cut_short_ends_incomplete(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += [call("bash", command="ls"), "one two three four five six seven eight"]
    async with job_http(tmp_path, registry, backend[0]) as (_, http):
        body = {"model": "m", "input": "ls", "tools": [BASH], "stream": True, **CODEX}
        r = await http.post("/v1/responses", json=body)
        assert r.headers["content-type"].startswith("text/event-stream")
        events = read_events(r.text)
        done = events[-1]
        assert done.type == "response.completed" and done.response.status == "completed"
        assert events[0].response.status == "in_progress" and events[0].response.output == []
        (fc,) = done.response.output
        assert fc.type == "function_call" and fc.name == "bash"
        assert done.response.parallel_tool_calls is False
        # Cut short by max_output_tokens: OpenAI ends such a response with response.incomplete.
        body = {"model": "m", "input": "count", "max_output_tokens": 3, "stream": True}
        events = read_events((await http.post("/v1/responses", json=body)).text)
        # Unstreamed, the answer is the openai package's Response, validated.
        body = {"model": "m", "input": "again", "stream": False, **CODEX}
        plain = Response.model_validate((await http.post("/v1/responses", json=body)).json())
        assert plain.status == "completed" and plain.output_text == "Nothing more."
    done = events[-1]
    assert done.type == "response.incomplete" and done.response.status == "incomplete"
    assert done.response.incomplete_details.reason == "max_output_tokens"
    (message,) = done.response.output
    assert message.status == "incomplete" and done.response.usage.output_tokens == 3


async def test_a_malformed_request_is_a_400_naming_the_field_and_hosted_tools_are_not_shown(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{x"}]},
            "input[0].arguments",
        ),
        (
            {"input": [{"type": "function_call", "arguments": "{}", "call_id": "c"}]},
            "input[0].name",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "local_shell_call", "call_id": "c"}]}, "input[0].type"),
        ({"input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0].type"),
        ({"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": []}, "input"),
    ]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        for kwargs, param in cases:
            with pytest.raises(openai.BadRequestError) as err:
                await agent.responses.create(model="m", stream=True, **kwargs)
            body = err.value.body
            assert isinstance(body, dict) and body["param"] == param, (kwargs, body)
            assert body["message"].startswith(f"{param}: ")
        assert session.calls == 0
        web = {"type": "web_search", "external_web_access": False}
        r = await agent.responses.create(model="m", input="hi", tools=[web, BASH])
        assert r.status == "completed" and [t.type for t in r.tools] == ["web_search", "function"]
    (prompt,) = model.prompts
    assert "bash" in prompt and "web_search" not in prompt


async def test_codex_clis_own_requests_stream_and_continue_one_segment(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    # Codex CLI 0.169.0's first request of `codex exec`, as it sent it (long texts shortened):
    # function tools, a namespace of sub-agent tools, web_search, developer messages.
    request = json.loads((FIXTURES / "codex_responses_request.json").read_text())
    model.answers += [call("exec_command", cmd="ls | wc -l"), call("close_agent", target="a1")]
    async with job_http(tmp_path, registry, backend[0]) as (session, http):
        events = read_events((await http.post("/v1/responses", json=request)).text)
        (fc,) = [e.item for e in events if e.type == "response.output_item.done"]
        assert fc.name == "exec_command" and fc.namespace is None
        # As Codex sends the turn back: the call item as it came, and its output.
        request["input"] += [
            fc.model_dump(exclude_none=True),
            {"type": "function_call_output", "id": "fco_1", "call_id": fc.call_id, "output": "2"},
        ]
        events = read_events((await http.post("/v1/responses", json=request)).text)
    (fc,) = [e.item for e in events if e.type == "response.output_item.done"]
    assert fc.name == "close_agent" and fc.namespace == "multi_agent_v1"
    (prompt, _) = model.prompts
    assert "exec_command" in prompt and "close_agent" in prompt and "web_search" not in prompt
    (seg,) = session.segments
    gen1, gen2 = model.generated
    assert [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == gen1 + gen2
    assert session.drift == 0


async def test_a_streamed_call_that_cannot_be_read_is_text_with_its_error(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    broken = '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>'  # arguments a list
    model.answers += [broken]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        async with agent.responses.stream(
            model="codex", input="ls", tools=[BASH], **CODEX
        ) as stream:
            response = await stream.get_final_response()
    (message,) = response.output  # no function_call: the call as the model wrote it
    assert message.type == "message" and response.output_text == broken
    errors = (response.model_extra or {})["tool_call_errors"]
    assert errors == ["tool call 1: arguments must be an object"]
    assert session.trajectory.turns[0]["malformed_tool_calls"] == 1
