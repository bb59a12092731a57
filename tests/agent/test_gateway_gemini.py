"""The gateway's Gemini API: requests shaped as the ``@google/genai`` SDK sends them to the Gemini
Developer API (what Gemini CLI is built on; ``generateContentParametersToMldev`` and its
converters), sent with httpx, drive a job's session; raas records its calls as it records chat
completions' (the same tokens, masks and segments)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from raas.api.app import create_app
from raas.llm.gemini_content import CountTokensRequest, GenerateContentRequest
from raas.llm.openai_chat import render_prompt
from raas.llm.openai_types import ChatRequest, read
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from tests.agent import test_gateway
from tests.agent.test_gateway import Model, open_job, raas_app
from tests.support.policies import call

# The chat completions tests' fixtures: the scripted model behind a vLLM-protocol server.
backend, model = test_gateway.backend, test_gateway.model

# As Gemini CLI declares its tools: a JSON schema in parametersJsonSchema.
BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
TOOLS = [{"functionDeclarations": [BASH]}]
# The SDK sends a system instruction given as a string as a user content of one text part.
SYSTEM = {"role": "user", "parts": [{"text": "You are careful."}, {"text": "Be brief."}]}
MODEL_PATH = "/v1beta/models/gemini-2.5-pro"
GENERATE = f"{MODEL_PATH}:generateContent"
STREAM = f"{MODEL_PATH}:streamGenerateContent?alt=sse"
COUNT = f"{MODEL_PATH}:countTokens"


@asynccontextmanager
async def http(app: Any, token: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app``; ``token`` sent as the SDK sends GEMINI_API_KEY: x-goog-api-key."""
    headers = {"x-goog-api-key": token} if token is not None else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", headers=headers
    ) as client:
        yield client


def events(r: httpx.Response) -> list[dict[str, Any]]:
    """A streamed answer's events, read as the SDK reads them (``data:`` lines, blank-line
    delimited)."""
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for event in r.text.replace("\r\n", "\n").split("\n\n"):
        if event.strip():
            assert event.startswith("data:")
            out.append(json.loads(event[len("data:") :]))
    return out


async def test_a_streamed_function_call_and_its_response_are_one_segment_of_the_models_tokens(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    model.answers += ["Let me look.\n" + call("bash", command="ls"), "There are 2 files."]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        contents: list[Any] = [{"role": "user", "parts": [{"text": "How many files?"}]}]
        body = {
            "contents": contents,
            "systemInstruction": SYSTEM,
            "tools": TOOLS,
            "generationConfig": {"temperature": 1.0, "topP": 1.0},
        }
        async with http(app, session.token) as agent:
            r = await agent.post(STREAM, json=body)
            assert r.status_code == 200, r.text
            (first,) = events(r)
            (candidate,) = first["candidates"]
            assert candidate["finishReason"] == "STOP"
            text, called = candidate["content"]["parts"]
            assert candidate["content"]["role"] == "model" and text == {"text": "Let me look."}
            call_ = called["functionCall"]
            assert call_["name"] == "bash" and call_["args"] == {"command": "ls"}
            usage = first["usageMetadata"]
            assert usage["candidatesTokenCount"] == len(model.generated[0])
            # Gemini CLI keeps the model's content, its call's id made its own
            # (<name>__<id>), and answers the call by that id.
            replayed = {**call_, "id": f"bash__{call_['id']}"}
            contents += [
                {"role": "model", "parts": [text, {"functionCall": replayed}]},
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "id": replayed["id"],
                                "name": "bash",
                                "response": {"output": "a.py\nb.py"},
                            }
                        },
                        {"text": "Answer now."},
                    ],
                },
            ]
            r = await agent.post(GENERATE, json=body)
            assert r.status_code == 200, r.text
            second = r.json()
        (candidate,) = second["candidates"]
        assert candidate["finishReason"] == "STOP"
        assert candidate["content"]["parts"] == [{"text": "There are 2 files."}]
        assert second["usageMetadata"]["promptTokenCount"] > usage["promptTokenCount"]

    (seg,) = session.segments  # the function response continued the segment
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


