"""A hostile tenant (Mallory) reading what the ledger counts (raas.pipeline.ledger) through every
route, against two others (Alice, Bob) on one server: each attack beside the read it must not
break (the tenant's own, the admin's whole).

What /metrics shows every tenant is server-wide and says nothing of who (docs/api.md, "Admin-only
routes"); its data_source label is one of the names the server runs, never a string a tenant
wrote, so no tenant reads another's names there and no tenant adds a series a job."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from raas.api.app import create_app
from raas.api.auth import COOKIE
from raas.pipeline.ledger import UNKNOWN_SOURCE
from raas.settings import ServeSettings
from raas.store.sqlite import JobRecord, ResultStore
from raas.tasks import TaskRegistry
from raas.tenants import job_key
from raas.wire import RolloutResult, Timing, Trajectory
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

ADMIN = "admin-s3cret"
ALICE, BOB, MALLORY = "alice-key-1", "bob-key-1", "mallory-key-1"
Http = httpx.AsyncClient
# Alice's own names for her work: none may reach Mallory.
HER_SOURCE = "aime-alice-private-eval-v3"  # a dataset name the server runs (aime*: math)
HER_JOB = "alice-run-42"
HER_INSTANCE = "alice-instance-7"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def app_with_tenants(tmp_path: Path, registry: TaskRegistry, probe: ProbeTask) -> Any:
    """``async with app_with_tenants() as (app, http)``: Alice, Bob and Mallory on one server,
    whose registry runs dataset names too (``math``: the probe, so ``aime...`` runs)."""
    registry.register(probe, "math")
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        "".join(
            f'[tenants.{name}]\nkey_sha256 = ["{digest(key)}"]\n'
            for name, key in (("alice", ALICE), ("bob", BOB), ("mallory", MALLORY))
        )
    )

    @asynccontextmanager
    async def make() -> AsyncIterator[tuple[FastAPI, Http]]:
        settings = ServeSettings(
            db=tmp_path / "reads.db", cancel_grace_s=0.05, api_key=ADMIN, tenants_file=tenants
        )
        app = create_app(settings, registry)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with Http(transport=transport, base_url="http://localhost") as http:
                yield app, http

    return make


async def run(http: Http, key: str, instance: dict[str, Any], job_id: str | None = None) -> str:
    """Submit a job and wait for its end; its id."""
    body: dict[str, Any] = {"instance": instance, **({"job_id": job_id} if job_id else {})}
    r = await http.post("/v1/rollouts", json=body, headers=auth(key))
    assert r.status_code == 202, r.text
    job: str = r.json()["job_id"]
    done = await http.get(f"/v1/rollouts/{job}", params={"wait": WAIT_S}, headers=auth(key))
    assert done.json()["result"] is not None, done.text
    return job


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample of a Prometheus exposition by name and labels (the text must parse)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def label_values(text: str, label: str) -> set[str]:
    return {dict(labels)[label] for _, labels in samples(text) if label in dict(labels)}


async def alices_work(http: Http) -> None:
    """A job of Alice's that fails (run again once, fails again: infra) under her own names, and
    one of Bob's."""
    failing = {**probe_instance(run="raise"), "data_source": HER_SOURCE}
    await run(http, ALICE, {**failing, "instance_id": HER_INSTANCE}, HER_JOB)
    await run(http, BOB, probe_instance(), "bob-run")


async def test_metrics_shows_no_tenant_the_data_source_another_wrote(
    app_with_tenants: Any,
) -> None:
    async with app_with_tenants() as (_, http):
        await alices_work(http)
        await run(http, MALLORY, probe_instance(), "mine")
        theirs = (await http.get("/metrics", headers=auth(MALLORY))).text
        admins = (await http.get("/metrics", headers=auth(ADMIN))).text
        hers = (await http.get("/v1/dashboard/jobs", headers=auth(ALICE))).json()["jobs"]
    # The attack: Alice's dataset name, her job, her instance, her name, her error.
    for secret in (HER_SOURCE, "private", HER_JOB, HER_INSTANCE, "alice", "boom"):
        assert secret not in theirs, secret
    assert "tenant=" not in theirs  # the per-tenant series are the admin's only
    # The control: her jobs are counted, server-wide, under the server's name for her dataset.
    counted = samples(theirs)
    assert counted["raas_jobs_finished_total", (("data_source", "aime*"), ("state", "failed"))] == 1
    assert counted["raas_job_errors_total", (("data_source", "aime*"), ("kind", "infra"))] == 2
    assert counted["raas_jobs_finished_total", (("data_source", "probe"), ("state", "done"))] == 2
    assert label_values(theirs, "data_source") == {"aime*", "probe"}
    # The admin reads each tenant's use; Alice reads her job under the name she gave it.
    assert {"alice", "bob", "mallory"} <= label_values(admins, "tenant")
    assert [(j["job_id"], j["data_source"]) for j in hers] == [(HER_JOB, HER_SOURCE)]


