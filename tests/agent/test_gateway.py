"""The gateway: agent programs call an OpenAI-style API (here the real ``openai`` client) on raas,
per job token; raas records every call's tokens and merges them into trajectory segments."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from raas.agent.gateway import Gateway, GatewaySession
from raas.api.app import create_app
from raas.llm.chat import encode
from raas.llm.models import load_tokenizer
from raas.llm.types import SamplingParams
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from raas.wire import Trajectory
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


class Model:
    """The scripted model: answers in order; what it generated is kept to compare with."""

    def __init__(self) -> None:
        self.tok = load_tokenizer("tiny")
        self.answers: list[str] = []
        self.prompts: list[str] = []
        self.generated: list[list[int]] = []
        self.server: AgentBackend | None = None

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        text = self.answers.pop(0) if self.answers else "Nothing more."
        self.generated.append(encode(self.tok, text) + [self.tok.eos_token_id])
        return text


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[str, Model]]:
    model = Model()
    model.server = AgentBackend(model)
    server = ServerThread(model.server.app).start()
    yield server.url, model
    server.stop()


@pytest.fixture
def model(backend: tuple[str, Model]) -> Model:
    backend[1].answers.clear()
    backend[1].generated.clear()
    backend[1].prompts.clear()
    assert backend[1].server is not None
    backend[1].server.weight_version = None
    return backend[1]


@asynccontextmanager
async def raas_app(
    tmp_path: Path, registry: TaskRegistry, llm: str, **settings: Any
) -> AsyncIterator[tuple[FastAPI, Gateway]]:
    app = create_app(
        ServeSettings(db=tmp_path / "gw.db", llm=[llm], tokenizer="tiny", **settings), registry
    )
    async with app.router.lifespan_context(app):
        yield app, app.state.service.gateway


def client(app: FastAPI, token: str) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    return openai.AsyncOpenAI(base_url="http://localhost/v1", api_key=token, http_client=http)


def open_job(gateway: Gateway, job_id: str = "job-1", **params: Any) -> GatewaySession:
    return gateway.open(job_id, SamplingParams(max_tokens=64, **params), Trajectory())


async def after_a_tool_call(agent: openai.AsyncOpenAI) -> list[Any]:
    """The conversation once the model has answered a call to bash and the tool has replied."""
    messages: list[Any] = [{"role": "user", "content": "Count the files."}]
    r = await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
    reply = r.choices[0].message.model_dump(exclude_none=True)
    return [*messages, reply, {"role": "tool", "tool_call_id": "x", "content": "a b"}]


async def test_a_tool_conversation_is_one_segment_of_exactly_the_generated_tokens(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += [call("bash", command="ls"), "There are 2 files."]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages: list[Any] = [
            {"role": "system", "content": "You are a careful engineer."},
            {"role": "user", "content": "How many files are there?"},
        ]
        first = await agent.chat.completions.create(
            model="whatever", messages=messages, tools=[BASH], temperature=0.5
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (tc,) = choice.message.tool_calls or []
        assert tc.function.name == "bash" and json.loads(tc.function.arguments) == {"command": "ls"}
        assert tc.id and first.usage and first.usage.completion_tokens == len(model.generated[0])
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": "a.py\nb.py"})
        second = await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
        assert second.choices[0].finish_reason == "stop"
        assert second.choices[0].message.content == "There are 2 files."

    (seg,) = session.segments
    traj = session.trajectory
    assert traj.prompt_ids is seg.prompt_ids and traj.response_ids is seg.response_ids
    gen1, gen2 = model.generated
    generated = [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m]
    assert generated == gen1 + gen2
    # The response: gen1, then the observation (mask 0, logprob 0.0), then gen2, at the ends.
    assert seg.response_ids[: len(gen1)] == gen1 and seg.response_ids[-len(gen2) :] == gen2
    inserted = seg.response_ids[len(gen1) : -len(gen2)]
    assert seg.loss_mask == [1] * len(gen1) + [0] * len(inserted) + [1] * len(gen2)
    assert seg.logprobs == [-0.1] * len(gen1) + [0.0] * len(inserted) + [-0.1] * len(gen2)
    # What the model saw on the second call is the first prompt + its output + the observation.
    tok = model.tok
    assert encode(tok, model.prompts[1]) == seg.prompt_ids + gen1 + inserted
    assert "a.py" in tok.decode(inserted) and session.drift == 0
    assert [t["segment"] for t in traj.turns] == [0, 0] and len(traj.turns) == 2
    assert [t["policy_version"] for t in traj.turns] == [None, None]  # vLLM says nothing
    assert traj.messages[-1] == {"role": "assistant", "content": "There are 2 files."}
    assert session.metrics()["gateway_segments"] == 1


async def test_each_call_records_the_policy_version_the_backend_reports(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    assert model.server is not None
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        for version in (4, 6):
            model.server.weight_version = version
            messages: list[Any] = [{"role": "user", "content": f"Hello {version}"}]
            await agent.chat.completions.create(model="m", messages=messages)
    assert [t["policy_version"] for t in session.trajectory.turns] == [4, 6]
    assert session.trajectory.policy_version_range() == (4, 6)


async def test_dropping_earlier_messages_starts_a_new_segment(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += [call("bash", command="ls"), "Summary: 2 files.", "Done."]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages = await after_a_tool_call(agent)
        await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
        compacted = [{"role": "user", "content": "Earlier: 2 files. Go on."}]  # compaction
        await agent.chat.completions.create(model="m", messages=compacted, tools=[BASH])
    first, second = session.segments
    assert len(first.turns) == 2 and len(second.turns) == 1
    assert second.response_ids == model.generated[2] and second.loss_mask == [1] * len(
        second.response_ids
    )
    assert session.trajectory.response_ids is first.response_ids  # the trajectory: the first
    assert [t["segment"] for t in session.trajectory.turns] == [0, 0, 1]
    metrics = session.metrics()
    assert metrics["gateway_segments"] == 2 and len(metrics["segments"]) == 2


async def test_every_segment_keeps_the_invariant_across_calls_that_continue_and_branch(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += [call("bash", command="ls"), "Two files.", "Two files, yes.", "Done."]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages = await after_a_tool_call(agent)
        # Two calls continue the segment at once: both are planned on the same tokens before
        # either is recorded, so the second one recorded branches off into a segment of its own.
        generate, started, both = session.llm.generate, [0], asyncio.Event()

        async def together(job: str, prompt: list[int], params: SamplingParams) -> Any:
            started[0] += 1
            if started[0] == 3:
                both.set()
            if started[0] in (2, 3):
                await asyncio.wait_for(both.wait(), 10)
            return await generate(job, prompt, params)

        session.llm = type("Together", (), {"generate": staticmethod(together)})()
        await asyncio.gather(
            agent.chat.completions.create(model="m", messages=messages, tools=[BASH]),
            agent.chat.completions.create(model="m", messages=messages, tools=[BASH]),
        )
        compacted = [{"role": "user", "content": "Earlier: 2 files. Go on."}]
        await agent.chat.completions.create(model="m", messages=compacted, tools=[BASH])
    first, branch, _ = session.segments
    assert [t["segment"] for t in session.trajectory.turns] == [0, 0, 1, 2]
    assert [len(s.turns) for s in session.segments] == [2, 1, 1]
    # The branch starts from the prompt its call was given: the first call and its observation.
    assert first.ids[: len(branch.prompt_ids)] == branch.prompt_ids
    assert len(first.prompt_ids) < len(branch.prompt_ids) and branch.loss_mask == [1] * len(
        branch.response_ids
    )
    for segment in session.segments:
        assert segment.invariant_error() is None
    assert session.trajectory.invariant_error() is None
    first.response_ids[0] += 1  # a recorded token rewritten: what the pipeline would catch
    assert first.invariant_error() == (
        "prompt 1 given to the model is not a prefix of the trajectory's ids"
    )


async def test_the_responses_api_does_a_function_call_round_trip(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += [call("bash", command="pwd"), "You are in /work."]
    tool = {
        "type": "function",
        "name": "bash",
        "description": "Run a command.",
        "parameters": BASH["function"]["parameters"],
    }
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        items: list[Any] = [{"role": "user", "content": "Where am I?"}]
        first = await agent.responses.create(
            model="m", instructions="Be brief.", input=items, tools=[tool], max_output_tokens=32
        )
        (fc,) = [o for o in first.output if o.type == "function_call"]
        assert fc.name == "bash" and json.loads(fc.arguments) == {"command": "pwd"}
        items += [o.model_dump(exclude_none=True) for o in first.output]
        items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "/work"})
        second = await agent.responses.create(
            model="m", input=items, tools=[tool], instructions="Be brief."
        )
        assert second.output_text == "You are in /work." and second.status == "completed"
        assert second.usage and second.usage.output_tokens == len(model.generated[1])
    (seg,) = session.segments  # the function call round trip continued the segment
    assert [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == (
        model.generated[0] + model.generated[1]
    )
    assert session.drift == 0


async def test_a_job_token_reaches_its_own_session_only(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    async with raas_app(tmp_path, registry, backend[0], api_key="server-key") as (app, gateway):
        a, b = open_job(gateway, "job-a"), open_job(gateway, "job-b")
        assert a.token != b.token and gateway.session(a.token) is a
        messages: Any = [{"role": "user", "content": "hi"}]
        await client(app, b.token).chat.completions.create(model="m", messages=messages)
        assert len(b.segments) == 1 and a.segments == [] and a.trajectory.turns == []
        models = await client(app, a.token).models.list()
        assert [m.id for m in models.data] == ["tiny"]
        for token in ("server-key", "raas-guess", ""):  # the server's key is no job token
            with pytest.raises(openai.AuthenticationError) as err:
                await client(app, token or "x").chat.completions.create(
                    model="m", messages=messages
                )
            assert err.value.status_code == 401
            assert isinstance(err.value.body, dict) and err.value.body["code"] == "invalid_api_key"
        gateway.close(a.token)
        with pytest.raises(openai.AuthenticationError):
            await client(app, a.token).chat.completions.create(model="m", messages=messages)
        # A job token opens the gateway's paths, and nothing else of the server.
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as http:
            auth = {"Authorization": f"Bearer {b.token}"}
            assert (await http.get("/v1/rollouts", headers=auth)).status_code == 401
            assert (await http.get("/v1/models", headers=auth)).status_code == 200
    assert len(b.segments) == 1


async def test_a_bad_request_is_an_openai_error_naming_the_field(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        ok: Any = [{"role": "user", "content": "hi"}]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"messages": ok, "temperature": -1}, "temperature"),
            ({"messages": ok, "n": 2}, "n"),
            ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
            ({"messages": ok, "max_tokens": 0}, "max_tokens"),
            ({"messages": ok, "tools": [{"type": "code"}]}, "tools[0].type"),
        ]
        for kwargs, param in cases:
            with pytest.raises(openai.BadRequestError) as err:
                await agent.chat.completions.create(model="m", **kwargs)
            body = err.value.body
            assert isinstance(body, dict) and body["param"] == param, (kwargs, body)
        with pytest.raises(openai.BadRequestError) as err:
            await agent.responses.create(model="m", input=[{"type": "image_generation_call"}])
        assert isinstance(err.value.body, dict) and err.value.body["param"] == "input[0].type"
        auth = {"authorization": f"Bearer {session.token}"}
        status, _, raw = await session.handle("POST", "/v1/chat/completions", auth, b"{nope")
        assert status == 400 and "not valid JSON" in json.loads(raw)["error"]["message"]
        status, _, raw = await session.handle("POST", "/v1/embeddings", auth, b"{}")
        assert status == 404 and json.loads(raw)["error"]["code"] == "unknown_url"
        # The session checks the token itself (the sandbox's relay reaches it whatever is sent).
        for wrong in ({}, {"authorization": "Bearer raas-other"}, {"authorization": "Basic x"}):
            status, _, raw = await session.handle("POST", "/v1/chat/completions", wrong, b"{}")
            assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"
    assert session.calls == 0 and session.segments == []


async def test_stream_true_answers_as_server_sent_events(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += ["Hello" + call("bash", command="ls")]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        stream = await client(app, session.token).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            tools=[BASH],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text == "Hello" and [tc.function.name for tc in calls] == ["bash"]
    assert finish == ["tool_calls"] and chunks[-1].usage is not None


async def test_the_request_overrides_sampling_within_the_jobs_limits(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        seen: list[SamplingParams] = []
        generate = session.llm.generate

        async def spy(job: str, prompt: list[int], params: SamplingParams) -> Any:
            seen.append(params)
            return await generate(job, prompt, params)

        session.llm = type("Spy", (), {"generate": staticmethod(spy)})()
        await client(app, session.token).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            temperature=0.3,
            top_p=0.9,
            max_tokens=10_000,
        )
    assert seen[0].temperature == 0.3 and seen[0].top_p == 0.9 and seen[0].max_tokens == 64


async def test_the_engine_serves_chat_completions_to_the_openai_client() -> None:
    from raas.llm.engine import create_engine_app

    app = create_engine_app("tiny")
    async with app.router.lifespan_context(app):
        agent = openai.AsyncOpenAI(
            base_url="http://engine/v1",
            api_key="none",
            http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)),
        )
        reply = await agent.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Say hi."}],
            tools=[BASH],
            max_tokens=8,
            temperature=0.0,
        )
        assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert reply.usage and 0 < reply.usage.completion_tokens <= 8
        assert reply.usage.prompt_tokens > 20  # the template and the tool's schema
        with pytest.raises(openai.NotFoundError):
            await agent.chat.completions.create(
                model="gpt-9", messages=[{"role": "user", "content": "x"}]
            )


async def test_a_reply_that_re_renders_as_other_tokens_is_counted_as_drift_and_continues(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    # Compact JSON: re-rendering the assistant turn from its parsed call gives other tokens.
    model.answers += ['<tool_call>{"name":"bash","arguments":{"command":"ls"}}</tool_call>', "ok"]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages: list[Any] = [{"role": "user", "content": "ls"}]
        r = await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
        (tc,) = r.choices[0].message.tool_calls or []
        messages += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tc.id, "content": "a.py"},
        ]
        await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
    (seg,) = session.segments
    assert seg.drift == 1 and session.metrics()["gateway_drift"] == 1
    assert [t["drift"] for t in seg.turns] == [False, True]
    # The tokens kept are still exactly what the model generated, in the order it saw them.
    assert [t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == (
        model.generated[0] + model.generated[1]
    )


async def test_the_document_gives_the_gateways_errors_in_openais_shape(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model]
) -> None:
    for key in (None, "server-key"):  # the middleware's 401 (with a key) and the gateway's own
        async with (
            raas_app(tmp_path, registry, backend[0], api_key=key) as (app, _),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost"
            ) as http,
        ):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            spec = (await http.get("/openapi.json", headers=headers)).json()
            for method, path in [("get", "/v1/models"), ("post", "/v1/chat/completions")]:
                r = await http.request(method, path, headers={"Authorization": "Bearer x"})
                assert r.status_code == 401
                documented = spec["paths"][path][method]["responses"]["401"]
                ref = documented["content"]["application/json"]["schema"]["$ref"]
                schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
                assert set(r.json()) == set(schema["required"]) == {"error"}
                assert r.json()["error"]["code"] == "invalid_api_key"


async def test_each_call_records_the_sampling_the_agent_sent_and_the_one_used(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway, temperature=1.0)
        agent = client(app, session.token)
        hi: Any = [{"role": "user", "content": "hi"}]
        await agent.chat.completions.create(
            model="m", messages=hi, temperature=0.3, max_tokens=10_000, stop=["END"]
        )
        await agent.responses.create(model="m", input="hello", top_p=0.5, max_output_tokens=7)
        await agent.chat.completions.create(model="m", messages=hi)
    first, second, third = session.trajectory.turns  # every call's record
    assert first["sampling_sent"] == {"temperature": 0.3, "max_tokens": 10_000, "stop": ["END"]}
    assert first["sampling"]["temperature"] == 0.3 and first["sampling"]["max_tokens"] == 64
    assert second["sampling_sent"] == {"top_p": 0.5, "max_output_tokens": 7}
    assert second["sampling"]["top_p"] == 0.5 and second["sampling"]["max_tokens"] == 7
    assert third["sampling_sent"] == {} and third["sampling"]["temperature"] == 1.0


@pytest.mark.parametrize("fixed", [True, False])
async def test_a_server_that_fixes_sampling_refuses_a_call_that_changes_it(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model, fixed: bool
) -> None:
    settings = {"gateway_fixed_sampling": True} if fixed else {}
    async with raas_app(tmp_path, registry, backend[0], **settings) as (app, gateway):
        session = open_job(gateway, temperature=0.7, top_p=0.95)
        agent = client(app, session.token)
        hi: Any = [{"role": "user", "content": "hi"}]
        changes: list[dict[str, Any]] = [{"temperature": 0.0}, {"top_p": 1.0}, {"seed": 3}]
        for change in changes:
            if not fixed:
                await agent.chat.completions.create(model="m", messages=hi, **change)
                continue
            with pytest.raises(openai.BadRequestError) as err:
                await agent.chat.completions.create(model="m", messages=hi, **change)
            body = err.value.body
            (param,) = change
            assert isinstance(body, dict) and body["param"] == param, body
            assert body["code"] == "sampling_override" and f"{param}=" in body["message"]
        if fixed:
            with pytest.raises(openai.BadRequestError) as err:
                await agent.responses.create(model="m", input="hello", temperature=2.0)
            assert isinstance(err.value.body, dict) and err.value.body["param"] == "temperature"
        # The job's own values, and a smaller max tokens, are no override.
        await agent.chat.completions.create(
            model="m", messages=hi, temperature=0.7, top_p=0.95, max_tokens=5
        )
    assert session.calls == (1 if fixed else 4)


BROKEN = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>'  # a brace short


async def test_a_tool_call_that_cannot_be_read_is_answered_as_text_with_its_error(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    model.answers += ["Let me look.\n" + BROKEN, "ok", BROKEN]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        agent = client(app, session.token)
        messages: list[Any] = [{"role": "user", "content": "ls"}]
        r = await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
        choice = r.choices[0]
        # As vLLM answers a call it cannot parse: the text as the model wrote it, no tool
        # calls; and raas says why, beside it, where the agent (or its user) can act on it.
        assert choice.finish_reason == "stop" and not choice.message.tool_calls
        assert choice.message.content == "Let me look.\n" + BROKEN
        (error,) = (choice.message.model_extra or {})["tool_call_errors"]
        assert error.startswith("tool call 1 is not valid JSON")
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "user", "content": error},  # the agent tells the model, and goes on
        ]
        r = await agent.chat.completions.create(model="m", messages=messages, tools=[BASH])
        assert "tool_call_errors" not in (r.choices[0].message.model_extra or {})
        tool = {"type": "function", "name": "bash", "parameters": {"type": "object"}}
        response = await agent.responses.create(model="m", input="ls", tools=[tool])
    (message,) = response.output
    assert message.type == "message" and message.content[0].text == BROKEN  # type: ignore[union-attr]
    assert len((response.model_extra or {})["tool_call_errors"]) == 1
    first, _ = session.segments  # the Responses call is a conversation of its own
    assert [t["malformed_tool_calls"] for t in first.turns] == [1, 0]
    # The markup kept in the text re-renders as the model's tokens: nothing drifted.
    assert session.drift == 0 and session.trajectory.malformed_tool_calls() == 2