async def test_the_token_as_header_query_key_or_bearer_reaches_the_session(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    model.answers += ["One.", "Two."]
    hi = {"contents": [{"parts": [{"text": "hi"}]}]}
    async with (
        raas_app(tmp_path, registry, backend[0], api_key="server-key") as (app, gateway),
        http(app) as raw,
    ):
        session = open_job(gateway)
        keyed = {"x-goog-api-key": session.token}
        r = await raw.post(GENERATE, json=hi, headers=keyed)
        assert r.status_code == 200 and r.json()["candidates"][0]["content"]["parts"] == [
            {"text": "One."}
        ]
        r = await raw.post(f"{STREAM}&key={session.token}", json=hi)
        assert r.status_code == 200 and events(r)[0]["candidates"][0]["content"]["parts"] == [
            {"text": "Two."}
        ]
        bearer = {"Authorization": f"Bearer {session.token}"}
        r = await raw.post(COUNT, json=hi, headers=bearer)
        assert r.json() == {"totalTokens": len(render_prompt(model.tok, [_user("hi")], None))}
    assert session.calls == 2


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_no_token_is_a_401_in_googles_shape(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    hi = {"contents": [{"parts": [{"text": "hi"}]}]}
    for key in (None, "server-key"):  # the gateway's own 401, and the middleware's
        async with (
            raas_app(tmp_path, registry, backend[0], api_key=key) as (app, gateway),
            http(app) as raw,
        ):
            session = open_job(gateway)
            for path in (GENERATE, STREAM, COUNT):
                for headers in (
                    {},
                    {"x-goog-api-key": "raas-guess"},
                    {"x-goog-api-key": "server-key"},
                ):
                    r = await raw.post(path, json=hi, headers=headers)
                    assert r.status_code == 401, (key, path, headers)
                    assert r.json()["error"]["code"] == 401
                    assert r.json()["error"]["status"] == "UNAUTHENTICATED"
                    assert set(r.json()["error"]) == {"code", "message", "status"}
                r = await raw.post(f"{path.split('?')[0]}?key=raas-guess", json=hi)
                assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
            # Through the session (as the sandbox's relay reaches it), a wrong key too.
            for headers, query in (({"x-goog-api-key": "raas-other"}, ""), ({}, "?key=other")):
                status, _, body = await session.handle("POST", GENERATE + query, headers, b"{}")
                assert status == 401 and json.loads(body)["error"]["status"] == "UNAUTHENTICATED"
            status, _, _ = await session.handle("POST", COUNT + f"?key={session.token}", {}, b"{")
            assert status == 400  # the right key in the query: past the check, a bad body
            assert session.calls == 0


async def test_a_malformed_body_is_a_400_naming_the_field(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    hi = [{"role": "user", "parts": [{"text": "hi"}]}]
    image = {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}
    call_part = {"functionCall": {"name": "bash", "args": {}}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "user", "parts": []}]}, "contents[0].parts"),
        ({"contents": [{"role": "user", "parts": [image]}]}, "contents[0].parts[0].inlineData"),
        ({"contents": [{"role": "user", "parts": [{}]}]}, "contents[0].parts[0]"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"role": "user", "parts": [call_part]}]}, "contents[0]"),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
            "contents[0].parts[0].functionCall.name",
        ),
        ({"contents": hi, "tools": [{"googleSearch": {}}]}, "tools[0]"),
        (
            {"contents": hi, "tools": [{"functionDeclarations": [{"description": "x"}]}]},
            "tools[0].functionDeclarations[0].name",
        ),
        (
            {"contents": hi, "generationConfig": {"temperature": -1}},
            "generationConfig.temperature",
        ),
        (
            {"contents": hi, "generationConfig": {"maxOutputTokens": 0}},
            "generationConfig.maxOutputTokens",
        ),
        (
            {"contents": hi, "generationConfig": {"candidateCount": 2}},
            "generationConfig.candidateCount",
        ),
    ]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        async with http(app, session.token) as agent:
            for path in (GENERATE, STREAM):
                for body, field in cases:
                    r = await agent.post(path, json=body)
                    assert r.status_code == 400, (body, r.text)
                    error = r.json()["error"]
                    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT"), error
                    assert error["message"].startswith(f"{field}:"), (field, error)
            r = await agent.post(GENERATE, content=b"{nope")
            assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
            r = await agent.post(COUNT, json={"contents": []})
            assert r.status_code == 400 and r.json()["error"]["message"].startswith("contents:")
            # The image's field is named, and what is said of it is why.
            r = await agent.post(GENERATE, json={"contents": [{"parts": [image]}]})
            assert "only text, functionCall and functionResponse" in r.json()["error"]["message"]
    assert session.calls == 0