async def test_a_data_source_spelled_anew_for_each_job_adds_no_series_and_no_total(
    app_with_tenants: Any,
) -> None:
    """Each job a new data_source (the aime prefix takes any tail, a dataset name any case), one
    of them 200 kB long: /metrics keeps one series for them all, the ledger one total."""
    huge = "aime" + "x" * 200_000
    spellings = [f"aime-{i}" for i in range(20)] + ["OpenAI/GSM8K", "OPENAI/gsm8k", huge]
    async with app_with_tenants() as (app, http):
        jobs = [{"instance": {**probe_instance(), "data_source": s}} for s in spellings]
        r = await http.post("/v1/rollouts:batch", json={"jobs": jobs}, headers=auth(MALLORY))
        assert r.status_code == 202, r.text[:300]
        ids = [j["job_id"] for j in r.json()["jobs"]]
        for job_id in ids:
            await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S}, headers=auth(MALLORY))
        text = (await http.get("/metrics", headers=auth(ADMIN))).text
        totals = dict(app.state.service.pipeline.ledger.totals)
        # The control: her own result keeps the data_source as she wrote it.
        last = await http.get(f"/v1/rollouts/{ids[-1]}", headers=auth(MALLORY))
        assert last.json()["result"]["data_source"] == huge
    assert sorted(totals) == [("mallory", "aime*"), ("mallory", "openai/gsm8k")]
    assert label_values(text, "data_source") == {"aime*", "openai/gsm8k"}
    assert len(text) < 40_000  # not one copy of the 200 kB name
    counted = samples(text)
    assert counted["raas_jobs_finished_total", (("data_source", "aime*"), ("state", "done"))] == 21
    gsm8k = (("data_source", "openai/gsm8k"), ("state", "done"))
    assert counted["raas_jobs_finished_total", gsm8k] == 2
    assert totals["mallory", "aime*"].submitted == 21


async def test_a_data_source_with_quotes_and_newlines_writes_no_line_of_its_own(
    app_with_tenants: Any,
) -> None:
    forged = 'aime"} 1\nraas_tenant_llm_tokens_total{tenant="alice",direction="in"} 1e9\n# \\'
    async with app_with_tenants() as (_, http):
        await run(http, ALICE, probe_instance(), "hers")
        await run(http, MALLORY, {**probe_instance(), "data_source": forged})
        texts = [(await http.get("/metrics", headers=auth(k))).text for k in (MALLORY, ADMIN)]
    for text in texts:
        parsed = samples(text)  # it parses: no line of the forged ones broke it
        assert not any(
            name.startswith("raas_tenant_llm_tokens") and value == 1e9
            for (name, _), value in parsed.items()
        )
        assert "1e9" not in text and "\n# \\" not in text
        assert label_values(text, "data_source") == {"aime*", "probe"}
        assert UNKNOWN_SOURCE not in text


