"""Tenants sharing one server, through the app's real request handling: each sees only its own
jobs (another's answers as one that does not exist, a 404 that never names it), job ids are each
tenant's own, the admin sees all, and the tenants file is read again while the server runs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from fastapi import FastAPI

from raas.agent.gateway import Gateway
from raas.api.app import create_app
from raas.api.auth import COOKIE
from raas.api.tenants import NOT_ADMIN
from raas.cli import main
from raas.deploy.ray import serve_args
from raas.deploy.slurm import serve_values
from raas.helpers.ports import free_port
from raas.llm.types import SamplingParams
from raas.pipeline import JobRequest, Pipeline
from raas.settings import ServeSettings, load_settings
from raas.store.dashboard import JobFilter
from raas.store.records import JobRecord
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tenants import Quotas, TenantPolicy, TenantsFileError, load_tenants
from raas.wire import Branch, Trajectory
from tests.conftest import small_config
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

ADMIN = "admin-s3cret"
ALICE, BOB, CAROL = "alice-key-1", "bob-key-1", "carol-key-1"
SOLVABLE = {"data_source": "countdown", "numbers": [3, 4, 100], "target": 7}
UNSOLVABLE = {"data_source": "countdown", "numbers": [2, 2], "target": 97}
Http = httpx.AsyncClient


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenants_toml(**keys: str) -> str:
    return "".join(
        f'[tenants.{name}]\nkey_sha256 = ["{digest(key)}"]\nweight = 2\n'
        f"[tenants.{name}.quotas]\nmax_jobs_in_flight = 10\n"
        for name, key in keys.items()
    )


def rewrite(path: Path, text: str) -> None:
    """Write the file anew, with an mtime of its own (a second later than the last)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(tenants_toml(alice=ALICE, bob=BOB))
    return path


Server = Callable[..., Any]


@pytest.fixture
def server(tmp_path: Path, registry: TaskRegistry, tenants_file: Path) -> Server:
    """``async with server() as (app, http)``: the app with the tenants file, its lifespan
    running, and an httpx client on it."""

    @asynccontextmanager
    async def make(**settings: Any) -> AsyncIterator[tuple[FastAPI, Http]]:
        values: dict[str, Any] = {
            "db": tmp_path / "tenants.db",
            "cancel_grace_s": 0.05,
            "api_key": ADMIN,
            "tenants_file": tenants_file,
            **settings,
        }
        app = create_app(ServeSettings(**values), registry)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with Http(transport=transport, base_url="http://localhost") as http:
                yield app, http

    return make


async def submit(http: Http, key: str, job_id: str, instance: dict[str, Any]) -> httpx.Response:
    return await http.post(
        "/v1/rollouts", json={"instance": instance, "job_id": job_id}, headers=auth(key)
    )


async def finished(http: Http, key: str, job_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S}, headers=auth(key))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert body["result"] is not None
    return body


async def test_both_tenants_submit_the_same_job_id_and_each_gets_its_own(server: Server) -> None:
    async with server() as (_, http):
        a = await submit(http, ALICE, "cd-7", SOLVABLE)
        b = await submit(http, BOB, "cd-7", UNSOLVABLE)  # another request
        assert (a.status_code, b.status_code) == (202, 202)  # not a 409: two namespaces
        assert a.json()["job_id"] == b.json()["job_id"] == "cd-7"
        mine, theirs = await finished(http, ALICE, "cd-7"), await finished(http, BOB, "cd-7")
        assert mine["result"]["job_id"] == theirs["result"]["job_id"] == "cd-7"
        assert mine["result"]["reward"] == 1.0 and theirs["result"]["reward"] == 0.0
        again = await submit(http, ALICE, "cd-7", SOLVABLE)  # idempotent in its namespace
        assert (again.status_code, again.json()["created"]) == (200, False)
        # The admin sees both, each under its tenant's key.
        listed = (await http.get("/v1/rollouts", headers=auth(ADMIN))).json()["results"]
        assert sorted(r["job_id"] for r in listed) == ["alice~cd-7", "bob~cd-7"]
        admin = await finished(http, ADMIN, "bob~cd-7")
        assert admin["result"]["reward"] == 0.0
        jobs = (await http.get("/v1/dashboard/jobs", headers=auth(ADMIN))).json()["jobs"]
        assert sorted(j["job_id"] for j in jobs) == ["alice~cd-7", "bob~cd-7"]
        # The admin's own jobs keep their ids, as on a server without tenants.
        assert (await submit(http, ADMIN, "cd-7", SOLVABLE)).json()["job_id"] == "cd-7"
        assert (await finished(http, ADMIN, "cd-7"))["result"]["job_id"] == "cd-7"


