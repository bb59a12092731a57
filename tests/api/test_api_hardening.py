"""The API's edges: auth before anything, a body size limit, job ids and backend URLs that are
usable, 405s that name every method, and an OpenAPI document that lists what the routes answer."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.api.auth import COOKIE
from raas.settings import ServeSettings, SettingsError, load_settings
from raas.tasks import TaskRegistry
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
COUNTDOWN = {"data_source": "countdown", "numbers": [3, 4, 100], "target": 7}
Seen = set[tuple[str, str, int]]
Client = Callable[..., Any]


@pytest.fixture
def seen() -> Seen:
    """(method, path, status) of every response the ``client`` fixture's clients got."""
    return set()


@pytest.fixture
def client(tmp_path: Path, registry: TaskRegistry, seen: Seen) -> Client:
    @asynccontextmanager
    async def make(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
        defaults: dict[str, Any] = {"db": tmp_path / "api.db", "cancel_grace_s": 0.05}
        app = create_app(ServeSettings(**{**defaults, **settings}), registry)

        async def record(response: httpx.Response) -> None:
            request = response.request
            seen.add((request.method, request.url.path, response.status_code))

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)  # an app exception (a 500) is raised here
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost", event_hooks={"response": [record]}
            ) as http:
                yield http

    return make


async def call_asgi(
    settings: ServeSettings, registry: TaskRegistry, path: str, headers: list[tuple[bytes, bytes]]
) -> tuple[int, bytes, bool]:
    """One POST straight into the app: its status, its body, and whether it read the body."""
    app = create_app(settings, registry)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("localhost", 80),
    }
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        # The body is far shorter than declared, so that an app that reads it still finishes.
        nonlocal read
        read += 1
        return {"type": "http.request", "body": b"x" * 2**16, "more_body": read < 4}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body, read > 0


# -- auth ---------------------------------------------------------------------------------------


async def test_a_non_ascii_token_is_a_401_and_a_non_ascii_key_works(client: Client) -> None:
    async with client(api_key=KEY) as http:
        r = await http.get("/v1/status", headers={"Authorization": "Bearer ключ".encode()})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    async with client(api_key="ключ") as http:
        ok = await http.get("/v1/status", headers={"Authorization": "Bearer ключ".encode()})
        assert ok.status_code == 200
        assert (await http.get("/v1/status", headers=AUTH)).status_code == 401


async def test_the_key_is_checked_before_the_body_and_on_every_path(client: Client) -> None:
    async with client(api_key=KEY) as http:
        bad_json = await http.post(
            "/v1/rollouts", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad_json.status_code == 401, bad_json.text
        assert bad_json.json()["detail"].startswith("missing or wrong API key")
        for path in ("/docs", "/redoc", "/openapi.json", "/no/such/path"):
            assert (await http.get(path)).status_code == 401, path
        assert (await http.get("/openapi.json", headers=AUTH)).status_code == 200
        assert (await http.get("/healthz")).status_code == 200


async def test_a_huge_body_without_the_key_is_never_read(
    tmp_path: Path, registry: TaskRegistry
) -> None:
    settings = ServeSettings(db=tmp_path / "x.db", api_key=KEY)
    length = str(100 * 2**20).encode()
    status, _, read = await call_asgi(
        settings, registry, "/v1/rollouts", [(b"content-length", length)]
    )
    assert status == 401 and not read


# -- a server without a key, against web pages ---------------------------------------------------

FOREIGN_PAGE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) Chrome/156.0"