async def test_no_query_parameter_names_another_tenant_in_a_read(app_with_tenants: Any) -> None:
    """Usage, series, stats, lists and export take the caller's tenant, never one a query names;
    a tenant's own counts are its own exactly."""
    async with app_with_tenants() as (_, http):
        await alices_work(http)
        await run(http, MALLORY, probe_instance(), "mine")
        others = {"tenant": "alice", "only": "alice", "who": "alice", "data_source": HER_SOURCE}
        reads = {}
        for path in (
            "/v1/usage",
            "/v1/dashboard/series",
            "/v1/dashboard/stats",
            "/v1/dashboard/distributions",
            "/v1/dashboard/jobs",
            "/v1/rollouts",
            "/v1/rollouts:export",
            "/v1/rollouts:running",
            "/v1/status",
            "/status",
        ):
            r = await http.get(path, params=others, headers=auth(MALLORY))
            assert r.status_code == 200, (path, r.text)
            reads[path] = r
            for secret in (HER_SOURCE, HER_JOB, HER_INSTANCE, "alice", "boom", "bob-run"):
                assert secret not in r.text, (path, secret)
        usage = (await http.get("/v1/usage", headers=auth(MALLORY))).json()
        series = (await http.get("/v1/dashboard/series", headers=auth(MALLORY))).json()
        stats = (await http.get("/v1/dashboard/stats", headers=auth(MALLORY))).json()
        seen = (await http.get("/v1/dashboard/distributions", headers=auth(MALLORY))).json()
        admin = (await http.get("/v1/usage", headers=auth(ADMIN))).json()
        alice = (await http.get("/v1/usage", headers=auth(ALICE))).json()
    # Her own, exactly: one job, done; nothing of Alice's failures or Bob's job.
    (row,) = usage["tenants"]
    assert (row["tenant"], row["submitted"], row["finished"]) == ("mallory", 1, {"done": 1})
    assert sum(series["finished"]) == 1 and sum(sum(n) for n in series["errors"].values()) == 0
    assert stats["finished"] == {"done": 1} and stats["data_sources"] == ["probe"]
    assert [s["data_source"] for s in stats["sources"]] == ["probe"]
    assert seen["jobs"] == 1 and seen["stop_reasons"] == {"finish": 1}
    # The control: Alice reads hers, the admin everyone's.
    (hers,) = alice["tenants"]
    assert (hers["tenant"], hers["finished"]) == ("alice", {"failed": 1})
    assert [t["tenant"] for t in admin["tenants"]] == ["alice", "bob", "mallory"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/rollouts/alice~{job}",
        "/v1/rollouts/alice%7E{job}",
        "/v1/rollouts/%61lice~{job}",
        "/v1/rollouts/..%2Falice~{job}",
        "/v1/rollouts/%2E%2E/alice~{job}",
        "/v1/rollouts/mallory~alice~{job}",
        "/v1/dashboard/jobs/alice~{job}/tokens",
        "/v1/dashboard/jobs/%2E%2E%2F%2E%2E%2Frollouts%2Falice~{job}/tokens",
    ],
)
async def test_no_id_or_path_trick_reads_another_tenants_job(
    app_with_tenants: Any, path: str
) -> None:
    async with app_with_tenants() as (_, http):
        await alices_work(http)
        r = await http.get(path.format(job=HER_JOB), headers=auth(MALLORY))
        hers = await http.get(f"/v1/rollouts/{HER_JOB}", headers=auth(ALICE))
        admins = await http.get(f"/v1/rollouts/alice~{HER_JOB}", headers=auth(ADMIN))
    assert r.status_code == 404, r.text
    for secret in (HER_SOURCE, HER_INSTANCE, "boom", "failed"):
        assert secret not in r.text
    # The control: Alice reads her job by its id, the admin by her key's.
    assert hers.json()["result"]["data_source"] == HER_SOURCE
    assert admins.json()["result"]["instance_id"] == HER_INSTANCE


async def test_a_tenants_dashboard_session_reads_its_own_counts_only(
    app_with_tenants: Any,
) -> None:
    """The cookie of Mallory's dashboard session, alone or beside a wrong key, reads as Mallory:
    her series and usage, /metrics without the per-tenant series."""
    async with app_with_tenants() as (_, http):
        await alices_work(http)
        await run(http, MALLORY, probe_instance(), "mine")
        signed_in = await http.post("/ui/login", data={"key": MALLORY})
        jar = f"{COOKIE}={signed_in.cookies[COOKIE]}"
        answers = {}
        for headers in ({"Cookie": jar}, {"Cookie": jar, **auth("not-a-key")}):
            for path in ("/v1/usage", "/v1/dashboard/series", "/metrics", "/v1/dashboard/stats"):
                r = await http.get(path, headers=headers)
                assert r.status_code == 200, (path, r.text)
                assert "alice" not in r.text and HER_SOURCE not in r.text, path
                answers[path] = r
        # Nor does a cookie and Alice's tenant name in the query read hers.
        r = await http.get("/v1/usage", params={"tenant": "alice"}, headers={"Cookie": jar})
        assert "alice" not in r.text
        # The control: the admin's session reads every tenant's use.
        admin = await http.post("/ui/login", data={"key": ADMIN})
        admin_jar = {"Cookie": f"{COOKIE}={admin.cookies[COOKIE]}"}
        everyone = (await http.get("/v1/usage", headers=admin_jar)).json()
    (row,) = answers["/v1/usage"].json()["tenants"]
    assert (row["tenant"], row["finished"]) == ("mallory", {"done": 1})
    assert sum(answers["/v1/dashboard/series"].json()["finished"]) == 1
    assert "tenant=" not in answers["/metrics"].text
    assert [t["tenant"] for t in everyone["tenants"]] == ["alice", "bob", "mallory"]