async def test_a_tenant_finds_nothing_of_anothers_jobs(server: Server, probe: ProbeTask) -> None:
    async with server() as (_, http):
        assert (await submit(http, ALICE, "secret-done", SOLVABLE)).status_code == 202
        await finished(http, ALICE, "secret-done")
        running = await submit(http, ALICE, "secret-run", probe_instance(run="block"))
        assert running.status_code == 202
        await probe.wait_entered("alice~secret-run", "run")
        bob = auth(BOB)
        answers: list[httpx.Response] = []
        for guess in ("secret-done", "secret-run", "alice~secret-done", "alice~secret-run"):
            answers += [
                await http.get(f"/v1/rollouts/{guess}", headers=bob),
                await http.get(f"/v1/rollouts/{guess}", params={"wait": 0.01}, headers=bob),
                await http.post(f"/v1/rollouts/{guess}/cancel", headers=bob),
                await http.get(f"/v1/dashboard/jobs/{guess}/tokens", headers=bob),
            ]
            if "~" not in guess:  # a key is no job id ProRL's /cancel takes (a 422 for any)
                answers.append(await http.post("/cancel", json={"job_id": guess}, headers=bob))
            # An id that exists nowhere answers exactly so: nothing says the job exists.
            nowhere = await http.get(f"/v1/rollouts/{guess}-x", headers=bob)
            assert nowhere.status_code == 404
        for r in answers:
            assert r.status_code == 404, (r.request.url, r.text)
            assert r.json()["detail"].startswith("no job with job_id")
        # Branching from another's job is a job the server does not know.
        branch = {"instance": probe_instance(), "branch": {"job_id": "secret-done", "turn": 1}}
        refused = await http.post("/v1/rollouts", json=branch, headers=bob)
        assert refused.status_code == 404 and "branch.job_id" in refused.json()["detail"]
        assert (
            await http.post("/v1/rollouts", json=branch, headers=auth(ALICE))
        ).status_code != 404
        # Nothing Bob lists or reads names Alice's jobs.
        reads = [
            "/v1/rollouts",
            "/v1/rollouts:running",
            "/v1/dashboard/jobs",
            "/v1/dashboard/stats",
            "/v1/dashboard/series",
            "/v1/status",
            "/metrics",
        ]
        for path in reads:
            r = await http.get(path, headers=bob)
            assert r.status_code == 200 and "secret" not in r.text, (path, r.text)
        stats = (await http.get("/v1/dashboard/stats", headers=bob)).json()
        assert stats["finished"] == {} and stats["data_sources"] == []
        # Her job still runs: Bob's cancel reached nothing.
        mine = await http.get("/v1/rollouts:running", headers=auth(ALICE))
        assert [j["job_id"] for j in mine.json()["jobs"]] == ["secret-run"]
        probe.release("alice~secret-run", "run")
        assert (await finished(http, ALICE, "secret-run"))["result"]["state"] == "done"
        mine = await http.get("/v1/dashboard/jobs", headers=auth(ALICE))
        assert {j["job_id"] for j in mine.json()["jobs"]} == {"secret-done", "secret-run"}


