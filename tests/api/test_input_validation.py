"""Bad numbers and bad fields are 422s naming the value, never 500s, over real request handling.

Python's json (which FastAPI uses) reads NaN, Infinity, -Infinity and 1e999 (as inf), so a
body can hold them; httpx refuses NaN in ``json=``, so these bodies go as raw text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from raas.tasks.code import CodeTask
from tests.support.llm_servers import ServerThread
from tests.support.probe import probe_instance

COUNTDOWN = {"data_source": "countdown", "numbers": [3, 4, 100], "target": 7}
CODE = {"data_source": "code", "prompt": "def f():\n", "entry_point": "f", "test": "pass"}
# What json.loads makes of the raw tokens: NaN, Infinity, -Infinity, and 1e999 (inf).
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999"]


def raw(body: dict[str, Any], **values: str) -> str:
    """``body`` as JSON text, with each placeholder ``"@name"`` replaced by a raw token."""
    text = json.dumps(body)
    for name, token in values.items():
        text = text.replace(f'"@{name}"', token)
    return text


@pytest.fixture
def app(tmp_path: Path, registry: TaskRegistry) -> Any:
    registry.register(CodeTask())  # validation only: no job of it is run here
    return create_app(ServeSettings(db=tmp_path / "v.db", cancel_grace_s=0.05), registry)


@pytest.fixture
async def http(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)  # an app exception would be raised here
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


async def post(http: httpx.AsyncClient, path: str, text: str) -> httpx.Response:
    return await http.post(path, content=text, headers={"content-type": "application/json"})


async def still_works(http: httpx.AsyncClient) -> None:
    """The next, valid request on the same client is answered normally."""
    r = await http.post("/v1/rollouts", json={"instance": probe_instance()})
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("token", NON_FINITE)
@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"instance": COUNTDOWN, "timeout_s": "@x"}, ["body", "timeout_s"]),
        (
            {"instance": COUNTDOWN, "sampling_params": {"seed": "@x"}},
            ["body", "sampling_params", "seed"],
        ),
        (
            {"instance": COUNTDOWN, "sampling_params": {"max_turns": "@x"}},
            ["body", "sampling_params", "max_turns"],
        ),
        (
            {"instance": {**COUNTDOWN, "numbers": [3, "@x", 100]}},
            ["body", "instance", "numbers", 1],
        ),
        (
            {"instance": {**probe_instance(), "extra_info": {"w": [0.5, "@x"]}}},
            ["body", "instance", "extra_info", "w", 1],
        ),
        ({"instance": COUNTDOWN, "priority": "@x"}, ["body", "priority"]),
    ],
)
async def test_non_finite_numbers_are_a_422_at_the_value(
    http: httpx.AsyncClient, body: dict[str, Any], loc: list[str | int], token: str
) -> None:
    r = await post(http, "/v1/rollouts", raw(body, x=token))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == loc
    # The bad value is echoed by name (JSON cannot hold it as a number).
    assert error["input"] == ("NaN" if token == "NaN" else token.replace("1e999", "Infinity"))
    await still_works(http)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"instance": {**COUNTDOWN, "note": "@x"}}, ["body", "instance", "note"]),
        ({"instance": {**COUNTDOWN, "@x": 1}}, ["body", "instance", "a\\ud800b"]),
        (
            {"instance": COUNTDOWN, "sampling_params": {"stop": ["ok", "@x"]}},
            ["body", "sampling_params", "stop", 1],
        ),
    ],
)
async def test_a_lone_surrogate_is_a_422_at_the_text(
    http: httpx.AsyncClient, body: dict[str, Any], loc: list[str | int]
) -> None:
    # JSON's escape of half a surrogate pair reads as a str no UTF-8 store can hold: it was a 500
    # at the store's write, after the request had been taken.
    r = await post(http, "/v1/rollouts", raw(body, x='"a\\ud800b"'))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == loc
    assert error["type"] == "unicode_text"
    assert (await http.get("/v1/status")).json()["in_flight"] == 0
    await still_works(http)


async def test_text_beyond_ascii_and_a_whole_surrogate_pair_are_accepted(
    http: httpx.AsyncClient,
) -> None:
    # The control: "\ud83d\ude00" is one character (an emoji) once read, and é is plain text.
    instance = {**probe_instance(), "note": "@x"}
    r = await post(
        http, "/v1/rollouts", raw({"instance": instance}, x='"caf\\u00e9 \\ud83d\\ude00"')
    )
    assert r.status_code == 202, r.text


async def test_the_batch_names_the_job_and_the_key(http: httpx.AsyncClient) -> None:
    good = {"instance": probe_instance()}
    jobs = [good, good, good, {"instance": COUNTDOWN, "sampling_params": {"seed": "@x"}}]
    r = await post(http, "/v1/rollouts:batch", raw({"jobs": jobs}, x="NaN"))
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "jobs", 3, "sampling_params", "seed"]
    # A finite seed out of range is the task's to reject, located the same way.
    jobs[3] = {"instance": COUNTDOWN, "sampling_params": {"seed": 2**64}}
    r = await http.post("/v1/rollouts:batch", json={"jobs": jobs})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "jobs", 3, "sampling_params", "seed"]
    assert (await http.get("/v1/status")).json()["in_flight"] == 0  # none of them accepted
    await still_works(http)


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        (
            {"instance": CODE, "sampling_params": {"max_turnz": 3}},
            ["body", "sampling_params", "max_turnz"],
            ["unknown key", "max_turns", "max_context_tokens", "top_p"],
        ),
        (
            {"instance": COUNTDOWN, "sampling_params": {"max_turnz": 3}},
            ["body", "sampling_params", "max_turnz"],
            ["unknown key", "countdown takes max_turns, seed, temperature"],
        ),
        (
            {"instance": CODE, "sampling_params": {"max_turns": 2.5}},
            ["body", "sampling_params", "max_turns"],
            ["integer"],
        ),
        (
            {"instance": COUNTDOWN, "sampling_params": {"max_turns": 2.5}},
            ["body", "sampling_params", "max_turns"],
            ["integer"],
        ),
        (
            {"instance": CODE, "sampling_params": {"seed": 99999999999999999999999}},
            ["body", "sampling_params", "seed"],
            ["less than or equal"],
        ),
        (
            {"instance": CODE, "sampling_params": {"stop_token_ids": [2, -1]}},
            ["body", "sampling_params", "stop_token_ids", 1],
            ["greater than or equal"],
        ),
        (
            {"instance": {k: v for k, v in CODE.items() if k != "entry_point"}},
            ["body", "instance", "entry_point"],
            ["required"],
        ),
        (
            {"instance": {**COUNTDOWN, "numbers": [3, 4.5]}},
            ["body", "instance", "numbers", 1],
            ["integer"],
        ),
    ],
)
async def test_bad_fields_are_a_422_located_by_the_model(
    http: httpx.AsyncClient, body: dict[str, Any], loc: list[str | int], words: list[str]
) -> None:
    r = await http.post("/v1/rollouts", json=body)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == loc
    assert all(w in error["msg"] for w in words), error["msg"]
    # ProRL's /process goes through the same checks, and answers the same way.
    r = await http.post("/process", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc


async def test_a_field_takes_its_own_json_type(http: httpx.AsyncClient) -> None:
    for field, value in [("priority", False), ("priority", "5"), ("timeout_s", "5")]:
        r = await http.post("/v1/rollouts", json={"instance": COUNTDOWN, field: value})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field]
    r = await http.post("/v1/backends", json={"url": "http://h:1", "capacity": "4"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "capacity"]
    # An integer is one however JSON writes it, in a task's instance and sampling_params too.
    whole = {**COUNTDOWN, "target": float(COUNTDOWN["target"])}
    r = await http.post("/v1/rollouts", json={"instance": whole, "sampling_params": {"seed": 3.0}})
    assert r.status_code == 202, r.text
    r = await http.post("/v1/backends", json={"url": "http://h:1", "capacity": 4.0})
    assert r.status_code == 201 and r.json()["capacity"] == 4
    await still_works(http)


async def test_process_refuses_non_finite_numbers(http: httpx.AsyncClient) -> None:
    for name, value in [("seed", "1e999"), ("temperature", "NaN"), ("max_turns", "-Infinity")]:
        body = {"instance": COUNTDOWN, "sampling_params": {name: "@x"}}
        r = await post(http, "/process", raw(body, x=value))
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "sampling_params", name]
    await still_works(http)


async def test_query_numbers_are_bounded(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()["paths"]
    # Every cursor is an SQLite INTEGER: past 64 bits a 422 (not the store's OverflowError),
    # and the document says the bound.
    for path, name in [("/v1/rollouts", "since"), ("/v1/dashboard/jobs", "before")]:
        r = await http.get(path, params={name: "14620845689730158751314345984"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", name]
        assert (await http.get(path, params={name: 2**63 - 1})).status_code == 200
        (param,) = [p for p in spec[path]["get"]["parameters"] if p["name"] == name]
        assert f'"maximum": {2**63 - 1}' in json.dumps(param["schema"])
    for wait in ("nan", "inf"):
        r = await http.get("/v1/rollouts/nope", params={"wait": wait})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "wait"]
    await still_works(http)


async def test_a_query_key_given_twice_is_a_422_at_the_key(http: httpx.AsyncClient) -> None:
    # FastAPI reads the last of a repeated scalar key: "[]" then 0.5 would be read as 0.5.
    twice = [("min_reward", "[]"), ("min_reward", "0.5")]
    r = await http.get("/v1/dashboard/jobs", params=twice)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "min_reward"]
    assert (await http.get("/v1/dashboard/jobs", params=twice[1:])).status_code == 200
    # A key the route does not take is ignored, once or twice, as FastAPI ignores it.
    unknown = [("min_reward", "0.5"), ("x", "1"), ("x", "2")]
    assert (await http.get("/v1/dashboard/jobs", params=unknown)).status_code == 200
    r = await http.get("/v1/rollouts", params=[("since", "1"), ("limit", "2"), ("since", "1")])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "since"]
    await still_works(http)


@pytest.fixture
def server(app: Any) -> Iterator[ServerThread]:
    thread = ServerThread(app).start()
    try:
        yield thread
    finally:
        thread.stop()


def test_a_non_finite_body_leaves_the_keep_alive_connection_usable(server: ServerThread) -> None:
    """Over a real socket: the 422 is written whole and the server keeps the connection."""
    conn = HTTPConnection("127.0.0.1", server.port, timeout=10)
    headers = {"content-type": "application/json"}
    try:
        conn.request(
            "POST",
            "/v1/rollouts",
            raw({"instance": COUNTDOWN, "timeout_s": "@x"}, x="NaN"),
            headers,
        )
        sock = conn.sock
        bad = conn.getresponse()
        assert bad.status == 422 and json.loads(bad.read())["detail"][0]["input"] == "NaN"
        conn.request("POST", "/v1/rollouts", json.dumps({"instance": COUNTDOWN}), headers)
        good = conn.getresponse()
        assert good.status == 202 and json.loads(good.read())["created"] is True
        assert conn.sock is sock  # the same connection answered both
    finally:
        conn.close()