async def test_a_keyless_server_answers_only_to_its_own_names(client: Client) -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 reads the API
    as its own origin; its requests still say ``Host: evil.example``."""
    async with client(allowed_hosts=["raas.internal"]) as http:
        for host in ("evil.example", "evil.example:8000", "localhost.evil.example", "", "[::2]"):
            for path in ("/v1/status", "/v1/rollouts", "/healthz", "/ui", "/openapi.json"):
                r = await http.get(path, headers={"Host": host})
                assert r.status_code == 403, (host, path, r.text)
            assert "not a name of this server" in r.json()["detail"]
        r = await http.post("/stop", headers={"Host": "evil.example"})
        assert r.status_code == 403 and (await http.get("/v1/status")).json()["accepting"]
        for host in ("localhost", "LOCALHOST:8000", "127.0.0.1:9", "[::1]:8000", "raas.internal"):
            assert (await http.get("/v1/status", headers={"Host": host})).status_code == 200, host
    async with client(api_key=KEY) as http:  # a key guards it: any name leads there
        r = await http.get("/v1/status", headers={"Host": "raas.example.org", **AUTH})
        assert r.status_code == 200


async def test_a_page_on_another_origin_changes_nothing(client: Client, probe: ProbeTask) -> None:
    """What a form or a no-cors fetch of another page sends, refused on every route that changes
    something; a program's request (no Origin) and the server's own pages' pass."""
    async with client() as http:
        job = {"instance": probe_instance(run="block"), "job_id": "held"}
        assert (await http.post("/v1/rollouts", json=job)).status_code == 202
        await probe.wait_entered("held", "run")
        assert (await http.post("/v1/backends", json={"url": "http://127.0.0.1:9"})).is_success
        attempts = [
            ("/stop", {**FOREIGN_PAGE, "Content-Type": "application/x-www-form-urlencoded"}),
            ("/stop", {"Origin": "null", "User-Agent": BROWSER}),
            ("/stop", {"Sec-Fetch-Site": "same-site", "Origin": "http://localhost:9000"}),
            ("/stop", {"User-Agent": BROWSER}),  # a browser that did not say where from
            ("/clear_llm_server", {**FOREIGN_PAGE, "Content-Type": "text/plain"}),
            ("/v1/rollouts/held/cancel", FOREIGN_PAGE),
            ("/cancel", {**FOREIGN_PAGE, "Content-Type": "text/plain"}),
        ]
        for path, headers in attempts:
            r = await http.post(path, headers=headers, content=b'{"job_id": "held"}')
            assert r.status_code == 403, (path, headers, r.text)
            assert "another web page" in r.json()["detail"]
        blob = {"instance": probe_instance(), "job_id": "planted"}  # a Blob has no type
        r = await http.post("/v1/rollouts", headers=FOREIGN_PAGE, content=json.dumps(blob))
        assert r.status_code == 403
        # A form from no page at all is no API request either.
        r = await http.post("/stop", data={"a": "1"})
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["detail"]
        status = (await http.get("/v1/status")).json()
        assert status["accepting"] and status["llm_servers"] == ["http://127.0.0.1:9"]
        assert (await http.get("/v1/rollouts/held")).json()["state"] == "run"
        assert (await http.get("/v1/rollouts/planted")).status_code == 404

        # The server's own page (/docs' "try it out"), and programs, as ProRL's send them.
        own = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin", "User-Agent": BROWSER}
        assert (await http.post("/stop", headers=own)).status_code == 200
        assert (await http.post("/start")).status_code == 200
        assert (await http.post("/clear_llm_server")).status_code == 200
        cancelled = await http.post("/v1/rollouts/held/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"


async def test_the_sign_in_form_is_taken_from_the_servers_own_page_only(client: Client) -> None:
    async with client(api_key=KEY) as http:
        own = {"Origin": "http://localhost", "User-Agent": BROWSER}
        r = await http.post("/ui/login", data={"key": KEY}, headers=own)
        assert r.status_code == 303 and COOKIE in r.cookies
        http.cookies.clear()
        r = await http.post("/ui/login", data={"key": KEY}, headers=FOREIGN_PAGE)
        assert r.status_code == 403 and COOKIE not in r.cookies
    # Behind a proxy that sends its own Host, the page's name is one the operator allows.
    proxied = {"Origin": "https://raas.example", "Host": "127.0.0.1:8000", "User-Agent": BROWSER}
    for allowed, status in (([], 403), (["raas.example"], 303)):
        async with client(api_key=KEY, allowed_hosts=allowed) as http:
            r = await http.post("/ui/login", data={"key": KEY}, headers=proxied)
            assert r.status_code == status, allowed


# -- the body size limit ------------------------------------------------------------------------


async def test_a_declared_body_over_the_limit_is_413_unread(
    tmp_path: Path, registry: TaskRegistry
) -> None:
    settings = ServeSettings(db=tmp_path / "x.db", max_body_mb=1)
    length = str(100 * 2**20).encode()
    headers = [(b"content-length", length), (b"content-type", b"application/json")]
    status, body, read = await call_asgi(settings, registry, "/v1/rollouts", headers)
    assert status == 413 and not read
    assert b"1 MiB" in body and b"max_body_mb" in body


async def test_a_chunked_body_is_stopped_at_the_limit(client: Client) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"instance": {"data_source": "probe", "pad": "'
        for _ in range(100):
            sent += 1
            yield b"x" * 2**16
        yield b'"}}'

    async with client(max_body_mb=0.5) as http:
        r = await http.post(
            "/v1/rollouts", content=chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413, r.text
        (line,) = r.json()["detail"].splitlines()
        assert "0.5 MiB" in line and "max_body_mb" in line
        assert sent <= 9  # 0.5 MiB is 8 chunks: reading stopped right after
        small = await http.post("/v1/rollouts", json={"instance": probe_instance()})
        assert small.status_code == 202


# -- job ids ------------------------------------------------------------------------------------

BAD_JOB_IDS = ["a/b", "a\nforged log line", "", "x" * 201, ".", "..", "a b", "é", "a?b"]


@pytest.mark.parametrize("job_id", BAD_JOB_IDS)
async def test_a_job_id_must_be_usable_in_a_url(client: Client, job_id: str) -> None:
    async with client() as http:
        one = {"instance": probe_instance(), "job_id": job_id}
        for path, body, loc in [
            ("/v1/rollouts", one, ["body", "job_id"]),
            ("/process", one, ["body", "job_id"]),
            ("/v1/rollouts:batch", {"jobs": [one]}, ["body", "jobs", 0, "job_id"]),
            ("/cancel", {"job_id": job_id}, ["body", "job_id"]),
        ]:
            r = await http.post(path, json=body)
            assert r.status_code == 422, (path, r.text)
            (error,) = r.json()["detail"]
            assert error["loc"] == loc and "\n" not in error["msg"]


async def test_good_job_ids_are_reachable(client: Client) -> None:
    async with client() as http:
        for job_id in ["a.b:c-d_1", "x" * 200, "-", "1..2", "inst@traj-0"]:
            r = await http.post(
                "/v1/rollouts", json={"instance": probe_instance(), "job_id": job_id}
            )
            assert r.status_code == 202, r.text
            got = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S})
            assert got.status_code == 200 and got.json()["job_id"] == job_id


# -- backend URLs -------------------------------------------------------------------------------

BAD_URLS = [
    "http://bad\u0001host:1",
    "http://bad host:1",
    "http://:8000",
    "http://h:99999",
    "http://h:port",
    "ftp://h:1",
    "http://h:1/?q=1",
    "http://bücher.example",
    "http://xn--a.example",
    "http://1-2-3-4:8000",  # httpx reads a host of four digit runs as an IPv4 address
    "http://999.1.1.1",
    "http://[::1:8000",
    " http://h:1",
    "http://h:0",
]
GOOD_URLS = [
    "http://gpu1:8000/v1",
    "https://node-3.cluster.example./prefix/v1/",
    "10.0.0.2:8000",
    "http://[fe80::1]:30000",
    "http://[1:2:3:4:5:6:7:8]",
    "localhost:65535/a://b",
]


@pytest.mark.parametrize("url", BAD_URLS)
async def test_a_backend_url_the_client_cannot_use_is_a_422(client: Client, url: str) -> None:
    async with client() as http:
        r = await http.post("/v1/backends", json={"url": url})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "url"]
        r = await http.post("/add_llm_server", json={"address": url})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "address"]
        assert (await http.get("/v1/backends")).json() == []