async def test_a_tenant_plots_its_own_jobs_only_and_the_admin_everyones(server: Server) -> None:
    """/v1/dashboard/series of a tenant counts its own jobs (it counted every tenant's); the
    admin's counts them all."""
    async with server() as (_, http):
        jobs = [
            (ALICE, "a-ok", probe_instance()),  # reward 0.5
            (ALICE, "a-crash", probe_instance(run="raise")),  # infra: run again, fails again
            (BOB, "b-solved", SOLVABLE),  # reward 1
        ]
        for key, job_id, instance in jobs:
            assert (await submit(http, key, job_id, instance)).status_code == 202
        for key, job_id, _ in jobs:
            await finished(http, key, job_id)
        plots = {
            key: (await http.get("/v1/dashboard/series", headers=auth(key))).json()
            for key in (ALICE, BOB, ADMIN)
        }

    def total(key: str, column: str) -> float:
        return sum(x or 0 for x in plots[key][column])

    def errors(key: str) -> dict[str, int]:
        return {kind: sum(n) for kind, n in plots[key]["errors"].items()}

    assert total(BOB, "finished") == 1 and total(BOB, "rewarded") == 1
    assert max(x or 0 for x in plots[BOB]["pass_rate"]) == 1.0
    assert errors(BOB) == {"infra": 0, "policy": 0}
    assert total(ALICE, "finished") == 2 and total(ALICE, "rewarded") == 1
    assert errors(ALICE) == {"infra": 2, "policy": 0}
    # The control: the admin sees both tenants' jobs.
    assert total(ADMIN, "finished") == 3 and total(ADMIN, "rewarded") == 2
    assert errors(ADMIN) == {"infra": 2, "policy": 0}


async def test_the_dashboard_session_of_a_tenant_sees_only_its_jobs(server: Server) -> None:
    async with server() as (_, http):
        await submit(http, ALICE, "hers", SOLVABLE)
        await finished(http, ALICE, "hers")
        signed_in = await http.post("/ui/login", data={"key": BOB})
        assert signed_in.status_code == 303
        cookie = signed_in.cookies[COOKIE]
        # The cookie holds no key, and the digests in the file cannot make one.
        assert BOB not in cookie and digest(BOB) not in cookie
        jar = {"Cookie": f"{COOKIE}={cookie}"}
        assert (await http.get("/v1/dashboard/jobs", headers=jar)).json()["jobs"] == []
        assert (await http.get("/v1/dashboard/jobs/hers/tokens", headers=jar)).status_code == 404
        assert (await http.get("/ui", headers=jar)).status_code == 200
        via_query = await http.get("/ui", params={"key": ALICE})
        assert via_query.status_code == 303
        alice_jar = {"Cookie": f"{COOKIE}={via_query.cookies[COOKIE]}"}
        jobs = (await http.get("/v1/dashboard/jobs", headers=alice_jar)).json()["jobs"]
        assert [j["job_id"] for j in jobs] == ["hers"]
        wrong = await http.post("/ui/login", data={"key": "nobody's"})
        assert wrong.status_code == 401


async def test_a_job_token_of_one_tenants_job_opens_nothing_of_the_server(
    server: Server,
) -> None:
    async with server() as (app, http):
        await submit(http, BOB, "bobs", SOLVABLE)
        await finished(http, BOB, "bobs")
        gateway: Gateway = app.state.service.gateway
        session = gateway.open("alice~job-a", SamplingParams(max_tokens=8), Trajectory())
        token = auth(session.token)
        for method, path in [
            ("GET", "/v1/rollouts/bobs"),
            ("GET", "/v1/rollouts/job-a"),
            ("GET", "/v1/rollouts"),
            ("POST", "/v1/rollouts/bobs/cancel"),
            ("GET", "/v1/dashboard/jobs"),
            ("GET", "/v1/rollouts:running"),
        ]:
            r = await http.request(method, path, headers=token)
            assert r.status_code == 401 and "bobs" not in r.text, path
        gateway.close(session.token)


NOWHERE = "http://127.0.0.1:9/v1"  # a backend that never answers (nothing is sent to it here)