async def test_stop_sequences_max_tokens_and_ignored_thoughts(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    model.answers += ["Hello STOP and more", "one two three four five six seven eight nine ten"]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        contents: list[Any] = [{"role": "user", "parts": [{"text": "hi"}]}]
        async with http(app, session.token) as agent:
            r = await agent.post(
                GENERATE,
                json={"contents": contents, "generationConfig": {"stopSequences": ["STOP"]}},
            )
            first = r.json()
            (candidate,) = first["candidates"]
            assert candidate["finishReason"] == "STOP"
            assert candidate["content"]["parts"] == [{"text": "Hello "}]
            thought = {"text": "hm", "thought": True, "thoughtSignature": "c2ln"}
            contents += [
                {"role": "model", "parts": [thought, *candidate["content"]["parts"]]},
                {"role": "user", "parts": [{"text": "Count."}]},
            ]
            config = {"maxOutputTokens": 4, "thinkingConfig": {"includeThoughts": True}}
            r = await agent.post(STREAM, json={"contents": contents, "generationConfig": config})
            (second,) = events(r)
        assert second["candidates"][0]["finishReason"] == "MAX_TOKENS"
        assert second["usageMetadata"]["candidatesTokenCount"] == 4
    (seg,) = session.segments  # the thought is ignored: the turn continues the segment
    assert "hm" not in model.prompts[1]
    kept = first["usageMetadata"]["candidatesTokenCount"]
    assert [t["output_tokens"] for t in seg.turns] == [kept, 4]
    assert sum(seg.loss_mask) == kept + 4 and kept < len(model.generated[0])


async def test_a_function_call_that_cannot_be_read_is_text_with_its_error_streamed_or_not(
    tmp_path: Path,
    registry: TaskRegistry,
    backend: tuple[str, Model],
    model: Model,
) -> None:
    broken = '<tool_call>{"name": "bash", "arguments": "ls"}</tool_call>'  # arguments not JSON
    model.answers += [broken, broken]
    contents: list[Any] = [{"role": "user", "parts": [{"text": "ls"}]}]
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        async with http(app, session.token) as agent:
            ask = {"contents": contents, "tools": TOOLS}
            plain = (await agent.post(GENERATE, json=ask)).json()
            (streamed,) = events(await agent.post(STREAM, json=ask))
    for answer in (plain, streamed):
        (candidate,) = answer["candidates"]  # no functionCall: the call as the model wrote it
        assert candidate["content"]["parts"] == [{"text": broken}]
        assert candidate["finishReason"] == "STOP"
        assert answer["tool_call_errors"] == ["tool call 1: arguments is a string, not JSON"]
    assert [t["malformed_tool_calls"] for t in session.trajectory.turns] == [1, 1]


async def test_no_backend_is_googles_503_unavailable_as_documented(
    tmp_path: Path, registry: TaskRegistry
) -> None:
    app = create_app(ServeSettings(db=tmp_path / "gw.db", tokenizer="tiny"), registry)
    async with app.router.lifespan_context(app), http(app) as raw:
        session = open_job(app.state.service.gateway)
        body = {"contents": [{"parts": [{"text": "hi"}]}]}
        r = await raw.post(GENERATE, json=body, headers={"x-goog-api-key": session.token})
        assert r.status_code == 503 and r.json()["error"]["status"] == "UNAVAILABLE"
        spec = (await raw.get("/openapi.json")).json()
        for method, statuses in [
            ("generateContent", {"200", "400", "401", "503"}),
            ("streamGenerateContent", {"200", "400", "401", "503"}),
            ("countTokens", {"200", "400", "401"}),
        ]:
            documented = spec["paths"][f"/v1beta/models/{{model}}:{method}"]["post"]["responses"]
            assert statuses <= set(documented), method
        documented = spec["paths"]["/v1beta/models/{model}:generateContent"]["post"]["responses"]
        ref = documented["503"]["content"]["application/json"]["schema"]["$ref"]
        schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert set(r.json()) == set(schema["required"]) == {"error"}


def test_a_gemini_request_is_the_chat_conversation_it_says() -> None:
    """The translation: what Gemini's shapes say is what OpenAI's would, message for message,
    so both are rendered, generated and merged alike."""
    contents = [
        {"role": "user", "parts": [{"text": "Count"}, {"text": "the files."}]},
        {
            "role": "model",
            "parts": [
                {"text": "ls will do", "thought": True},
                {"text": "Looking"},
                {"text": "."},
                {"functionCall": {"name": "bash", "args": {"command": "ls"}}},
                {"functionCall": {"name": "cat", "args": {"path": "a"}, "id": "c9"}},
            ],
        },
        {
            "role": "user",
            "parts": [
                # Answered out of order, one by its id, one by its name (no id).
                {"functionResponse": {"id": "c9", "name": "cat", "response": {"error": "no a"}}},
                {"functionResponse": {"name": "bash", "response": {"output": "a b"}}},
                {"functionResponse": {"name": "wc", "response": {"lines": 2}}},
                {"text": "Go on."},
            ],
        },
    ]
    # A Gemini Schema (types in upper case), as the SDK sends ``parameters``.
    cat = {
        "name": "cat",
        "parameters": {
            "type": "OBJECT",
            "properties": {
                "path": {"type": "STRING"},
                "lines": {"type": "ARRAY", "items": {"type": "INTEGER"}},
            },
        },
    }
    body = {
        "contents": contents,
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [BASH, cat]}],
    }

    def function_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"id": call_id, "type": "function", "function": function}

    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Count\nthe files."},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    function_call("call_0", "bash", {"command": "ls"}),
                    function_call("c9", "cat", {"path": "a"}),
                ],
            },
            {"role": "tool", "tool_call_id": "c9", "content": "Error: no a"},
            {"role": "tool", "tool_call_id": "call_0", "content": "a b"},
            {"role": "tool", "tool_call_id": "wc", "content": '{"lines": 2}'},
            {"role": "user", "content": "Go on."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "bash",
                    "description": BASH["description"],
                    "parameters": BASH["parametersJsonSchema"],
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "cat",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string"},
                            "lines": {"type": "array", "items": {"type": "integer"}},
                        },
                    },
                },
            },
        ],
    }
    request = read(GenerateContentRequest, json.dumps(body).encode())
    same = read(ChatRequest, json.dumps(chat).encode())
    assert request.conversation() == same.conversation()
    assert request.shown_tools() == same.shown_tools()
    # The tool messages keep the ids above (canonical messages compare them as they are).
    assert [m.get("tool_call_id") for m in request.conversation()[3:6]] == ["c9", "call_0", "wc"]
    none = {**body, "toolConfig": {"functionCallingConfig": {"mode": "NONE"}}}
    assert read(GenerateContentRequest, json.dumps(none).encode()).shown_tools() is None
    # countTokens: the SDK's contents alone, or a whole request.
    alone = read(CountTokensRequest, json.dumps({"contents": contents}).encode())
    assert alone.conversation() == same.conversation()[1:] and alone.shown_tools() is None
    whole = read(CountTokensRequest, json.dumps({"generateContentRequest": body}).encode())
    assert whole.shown_tools() == same.shown_tools()