async def test_the_document_says_what_a_backend_url_may_be(client: Client) -> None:
    async with client() as http:
        spec = (await http.get("/openapi.json")).json()["components"]["schemas"]
        pattern = spec["BackendIn"]["properties"]["url"]["pattern"]
        assert spec["LLMServerRequest"]["properties"]["address"]["pattern"] == pattern
        for url in BAD_URLS:  # but bad punycode, which no pattern can tell
            assert re.fullmatch(pattern, url) is None or "xn--" in url, url
        for url in GOOD_URLS:  # what the pattern admits the server takes
            assert re.fullmatch(pattern, url), url
            r = await http.post("/v1/backends", json={"url": url})
            assert r.status_code == 201, r.text
            assert (await http.post("/add_llm_server", json={"address": url})).status_code == 200


def test_a_bad_llm_setting_fails_in_one_line() -> None:
    with pytest.raises(SettingsError) as e:
        load_settings(None, {"llm": ["http://gpu1:8000", "http://bad\u0001host:1"]})
    (line,) = str(e.value).splitlines()
    assert "llm.1" in line and "control characters" in line


# -- 422s, 405s and the OpenAPI document --------------------------------------------------------


async def test_a_bad_state_filter_is_a_422_like_any_other(client: Client) -> None:
    async with client() as http:
        r = await http.get("/v1/rollouts", params={"state": "queued"})
    assert r.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == ["query", "state"] and "done" in error["msg"]