def server_wide(backend: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every route that changes what all tenants share: the backend pool, and whether jobs are
    accepted (method, path, body)."""
    return [
        ("POST", "/v1/backends", {"url": "http://127.0.0.1:10/v1"}),
        ("DELETE", f"/v1/backends/{backend}", None),
        ("POST", "/v1/backends:pause", {"mode": "abort"}),
        ("POST", "/v1/backends:resume", None),
        ("POST", "/add_llm_server", {"address": "http://127.0.0.1:10/v1"}),
        ("POST", "/clear_llm_server", None),
        ("POST", "/stop", None),
        ("POST", "/start", None),
    ]


async def test_only_the_admin_changes_what_every_tenant_shares(server: Server) -> None:
    async with server() as (app, http):
        svc = app.state.service

        def shared() -> tuple[list[str], bool, bool]:
            return [b.id for b in svc.llm.backends()], svc.llm.paused, svc.pipeline.accepting

        added = await http.post("/v1/backends", json={"url": NOWHERE}, headers=auth(ADMIN))
        assert added.status_code == 201, added.text
        backend = added.json()["id"]
        for method, path, body in server_wide(backend):
            r = await http.request(method, path, json=body, headers=auth(ALICE))
            assert (r.status_code, r.json()) == (403, {"detail": NOT_ADMIN}), path
        assert shared() == ([backend], False, True)  # nothing paused, drained, added or removed
        # Nor can a tenant undo what the admin did: a paused pool and a drain stay.
        assert (await http.post("/v1/backends:pause", json={}, headers=auth(ADMIN))).is_success
        assert (await http.post("/stop", headers=auth(ADMIN))).is_success
        for path in ("/v1/backends:resume", "/start"):
            assert (await http.post(path, headers=auth(BOB))).status_code == 403
        assert shared() == ([backend], True, False)
        # Reading the server as a whole is every tenant's (it names no job).
        for path in ("/v1/status", "/status", "/v1/backends", "/metrics"):
            assert (await http.get(path, headers=auth(ALICE))).status_code == 200, path
        for path in ("/v1/backends:resume", "/start"):
            assert (await http.post(path, headers=auth(ADMIN))).is_success
        assert shared() == ([backend], False, True)
        # The admin does each (the last two: a drain, and its end).
        for method, path, body in server_wide(backend):
            r = await http.request(method, path, json=body, headers=auth(ADMIN))
            assert r.is_success, (path, r.text)
        assert shared() == ([], False, True)


async def test_a_changed_file_adds_and_removes_tenants(
    server: Server, tenants_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with server() as (app, http):
        watch = app.state.service.tenants_watch
        assert (await http.get("/v1/rollouts", headers=auth(BOB))).status_code == 200
        assert (await http.get("/v1/rollouts", headers=auth(CAROL))).status_code == 401
        assert not await watch.check()  # unchanged: not read again
        rewrite(tenants_file, tenants_toml(alice=ALICE, carol=CAROL))
        assert await watch.check()
        assert (await http.get("/v1/rollouts", headers=auth(CAROL))).status_code == 200
        assert (await http.get("/v1/rollouts", headers=auth(BOB))).status_code == 401
        # A file that cannot be used keeps the tenants read before, and says why once.
        rewrite(tenants_file, tenants_toml(alice=ALICE) + "[tenants.dave]\nweight = 0\n")
        with caplog.at_level(logging.ERROR, logger="raas.api.tenants"):
            assert not await watch.check()
        (line,) = [r.getMessage() for r in caplog.records if r.name == "raas.api.tenants"]
        assert "tenants.dave.key_sha256" in line and "\n" not in line
        assert (await http.get("/v1/rollouts", headers=auth(CAROL))).status_code == 200
        assert (await http.get("/v1/rollouts", headers=auth(ADMIN))).status_code == 200


def quota_toml(alice_jobs: int, alice_weight: float) -> str:
    """Alice with a cap on jobs in flight and a weight; Bob with neither."""
    return (
        f'[tenants.alice]\nkey_sha256 = ["{digest(ALICE)}"]\nweight = {alice_weight}\n'
        f"[tenants.alice.quotas]\nmax_jobs_in_flight = {alice_jobs}\n"
        f'[tenants.bob]\nkey_sha256 = ["{digest(BOB)}"]\n'
    )


async def test_a_tenant_over_its_quota_gets_a_429_while_another_is_accepted_and_a_reload_applies(
    server: Server, tenants_file: Path, probe: ProbeTask
) -> None:
    tenants_file.write_text(quota_toml(alice_jobs=2, alice_weight=1))
    async with server() as (app, http):
        pipeline = app.state.service.pipeline
        assert pipeline.config.tenants("alice") == TenantPolicy(1.0, Quotas(max_jobs_in_flight=2))
        for job_id in ("a0", "a1"):
            r = await submit(http, ALICE, job_id, probe_instance(init="block"))
            assert r.status_code == 202
        over = await submit(http, ALICE, "a2", probe_instance(init="block"))
        assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
        assert over.json()["quota"] == "max_jobs_in_flight"
        assert "max_jobs_in_flight" in over.json()["detail"]
        # Bob is accepted while Alice is at her cap: her quota is hers alone.
        assert (await submit(http, BOB, "b0", SOLVABLE)).status_code == 202
        assert (await finished(http, BOB, "b0"))["result"]["state"] == "done"
        # The file read again reaches the pipeline: a higher cap and weight apply at once.
        rewrite(tenants_file, quota_toml(alice_jobs=3, alice_weight=3))
        assert await app.state.service.tenants_watch.check()
        assert pipeline.config.tenants("alice") == TenantPolicy(3.0, Quotas(max_jobs_in_flight=3))
        assert pipeline.config.tenants("bob") == TenantPolicy()
        r = await submit(http, ALICE, "a2", probe_instance(init="block"))
        assert r.status_code == 202
        over = await submit(http, ALICE, "a3", probe_instance(init="block"))
        assert over.status_code == 429 and "at most 3" in over.json()["detail"]
        # Every job she had accepted runs to its end: a 429 never dropped one.
        for job_id in ("a0", "a1", "a2"):
            await probe.wait_entered(f"alice~{job_id}", "init")
            probe.release(f"alice~{job_id}", "init")
            assert (await finished(http, ALICE, job_id))["result"]["state"] == "done"
        # Each tenant reads its own use only; the admin reads everyone's.
        usage = await http.get("/v1/usage", params={"since_s": 3600}, headers=auth(BOB))
        assert [t["tenant"] for t in usage.json()["tenants"]] == ["bob"]
        assert usage.json()["tenants"][0]["finished"] == {"done": 1}
        assert "alice" not in usage.text
        usage = await http.get("/v1/usage", params={"since_s": 3600}, headers=auth(ALICE))
        (alice,) = usage.json()["tenants"]
        assert alice["tenant"] == "alice" and alice["submitted"] == 3
        assert alice["finished"] == {"done": 3}
        usage = await http.get("/v1/usage", params={"since_s": 3600}, headers=auth(ADMIN))
        assert [t["tenant"] for t in usage.json()["tenants"]] == ["alice", "bob"]
        # /metrics' per-tenant series are the admin's: a tenant's scrape has none of them.
        bobs = (await http.get("/metrics", headers=auth(BOB))).text
        assert "raas_jobs_in_flight" in bobs and "raas_tenant_" not in bobs
        admins = (await http.get("/metrics", headers=auth(ADMIN))).text
        assert 'raas_tenant_jobs_finished_total{state="done",tenant="alice"} 3.0' in admins
        assert 'raas_tenant_jobs_submitted_total{tenant="bob"} 1.0' in admins


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[tenants.a]\nkey_sha256 = ["abc"]\n', "tenants.a.key_sha256.0"),
        (f'[tenants.a]\nkey_sha256 = ["{"0" * 64}"]\nweight = -1\n', "tenants.a.weight"),
        (
            f'[tenants.a]\nkey_sha256 = ["{"0" * 64}"]\n[tenants.a.quotas]\nmax_job = 1\n',
            "tenants.a.quotas.max_job",
        ),
        (f'[tenants.default]\nkey_sha256 = ["{"0" * 64}"]\n', "tenants.default"),
        (f'[tenants."a b"]\nkey_sha256 = ["{"0" * 64}"]\n', "tenants.a b"),
        (
            f'[tenants.a]\nkey_sha256 = ["{"0" * 64}"]\n[tenants.b]\nkey_sha256 = ["{"0" * 64}"]\n',
            "tenants.b.key_sha256",
        ),
        ("[tenants.a\n", "cannot read it"),
    ],
)
def test_a_bad_file_at_start_is_one_line_naming_the_field(
    tmp_path: Path, registry: TaskRegistry, text: str, named: str
) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    with pytest.raises(TenantsFileError) as refused:
        create_app(ServeSettings(db=tmp_path / "x.db", api_key=ADMIN, tenants_file=path), registry)
    message = str(refused.value)
    assert message.startswith(f"tenants file {path}: ") and "\n" not in message
    assert named in message


def test_a_json_file_reads_as_the_toml_one(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    entry = {"key_sha256": [digest(ALICE)], "weight": 0.5, "quotas": {"llm_tokens_per_s": 1e4}}
    path.write_text(json.dumps({"tenants": {"alice": entry}}))
    tenants = load_tenants(path)
    alice = tenants.of_key(ALICE.encode())
    assert alice is not None and (alice.name, alice.policy.weight) == ("alice", 0.5)
    quotas = alice.policy.quotas
    assert quotas.llm_tokens_per_s == 1e4 and quotas.max_jobs_in_flight is None
    assert tenants.of_key(BOB.encode()) is None


def test_tenants_need_the_admins_key_and_travel_to_every_deployed_server(
    tmp_path: Path, registry: TaskRegistry, tenants_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyless = load_settings(overrides={"tenants_file": tenants_file, "db": tmp_path / "x.db"})
    with pytest.raises(TenantsFileError, match="needs an API key, the admin's"):
        create_app(keyless, registry)
    monkeypatch.setenv("RAAS_TENANTS_FILE", str(tenants_file))
    assert load_settings().auth.tenants_file == tenants_file
    # What a deployment passes to each server it starts (the key goes by the environment).
    flags = ["--tenants-file", str(tenants_file)]
    assert serve_args({"tenants_file": tenants_file}) == flags
    assert serve_values(flags) == {"tenants_file": str(tenants_file)}


async def test_without_a_tenants_file_one_key_sees_everything_as_before(
    client: Callable[..., Any],
) -> None:
    async with client(api_key=ADMIN) as http:
        r = await submit(http, ADMIN, "cd-1", SOLVABLE)
        assert r.json() == {"job_id": "cd-1", "state": "queued", "created": True}
        assert (await finished(http, ADMIN, "cd-1"))["result"]["job_id"] == "cd-1"
        assert (await http.get("/v1/rollouts", headers=auth(ALICE))).status_code == 401
        assert (await http.post("/v1/backends:pause", json={}, headers=auth(ADMIN))).is_success
    async with client() as http:  # keyless on loopback
        listed = (await http.get("/v1/rollouts")).json()["results"]
        assert [r["job_id"] for r in listed] == ["cd-1"]
        assert (await http.post("/stop")).is_success  # the whole server is anyone's, as before


def test_a_tenants_request_names_its_job_group_and_branch_parent_in_its_namespace() -> None:
    request = JobRequest.of(
        SOLVABLE, job_id="j", tenant="alice", group="g", branch=Branch(job_id="p", turn=1)
    )
    assert (request.key, request.group_key, request.tenant) == ("alice~j", "alice~g", "alice")
    assert request.keyed_branch is not None and request.keyed_branch.job_id == "alice~p"
    admins = replace(request, tenant="default")
    assert (admins.key, admins.group_key, admins.keyed_branch) == (
        "j",
        "g",
        Branch(job_id="p", turn=1),
    )


def test_a_served_file_is_read_again_on_sighup_and_a_bad_one_stops_the_start(
    tmp_path: Path, tenants_file: Path, server_env: dict[str, str], start_server: Any
) -> None:
    server_env["RAAS_API_KEY"] = ADMIN
    server = start_server(tmp_path / "served.db", "--tenants-file", str(tenants_file))
    url = f"{server.url}/v1/rollouts"
    assert httpx.get(url, headers=auth(BOB)).status_code == 200
    # Bob's entry now holds Carol's key: as long, as old (same size and mtime), so only the
    # signal tells the server to read it.
    stamp = tenants_file.stat()
    tenants_file.write_text(tenants_toml(alice=ALICE, bob=CAROL))
    os.utime(tenants_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert tenants_file.stat().st_size == stamp.st_size
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S  # a safety net: the reload is awaited, not timed
    while httpx.get(url, headers=auth(BOB)).status_code != 401:
        assert time.monotonic() < deadline, "SIGHUP did not reload the tenants file"
        time.sleep(0.05)
    assert httpx.get(url, headers=auth(CAROL)).status_code == 200
    assert server.proc.poll() is None  # the signal reloaded; it did not end the server

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[tenants.a]\nkey_sha256 = ["{digest(ALICE)}"]\nweight = "heavy"\n')
    run = subprocess.run(
        [sys.executable, "-m", "raas", "serve", "--db", str(tmp_path / "bad.db")]
        + ["--port", str(free_port()), "--tenants-file", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env,
    )
    assert run.returncode == 1
    (line,) = [x for x in run.stderr.splitlines() if "tenants file" in x]
    assert f"tenants file {bad}: tenants.a.weight: " in line


def exported_rows(text: str) -> list[tuple[str | None, str, float | None]]:
    """(tenant, job_id, reward) of each row of an export's JSON lines, in its order."""
    rows = [json.loads(line) for line in text.splitlines()]
    return [(r["tenant"], r["job_id"], r["reward"]) for r in rows]


def test_each_exports_its_own_jobs_under_its_ids_and_the_admin_every_tenants(
    tmp_path: Path, tenants_file: Path, server_env: dict[str, str], start_server: Any
) -> None:
    server_env["RAAS_API_KEY"] = ADMIN
    db = tmp_path / "export.db"
    server = start_server(db, "--tenants-file", str(tenants_file))
    for key, instance in ((ALICE, SOLVABLE), (BOB, UNSOLVABLE), (ADMIN, SOLVABLE)):
        body = {"instance": instance, "job_id": "cd-7"}
        assert httpx.post(f"{server.url}/v1/rollouts", json=body, headers=auth(key)).is_success
        done = httpx.get(
            f"{server.url}/v1/rollouts/cd-7", params={"wait": WAIT_S}, headers=auth(key)
        )
        assert done.json()["result"] is not None, done.text

    def export(key: str, **params: str) -> httpx.Response:
        url = f"{server.url}/v1/rollouts:export"
        return httpx.get(url, params=params, headers=auth(key), timeout=WAIT_S)

    bobs = export(BOB)
    assert bobs.headers["content-type"] == "application/x-ndjson"
    # Bob's holds his cd-7 only: none of Alice's, though hers is a cd-7 too.
    assert exported_rows(bobs.text) == [("bob", "cd-7", 0.0)]
    assert exported_rows(export(ALICE, format="jsonl", state="done").text) == [
        ("alice", "cd-7", 1.0)
    ]
    everyone = [("alice", "cd-7", 1.0), ("bob", "cd-7", 0.0), (None, "cd-7", 1.0)]
    assert exported_rows(export(ADMIN).text) == everyone
    assert export(ALICE, state="failed").text == ""
    for field, bad in (("format", "parquet"), ("state", "queued")):
        refused = export(ALICE, **{field: bad})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"] == ["query", field]
    assert export("nobody's").status_code == 401

    # raas export --server: the same rows, the key from RAAS_API_KEY; Parquet written here.
    runner = CliRunner()
    out = tmp_path / "bob.jsonl"
    cli = runner.invoke(
        main, ["export", "--server", server.url, "--out", str(out)], env={"RAAS_API_KEY": BOB}
    )
    assert cli.exit_code == 0, cli.output
    assert exported_rows(out.read_text()) == [("bob", "cd-7", 0.0)]
    parquet = tmp_path / "all.parquet"
    args = ["export", "--server", server.url, "--out", str(parquet)]
    cli = runner.invoke(main, args, env={"RAAS_API_KEY": ADMIN})
    assert cli.exit_code == 0 and "wrote 3 results" in cli.output, cli.output
    table = pq.read_table(parquet)
    assert table.column("tenant").to_pylist() == ["alice", "bob", None]
    assert table.column("job_id").to_pylist() == ["cd-7"] * 3
    # The dashboard's filters, sent as the route's query: the admin's search reads keys.
    filtered = ["export", "--server", server.url, "--out", str(out)]
    for more, rows in (
        (["--min-reward", "0.5", "--search", "CD-7"], [everyone[0], everyone[2]]),
        (["--search", "bob~", "--state", "done", "--max-reward", "0"], [everyone[1]]),
        (["--data-source", "countdown", "--error-type", "RuntimeError"], []),
    ):
        cli = runner.invoke(main, [*filtered, *more], env={"RAAS_API_KEY": ADMIN})
        assert cli.exit_code == 0, cli.output
        assert exported_rows(out.read_text()) == rows, more
    refused = runner.invoke(main, args, env={"RAAS_API_KEY": "nobody's"})
    assert refused.exit_code == 1 and "raas answered 401" in refused.output
    assert not (tmp_path / "all.parquet.part").exists()
    both = runner.invoke(main, [*args, "--tenant", "alice"], env={"RAAS_API_KEY": ADMIN})
    assert both.exit_code == 2 and "without --db and --tenant" in both.output
    assert server.stop() == 0

    # raas export --db reads the file itself: --tenant picks one tenant's jobs, ids as its own.
    def from_db(*args: str) -> list[tuple[str | None, str, float | None]]:
        out = tmp_path / "db.jsonl"
        cli = runner.invoke(main, ["export", "--db", str(db), "--out", str(out), *args])
        assert cli.exit_code == 0, cli.output
        return exported_rows(out.read_text())

    assert from_db("--tenant", "alice") == [("alice", "cd-7", 1.0)]
    assert from_db("--tenant", "default") == [(None, "cd-7", 1.0)]
    assert from_db() == everyone


async def test_a_tenants_job_in_flight_at_a_crash_runs_again_as_its_own(
    tmp_path: Path, registry: TaskRegistry, make_pipeline: Any, probe: ProbeTask
) -> None:
    db = tmp_path / "crash.db"
    store = ResultStore(db)
    await store.open()
    first = Pipeline(registry, store, small_config(max_attempts=2))
    await first.start()
    await first.submit([JobRequest.of(probe_instance(run="block"), job_id="j", tenant="alice")])
    await probe.wait_entered("alice~j", "run")
    for task in first.stages.workers:  # the server "dies" with Alice's job in RUN
        task.cancel()
    await store.close()
    async with make_pipeline(db, max_attempts=2) as pipeline:
        await probe.wait_entered("alice~j", "run")
        revived = pipeline.active("alice~j")
        assert revived is not None and revived.request.tenant == revived.tenant == "alice"
        # Counted against her quotas again, as her own.
        assert pipeline.stats()["tenants"]["alice"]["in_flight"] == 1
        probe.release("alice~j", "run")
        view = await pipeline.wait("alice~j", WAIT_S)
        assert view is not None and view.state.value == "done"
        (job,) = (await pipeline.store.finished(JobFilter(tenant="alice"))).records
        assert (job.job_id, job.tenant) == ("alice~j", "alice")
        assert (await pipeline.store.finished(JobFilter(tenant="bob"))).records == []


async def test_a_job_recorded_field_by_field_before_runs_again_as_its_tenants(
    tmp_path: Path, make_pipeline: Any, probe: ProbeTask
) -> None:
    """A row of an older raas kept the request's fields one by one, its group as the server's
    key and the tenant beside them: it is read back as the tenant's own RolloutRequest."""
    db = tmp_path / "old.db"
    store = ResultStore(db)
    await store.open()
    instance = probe_instance(run="block")
    fields = {"instance": instance, "sampling_params": {}, "timeout_s": 60.0, "priority": 2}
    old = {**fields, "tenant": "alice", "group": "alice~g"}
    await store.add_jobs([JobRecord("alice~j", "run", "probe", None, old, 1.0, tenant="alice")])
    await store.close()
    async with make_pipeline(db, max_attempts=2) as pipeline:
        await probe.wait_entered("alice~j", "run")
        revived = pipeline.active("alice~j")
        assert revived is not None and revived.tenant == "alice"
        rollout = revived.request.rollout
        assert (rollout.job_id, rollout.group, rollout.timeout_s, rollout.priority) == (
            "j",
            "g",
            60.0,
            2,
        )
        assert revived.request.group_key == "alice~g"
        # Resubmitting it is the same job, not a conflict.
        (again,) = await pipeline.submit([JobRequest.of(instance, job_id="j", tenant="alice")])
        assert (again.job_id, again.created) == ("alice~j", False)
        probe.release("alice~j", "run")
        view = await pipeline.wait("alice~j", WAIT_S)
        assert view is not None and view.state.value == "done"
        record = await pipeline.store.get("alice~j")
        assert record is not None and record.request == old  # its row is not rewritten


async def test_a_jobs_record_keeps_its_request_whole_as_its_tenant_sent_it(
    tmp_path: Path, make_pipeline: Any, probe: ProbeTask
) -> None:
    request = JobRequest.of(probe_instance(), {"temperature": 0.5}, "j", tenant="alice", group="g")
    async with make_pipeline(tmp_path / "new.db") as pipeline:
        (view,) = await pipeline.submit([request])
        assert view.job_id == "alice~j"
        record = await pipeline.store.get("alice~j")
        assert record is not None and record.tenant == "alice"
        # The wire's own JSON: its ids the tenant's, every field there (its defaults too).
        assert record.request == request.rollout.model_dump(mode="json")
        assert (record.request["job_id"], record.request["group"]) == ("j", "g")
        await pipeline.wait("alice~j", WAIT_S)
