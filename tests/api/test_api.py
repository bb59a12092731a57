"""The HTTP API, through FastAPI's real request handling (ASGI), with the lifespan running."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from raas.helpers.ports import free_port
from raas.tasks.countdown import generate_instances
from raas.wire import RolloutResult
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

Client = Callable[..., Any]


async def result_of(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S})
    assert r.status_code == 200
    body = r.json()
    assert body["result"] is not None, body
    RolloutResult.model_validate(body["result"])
    return dict(body["result"])


async def test_submit_then_long_poll_a_countdown_result(client: Client) -> None:
    async with client() as http:
        instance = generate_instances(1, seed=1)[0]
        r = await http.post("/v1/rollouts", json={"instance": instance, "job_id": "cd-1"})
        assert r.status_code == 202
        assert r.json() == {"job_id": "cd-1", "state": "queued", "created": True}
        result = await result_of(http, "cd-1")
    assert result["state"] == "done" and result["reward"] == 1.0
    assert result["trajectory"]["messages"][0]["role"] == "system"


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"instance": {}}, ["body", "instance"]),
        ({"instance": {"data_source": "nope"}}, ["body", "instance", "data_source"]),
        (
            {"instance": {"data_source": "countdown", "numbers": "12", "target": 3}},
            ["body", "instance", "numbers"],
        ),
        (
            {
                "instance": {"data_source": "countdown", "numbers": [1, 2], "target": 3},
                "sampling_params": {"temprature": 0.5},
            },
            ["body", "sampling_params", "temprature"],
        ),
        ({"instance": {"data_source": "probe"}, "timeout": 3}, ["body", "timeout"]),
        ({"instance": {"data_source": "probe"}, "timeout_s": -1}, ["body", "timeout_s"]),
        (
            {"instance": {"data_source": "probe"}, "branch": {"job_id": "a", "turn": 0}},
            ["body", "branch", "turn"],
        ),
    ],
)
async def test_bad_input_is_422_naming_the_field(
    client: Client, body: dict[str, Any], loc: list[str]
) -> None:
    async with client() as http:
        r = await http.post("/v1/rollouts", json=body)
        status = await http.get("/v1/status")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == loc
    assert status.json()["in_flight"] == 0


async def test_a_branch_of_a_job_the_server_does_not_know_is_a_404_naming_it(
    client: Client,
) -> None:
    body = {"instance": {"data_source": "probe"}, "branch": {"job_id": "nobody", "turn": 1}}
    async with client() as http:
        r = await http.post("/v1/rollouts", json=body)
        batch = await http.post("/v1/rollouts:batch", json={"jobs": [body]})
        status = await http.get("/v1/status")
    assert (r.status_code, batch.status_code) == (404, 404)
    assert r.json()["detail"] == "branch.job_id: no job nobody is known to this server"
    assert batch.json()["detail"].startswith("jobs.0.branch.job_id: no job nobody")
    assert status.json()["in_flight"] == 0  # nothing accepted


async def test_a_body_not_sent_as_json_is_a_415_saying_how(client: Client) -> None:
    body = json.dumps({"instance": {"data_source": "probe"}})
    async with client() as http:
        form = await http.post(  # what curl -d sends
            "/v1/rollouts",
            content=body,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        bare = await http.post("/v1/rollouts", content=body, headers={"content-type": ""})
        listed = await http.post("/v1/rollouts", json=[1])  # JSON, but not an object: a 422
    assert form.status_code == 415 and bare.status_code == 415
    assert (
        "Content-Type: application/json (got 'application/x-www-form-urlencoded'"
        in (form.json()["detail"])
    )
    assert "(got none;" in bare.json()["detail"]
    assert listed.status_code == 422 and listed.json()["detail"][0]["loc"] == ["body"]


async def test_batch_names_the_bad_job_and_accepts_none(client: Client) -> None:
    async with client() as http:
        good = {"instance": probe_instance(), "job_id": "ok-1"}
        bad = {"instance": {"data_source": "countdown", "numbers": [0], "target": 1}}
        r = await http.post("/v1/rollouts:batch", json={"jobs": [good, bad]})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "jobs", 1, "instance", "numbers", 0]
        assert (await http.get("/v1/rollouts/ok-1")).status_code == 404
        r = await http.post(
            "/v1/rollouts:batch", json={"jobs": [good, {"instance": probe_instance()}]}
        )
        assert r.status_code == 202
        ids = [j["job_id"] for j in r.json()["jobs"]]
        assert ids[0] == "ok-1" and len(set(ids)) == 2
        for job_id in ids:
            assert (await result_of(http, job_id))["state"] == "done"


async def test_overload_is_429_with_retry_after(client: Client, probe: ProbeTask) -> None:
    async with client(init_workers=1, init_queue=1) as http:
        await http.post(
            "/v1/rollouts", json={"instance": probe_instance(init="block"), "job_id": "a"}
        )
        await probe.wait_entered("a", "init")
        assert (
            await http.post("/v1/rollouts", json={"instance": probe_instance(), "job_id": "b"})
        ).status_code == 202
        r = await http.post("/v1/rollouts", json={"instance": probe_instance(), "job_id": "c"})
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        probe.release("a", "init")
        assert (await result_of(http, "a"))["state"] == "done"
        assert (await result_of(http, "b"))["state"] == "done"
        assert (await http.get("/v1/rollouts/c")).status_code == 404


async def test_idempotent_resubmission_and_conflict(client: Client) -> None:
    async with client() as http:
        body = {"instance": probe_instance(), "job_id": "idem"}
        first = await http.post("/v1/rollouts", json=body)
        again = await http.post("/v1/rollouts", json=body)
        assert first.status_code == 202 and again.status_code == 200
        assert again.json()["created"] is False and again.json()["job_id"] == "idem"
        other = await http.post(
            "/v1/rollouts", json={**body, "instance": probe_instance(run="raise")}
        )
        assert other.status_code == 409 and "idem" in other.json()["detail"]
        await result_of(http, "idem")


async def test_a_failing_job_is_a_result_not_a_server_error(client: Client) -> None:
    async with client() as http:
        r = await http.post("/v1/rollouts", json={"instance": probe_instance(eval="raise")})
        result = await result_of(http, r.json()["job_id"])
    assert result["state"] == "failed" and result["stage_failed"] == "eval"
    assert result["error"]["message"] == "boom in eval"
    assert result["trajectory"]["stop_reason"] == "finish"


async def test_cancel_route(client: Client, probe: ProbeTask) -> None:
    async with client() as http:
        await http.post(
            "/v1/rollouts", json={"instance": probe_instance(run="block"), "job_id": "c1"}
        )
        await probe.wait_entered("c1", "run")
        r = await http.post("/v1/rollouts/c1/cancel")
        assert r.status_code == 200
        assert r.json()["state"] == "cancelled"
        assert r.json()["result"]["stage_failed"] == "run"
        assert (await http.post("/v1/rollouts/nope/cancel")).status_code == 404
        assert (await http.get("/v1/rollouts/nope")).status_code == 404
    assert probe.closed["c1"] == 1


async def test_get_while_running_shows_the_stage(client: Client, probe: ProbeTask) -> None:
    async with client() as http:
        await http.post(
            "/v1/rollouts", json={"instance": probe_instance(eval="block"), "job_id": "s"}
        )
        await probe.wait_entered("s", "eval")
        body = (await http.get("/v1/rollouts/s")).json()
        assert body == {"job_id": "s", "state": "eval", "stage": "eval", "result": None}
        probe.release("s", "eval")
        await result_of(http, "s")


async def test_paging_through_finished_results(client: Client) -> None:
    async with client() as http:
        jobs = [{"instance": probe_instance(), "job_id": f"p{i}"} for i in range(5)]
        jobs.append({"instance": probe_instance(run="raise"), "job_id": "p-bad"})
        await http.post("/v1/rollouts:batch", json={"jobs": jobs})
        for job in jobs:
            await result_of(http, job["job_id"])
        seen: list[str] = []
        since = 0
        while True:
            page = (await http.get("/v1/rollouts", params={"since": since, "limit": 2})).json()
            if not page["results"]:
                break
            seen += [r["job_id"] for r in page["results"]]
            since = page["next_since"]
        failed = (await http.get("/v1/rollouts", params={"state": "failed"})).json()
        bad_state = await http.get("/v1/rollouts", params={"state": "run"})
    assert sorted(seen) == sorted(j["job_id"] for j in jobs)
    assert [r["job_id"] for r in failed["results"]] == ["p-bad"]
    assert bad_state.status_code == 422


async def test_status_metrics_health_and_openapi(client: Client, probe: ProbeTask) -> None:
    async with client(run_workers=3, max_attempts=1) as http:
        await http.post(
            "/v1/rollouts",
            json={"instance": {**probe_instance(run="block"), "malformed": 3}, "job_id": "m"},
        )
        await probe.wait_entered("m", "run")
        status = (await http.get("/v1/status")).json()
        assert status["stages"]["run"] == {
            "workers": 3,
            "active": 1,
            "queued": 0,
            "queue_capacity": 64,
        }
        assert status["in_flight"] == 1 and status["accepting"] is True
        assert "countdown" in status["tasks"]
        probe.release("m", "run")
        await result_of(http, "m")
        for how in ("policy", "raise"):
            job = {"instance": probe_instance(eval=how), "job_id": how}
            await http.post("/v1/rollouts", json=job)
            await result_of(http, how)
        tampered = {**probe_instance(), "reward": 0.0, "tamper": "1 twin(s) passed: t"}
        await http.post("/v1/rollouts", json={"instance": tampered, "job_id": "tampered"})
        await result_of(http, "tampered")
        metrics = (await http.get("/metrics")).text
        health = await http.get("/healthz")
        spec = (await http.get("/openapi.json")).json()
    assert 'raas_jobs_finished_total{data_source="probe",state="done"} 2.0' in metrics
    assert 'raas_judge_tamper_total{data_source="probe"} 1.0' in metrics
    assert 'raas_stage_duration_seconds_count{stage="run"} 4.0' in metrics
    assert 'raas_job_errors_total{data_source="probe",kind="policy"} 1.0' in metrics
    assert 'raas_job_errors_total{data_source="probe",kind="infra"} 1.0' in metrics
    assert 'raas_queue_depth{stage="init"} 0.0' in metrics
    assert 'raas_malformed_tool_calls_total{data_source="probe"} 3.0' in metrics
    assert health.json() == {"status": "ok"}
    assert {"/v1/rollouts", "/v1/rollouts:batch", "/process"} <= set(spec["paths"])


async def test_backend_routes(client: Client) -> None:
    async with client(llm=["http://127.0.0.1:9/v1"], llm_protocol="sglang") as http:
        (first,) = (await http.get("/v1/backends")).json()
        assert first["url"] == "http://127.0.0.1:9" and first["protocol"] == "sglang"
        r = await http.post(
            "/v1/backends", json={"url": "http://10.0.0.2:8000", "protocol": "verl", "capacity": 4}
        )
        assert r.status_code == 201 and r.json()["capacity"] == 4 and r.json()["sessions"] == 0
        bad = await http.post("/v1/backends", json={"url": "x", "protocol": "tgi"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "protocol"]
        assert (await http.delete(f"/v1/backends/{first['id']}")).status_code == 204
        assert (await http.delete(f"/v1/backends/{first['id']}")).status_code == 404
        assert [b["url"] for b in (await http.get("/v1/backends")).json()] == [
            "http://10.0.0.2:8000"
        ]


async def test_api_key(client: Client) -> None:
    async with client(api_key="s3cret") as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/v1/status")).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await http.get("/v1/status", headers=wrong)).status_code == 401
        right = {"Authorization": "Bearer s3cret"}
        assert (await http.get("/v1/status", headers=right)).status_code == 200
        r = await http.post("/process", json={"instance": probe_instance()})
        assert r.status_code == 401


async def test_prorl_compatible_routes(client: Client, probe: ProbeTask) -> None:
    async with client() as http:
        r = await http.post("/process", json={"instance": probe_instance(), "job_id": "pr1"})
        assert r.status_code == 200
        assert r.json()["state"] == "done" and r.json()["reward"] == 0.5

        await http.post(
            "/v1/rollouts", json={"instance": probe_instance(run="block"), "job_id": "pr2"}
        )
        await probe.wait_entered("pr2", "run")
        r = await http.post("/cancel", json={"job_id": "pr2"})
        assert r.json()["state"] == "cancelled"

        assert (await http.post("/add_llm_server", json={"address": "http://gpu1:8000/v1"})).json()[
            "ok"
        ]
        await http.post("/add_llm_server", json={"address": "http://gpu2:8000/v1"})
        status = (await http.get("/status")).json()
        assert status["llm_servers"] == ["http://gpu1:8000", "http://gpu2:8000"]
        listed = (await http.get("/v1/backends")).json()
        assert [b["protocol"] for b in listed] == ["vllm", "vllm"]
        await http.post("/clear_llm_server")
        assert (await http.get("/status")).json()["llm_servers"] == []

        assert (await http.post("/stop")).status_code == 200
        refused = await http.post("/process", json={"instance": probe_instance()})
        assert refused.status_code == 503 and "draining" in refused.json()["detail"]
        assert (await http.get("/status")).json()["accepting"] is False
        await http.post("/start")
        r = await http.post("/process", json={"instance": probe_instance()})
        assert r.status_code == 200 and r.json()["state"] == "done"
        bad = await http.post("/process", json={"instance": {"data_source": "nope"}})
        assert bad.status_code == 422


async def test_start_up_says_when_agent_jobs_cannot_run(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with client(llm=[dead]):
        pass
    assert f"LLM backend {dead} does not answer" in caplog.text and "check --llm" in caplog.text
    caplog.clear()
    async with client():
        pass
    assert "no LLM backend: agent tasks fail until one is added" in caplog.text


async def test_running_jobs_are_listed_with_their_progress(
    client: Client, probe: ProbeTask
) -> None:
    async with client() as http:
        instance = {**probe_instance(run="block"), "instance_id": "probe-7"}
        await http.post("/v1/rollouts", json={"instance": instance, "job_id": "r"})
        await probe.wait_entered("r", "run")
        running = (await http.get("/v1/rollouts:running")).json()["jobs"]
        probe.release("r", "run")
        await result_of(http, "r")
        after = (await http.get("/v1/rollouts:running")).json()["jobs"]
    (job,) = running
    assert (job["job_id"], job["state"], job["stage"], job["data_source"]) == (
        "r",
        "run",
        "run",
        "probe",
    )
    assert (job["turns"], job["response_tokens"], job["attempts"]) == (1, 3, 1)
    assert (job["instance_id"], job["task"], job["prompt_tokens"]) == ("probe-7", "probe", 0)
    assert job["elapsed_s"] >= 0
    assert after == []