async def test_an_unreadable_body_is_a_422_not_a_400(client: Client) -> None:
    json_type = {"content-type": "application/json"}
    async with client() as http:
        for content in [b'{"instance": "\xff"}', b"[" * 100_000]:
            r = await http.post("/v1/rollouts", content=content, headers=json_type)
            assert r.status_code == 422, r.text
            (error,) = r.json()["detail"]
            assert error["loc"] == ["body"] and error["type"] == "json_invalid"


def concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", template)


async def test_a_405_names_every_method_of_the_path(client: Client) -> None:
    async with client() as http:
        spec = (await http.get("/openapi.json")).json()
        for template, operations in spec["paths"].items():
            served = {m.upper() for m in operations}
            for method in ("OPTIONS", "PUT", "PATCH"):
                r = await http.request(method, concrete(template))
                assert r.status_code == 405, (method, template)
                assert set(r.headers["allow"].split(", ")) == served, (template, r.headers)
        assert len(spec["paths"]) > 10  # the walk saw the paths


def documented(spec: dict[str, Any], method: str, path: str) -> set[int] | None:
    """The statuses the document lists for the operation serving ``path``; None if none does."""
    for template, operations in spec["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path) and method.lower() in operations:
            return {int(code) for code in operations[method.lower()]["responses"]}
    return None


async def test_every_status_the_routes_answer_is_documented(
    client: Client, probe: ProbeTask, seen: Seen
) -> None:
    async with client(api_key=KEY, init_workers=1, init_queue=1, max_body_mb=0.01) as http:
        http.headers.update(AUTH)
        spec = (await http.get("/openapi.json")).json()
        await http.get("/healthz")
        await http.get("/v1/status", headers={"Authorization": "Bearer nope"})
        await http.post("/process", content=b"x" * 20_000)
        blocker = {"instance": probe_instance(init="block"), "job_id": "a"}
        assert (await http.post("/v1/rollouts", json=blocker)).status_code == 202
        await probe.wait_entered("a", "init")
        assert (await http.post("/v1/rollouts", json=blocker)).status_code == 200
        conflict = {**blocker, "instance": probe_instance()}
        assert (await http.post("/v1/rollouts", json=conflict)).status_code == 409
        await http.post("/v1/rollouts", json={"instance": probe_instance(), "job_id": "b"})
        full = [{"instance": probe_instance()}]
        assert (await http.post("/v1/rollouts", json=full[0])).status_code == 429
        assert (await http.post("/v1/rollouts:batch", json={"jobs": full})).status_code == 429
        assert (await http.post("/process", json=full[0])).status_code == 429
        assert (await http.post("/v1/rollouts:batch", json={"jobs": []})).status_code == 422
        await http.post("/process", json={"instance": COUNTDOWN, "job_id": "a"})
        await http.get("/v1/rollouts/nope")
        await http.get("/v1/rollouts/a", params={"wait": -1})
        await http.post("/v1/rollouts/nope/cancel")
        await http.post("/cancel", json={"job_id": "nope"})
        await http.post("/cancel", json={})
        await http.get("/v1/rollouts", params={"state": "queued"})
        await http.get("/v1/rollouts", params={"state": "done"})
        await http.get("/metrics")
        await http.get("/status")
        added = await http.post("/v1/backends", json={"url": "http://127.0.0.1:9"})
        await http.post("/v1/backends", json={"url": "http://bad\u0001host:1"})
        await http.get("/v1/backends")
        await http.delete(f"/v1/backends/{added.json()['id']}")
        await http.delete("/v1/backends/nope")
        await http.post("/add_llm_server", json={"address": "http://127.0.0.1:9"})
        await http.post("/add_llm_server", json={"address": "http://:9"})
        await http.post("/clear_llm_server")
        await http.get("/ui")
        await http.get("/ui", params={"key": KEY})
        await http.get("/ui", headers={"Authorization": "Bearer nope"})
        await http.post("/ui/login", data={"key": KEY})
        await http.post("/ui/login", data={"key": "nope"})
        await http.post("/ui/login")
        await http.get("/ui/assets/app.js")
        await http.get("/ui/assets/nope.js")
        await http.get("/v1/dashboard/stats")
        await http.get("/v1/dashboard/jobs", params={"state": "done"})
        await http.get("/v1/dashboard/jobs", params={"limit": 0})
        await http.get("/v1/dashboard/jobs/a/tokens")
        await http.get("/v1/dashboard/jobs/nope/tokens")
        probe.release("a", "init")
        await http.post("/stop", headers=FOREIGN_PAGE)
        await http.post("/stop", data={"a": "1"})
        await http.get("/v1/status", headers={"Host": "evil.example", "Authorization": "Bearer x"})
        await http.post("/stop")
        await http.post("/v1/rollouts", json={"instance": probe_instance()})
        await http.post("/v1/rollouts:batch", json={"jobs": full})
        await http.post("/process", json={"instance": probe_instance()})
        await http.post("/start")
        await http.post("/process", json={"instance": probe_instance()})
    statuses = {status for _, _, status in seen}
    assert {200, 201, 202, 204, 303, 401, 403, 404, 409, 413, 415, 422, 429, 503} <= statuses
    undocumented = sorted(
        (method, path, status)
        for method, path, status in seen
        if path != "/openapi.json" and status not in (documented(spec, method, path) or set())
    )
    assert undocumented == []


async def test_the_document_says_what_an_instance_needs(client: Client) -> None:
    async with client() as http:
        spec = (await http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    for request in ("RolloutRequest", "ProcessRequest"):
        instance = schemas[request]["properties"]["instance"]
        refs = {v["$ref"].rsplit("/", 1)[1] for v in instance["oneOf"]}
        assert refs == {"Instance.countdown", "Instance.probe"}
        # The task an instance names decides the sampling_params it takes.
        pairs = {
            branch["properties"]["instance"]["$ref"].rsplit("/", 1)[1]: branch["properties"][
                "sampling_params"
            ]["$ref"].rsplit("/", 1)[1]
            for branch in schemas[request]["oneOf"]
        }
        suffix = ".prorl" if request == "ProcessRequest" else ""
        assert pairs["Instance.countdown"] == "Params.countdown" + suffix
    # A task that cannot branch takes no branch: a request the document allows is one it takes.
    by_task = {
        part["properties"]["instance"]["$ref"].rsplit("/", 1)[1]: part["properties"]
        for part in schemas["RolloutRequest"]["oneOf"]
    }
    assert by_task["Instance.countdown"]["branch"] == {"type": "null"}
    # /process takes ProRL's names too: no discriminator.
    assert "discriminator" not in schemas["ProcessRequest"]["properties"]["instance"]
    rollout = schemas["RolloutRequest"]["properties"]["instance"]
    assert rollout["discriminator"]["propertyName"] == "data_source"
    assert set(schemas["Params.countdown"]["properties"]) == {"max_turns", "seed", "temperature"}
    assert schemas["Params.countdown"]["additionalProperties"] is False
    assert "max_iterations" in schemas["Params.probe.prorl"]["properties"]
    countdown = schemas["Instance.countdown"]
    assert countdown["properties"]["data_source"]["const"] == "countdown"
    assert {"data_source", "numbers", "target"} <= set(countdown["required"])
    assert countdown["properties"]["numbers"]["maxItems"] == 6
    # The probe task declares no model: what is known is its data_source.
    assert schemas["Instance.probe"]["required"] == ["data_source"]
    too_large = spec["paths"]["/v1/rollouts"]["post"]["responses"]["413"]
    assert too_large["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