async def test_a_call_records_the_sampling_it_sent_and_a_fixed_server_refuses_a_change(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    async with raas_app(tmp_path, registry, backend[0], gateway_fixed_sampling=True) as (
        app,
        gateway,
    ):
        session = open_job(gateway, temperature=0.7)
        hi = [{"role": "user", "parts": [{"text": "hi"}]}]
        async with http(app, session.token) as agent:
            refused = {"contents": hi, "generationConfig": {"temperature": 0.7, "topP": 0.95}}
            r = await agent.post(GENERATE, json=refused)
            assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
            assert r.json()["error"]["message"].startswith("generationConfig.topP:")
            config = {"temperature": 0.7, "maxOutputTokens": 5, "stopSequences": ["END"]}
            r = await agent.post(GENERATE, json={"contents": hi, "generationConfig": config})
            assert r.status_code == 200, r.text
    (turn,) = session.trajectory.turns
    assert turn["sampling_sent"] == config
    assert turn["sampling"]["max_tokens"] == 5 and turn["sampling"]["temperature"] == 0.7


async def test_paths_are_read_as_the_server_routes_them(
    tmp_path: Path, registry: TaskRegistry, backend: tuple[str, Model], model: Model
) -> None:
    """A model's name may hold a colon (the method is the last one), and a "#" (sent as %23);
    an unknown method is no route of the gateway's: the session answers 404 in Google's
    shape."""
    body = {"contents": [{"parts": [{"text": "hi"}]}]}
    async with raas_app(tmp_path, registry, backend[0]) as (app, gateway):
        session = open_job(gateway)
        async with http(app, session.token) as agent:
            for path in ("/v1beta/models/a:b:generateContent", "/v1beta/models/a%23b:countTokens"):
                r = await agent.post(path, json=body)
                assert r.status_code == 200, (path, r.text)
        keyed = {"x-goog-api-key": session.token}
        status, _, answer = await session.handle(
            "POST", "/v1beta/models/x:nope", keyed, json.dumps(body).encode()
        )
        assert status == 404 and json.loads(answer)["error"]["status"] == "NOT_FOUND"
    assert session.calls == 1