async def test_a_tenants_series_after_a_restart_holds_its_own_stored_results_only(
    app_with_tenants: Any, tmp_path: Path
) -> None:
    """The plots' results from before a restart (read from the store at the start) are each
    tenant's own, as those counted as they finish."""
    store = ResultStore(tmp_path / "reads.db")  # the database the server opens next
    await store.open()
    for tenant, job_id, reward in (("alice", "a1", 1.0), ("alice", "a2", 1.0), ("bob", "b1", 0.0)):
        key = job_key(tenant, job_id)
        await store.add_jobs([JobRecord(key, "queued", "probe", None, {}, 0.0, tenant=tenant)])
        await store.save_result(
            key,
            RolloutResult(
                job_id=key,
                state="done",
                data_source="probe",
                reward=reward,
                trajectory=Trajectory(),
                timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
            ),
        )
    await store.close()
    async with app_with_tenants() as (_, http):
        reads = {
            key: (await http.get("/v1/dashboard/series", headers=auth(key))).json()
            for key in (ALICE, BOB, MALLORY, ADMIN)
        }
    finished = {key: sum(series["finished"]) for key, series in reads.items()}
    assert finished == {ALICE: 2, BOB: 1, MALLORY: 0, ADMIN: 3}
    rewards = {k: [m for m in s["reward_mean"] if m is not None] for k, s in reads.items()}
    assert rewards[ALICE] and set(rewards[ALICE]) == {1.0}
    assert rewards[BOB] == [0.0] and rewards[MALLORY] == []


async def test_a_tenants_search_and_filtered_export_find_its_own_jobs_only(
    app_with_tenants: Any,
) -> None:
    """Mallory searches the list and exports by every word of Alice's: nothing; a search is
    matched against the id a tenant knows its job by, never the server's key (``bob~...``)."""
    async with app_with_tenants() as (_, http):
        await alices_work(http)
        await run(http, MALLORY, probe_instance(), "mine")

        async def found(key: str, q: str) -> tuple[list[str], list[str]]:
            """(the list's job ids, the export's) for ``q``, as ``key`` reads them."""
            listed = await http.get("/v1/dashboard/jobs", params={"q": q}, headers=auth(key))
            streamed = await http.get("/v1/rollouts:export", params={"q": q}, headers=auth(key))
            assert listed.status_code == streamed.status_code == 200, (listed.text, streamed.text)
            exported = [json.loads(line)["job_id"] for line in streamed.text.splitlines()]
            return [j["job_id"] for j in listed.json()["jobs"]], exported

        for secret in (HER_JOB, HER_SOURCE, HER_INSTANCE, "boom", "RuntimeError", "alice", "~"):
            assert await found(MALLORY, secret) == ([], []), secret
        assert await found(MALLORY, "mine") == (["mine"], ["mine"])
        assert await found(MALLORY, "probe") == (["mine"], ["mine"])  # her task, not Bob's too
        # Bob's key is "bob~bob-run": his search of "~" or "bob~" matches no id he knows.
        assert await found(BOB, "~") == ([], []) and await found(BOB, "bob~") == ([], [])
        assert await found(BOB, "bob-run") == (["bob-run"], ["bob-run"])
        # The controls: Alice finds hers by each word; the admin, who knows keys, by the key.
        for word in (HER_JOB, HER_SOURCE, HER_INSTANCE, "boom", "runtimeerror"):
            assert await found(ALICE, word) == ([HER_JOB], [HER_JOB]), word
        listed, exported = await found(ADMIN, "alice~")
        assert listed == [f"alice~{HER_JOB}"] and exported == [HER_JOB]  # each as it shows ids
