"""The dashboard's routes without a browser: the key guards /ui and its data (the session cookie
opens reads only), the job list filters and pages over every result in the database (an older
database's, and a previous process's, included), and a trajectory's tokens are decoded."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from raas.api.auth import COOKIE, session_token
from raas.llm.chat import encode, token_texts
from raas.llm.models import load_tokenizer
from raas.pipeline import Stage
from raas.store.dashboard import JobFilter
from raas.store.sqlite import JobRecord, ResultStore
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

KEY = "dash-s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
Client = Callable[..., Any]
SOLVABLE = {"data_source": "countdown", "numbers": [3, 4, 100], "target": 7}
UNSOLVABLE = {"data_source": "countdown", "numbers": [2, 2], "target": 97}
OLD_SCHEMA = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, state TEXT NOT NULL, data_source TEXT,
    instance_id TEXT, request TEXT NOT NULL, created_at REAL NOT NULL, seq INTEGER UNIQUE,
    finished_at REAL, reward REAL, result TEXT, attempts INTEGER NOT NULL DEFAULT 1,
    attempt_errors TEXT);
CREATE INDEX jobs_state_seq ON jobs(state, seq);
"""
OLD_COLUMNS = (
    "job_id, state, data_source, instance_id, request, created_at, seq, finished_at, reward,"
    " result, attempts, attempt_errors"
)
READS = (
    "/ui",
    "/ui/assets/app.js",
    "/v1/dashboard/stats",
    "/v1/dashboard/jobs",
    "/v1/dashboard/jobs/x/tokens",
    "/v1/status",
    "/v1/rollouts:running",
    "/v1/dashboard/series",
    "/v1/dashboard/distributions",
)


def cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={value}"}


# -- the key ------------------------------------------------------------------------------------


async def test_without_the_key_the_page_and_its_data_are_refused(client: Client) -> None:
    async with client(api_key=KEY) as http:
        for path in READS:
            r = await http.get(path)
            assert r.status_code == 401, path
        page = await http.get("/ui")
        assert page.headers["content-type"].startswith("text/html")
        assert 'name="key"' in page.text and "not the server's" not in page.text
        wrong = await http.get("/ui", params={"key": "nope"})
        assert wrong.status_code == 401 and "not the server's" in wrong.text
        assert (await http.post("/ui/login", data={"key": "nope"})).status_code == 401
        assert (await http.post("/ui/login", data={"other": KEY})).status_code == 422
        # A key beyond latin-1 is a wrong key, not a 500.
        assert (await http.get("/ui?key=%F3%90%B5%86")).status_code == 401
        assert (await http.post("/ui/login", data={"key": "\U000d0d46"})).status_code == 401
        # Anyone may post the form: a body past a few kB is not read on.
        huge = await http.post("/ui/login", data={"key": "x" * 10_000})
        assert huge.status_code == 413
        # The header opens everything, as on every route.
        for path in READS[:3]:
            assert (await http.get(path, headers=AUTH)).status_code == 200, path


async def test_the_key_once_gives_a_session_cookie_that_only_reads(client: Client) -> None:
    async with client(api_key=KEY) as http:
        r = await http.get("/ui", params={"key": KEY})
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        set_cookie = r.headers["set-cookie"]
        value = r.cookies[COOKIE]
        assert KEY not in value and value == session_token(KEY.encode()).decode()
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
            assert attribute.lower() in set_cookie.lower(), set_cookie
        assert "secure" not in set_cookie.lower()  # plain http: a Secure cookie never returns
        http.cookies.clear()

        for path in READS[:3] + READS[5:]:
            assert (await http.get(path, headers=cookie(value))).status_code == 200, path
        page = await http.get("/ui", headers=cookie(value))
        assert "script-src 'self'" in page.headers["content-security-policy"]
        # A cookie is sent with whatever a browser sends: it changes nothing.
        job = {"instance": probe_instance()}
        assert (await http.post("/v1/rollouts", json=job, headers=cookie(value))).status_code == 401
        assert (await http.delete("/v1/backends/x", headers=cookie(value))).status_code == 401
        for forged in (KEY, session_token(b"another key").decode(), value[:-1], ""):
            assert (await http.get("/v1/status", headers=cookie(forged))).status_code == 401

        login = await http.post("/ui/login", data={"key": KEY})
        assert login.status_code == 303 and login.headers["location"] == "/ui"
        assert login.cookies[COOKIE] == value


async def test_without_an_api_key_the_dashboard_is_open(client: Client) -> None:
    async with client() as http:
        page = await http.get("/ui")
        assert page.status_code == 200 and '<script src="ui/assets/app.js"' in page.text
        script = await http.get("/ui/assets/app.js")
        assert script.headers["content-type"].startswith("text/javascript")
        # The plotting library is the package's own copy, its license beside it: no CDN.
        assert '<script src="ui/assets/uPlot.iife.min.js"' in page.text and "//" not in "".join(
            line for line in page.text.splitlines() if "src=" in line or "href=" in line
        )
        uplot = await http.get("/ui/assets/uPlot.iife.min.js")
        assert uplot.status_code == 200 and uplot.text.startswith("/*! https://github.com/leeoniya")
        assert "MIT License" in (await http.get("/ui/assets/uPlot.LICENSE")).text
        for name in ("nope.js", "__init__.py", "login.html", "..%2Fauth.py"):
            assert (await http.get(f"/ui/assets/{name}")).status_code == 404, name
        assert (await http.post("/ui/login", data={"key": "x"})).status_code == 303
        # The form is still a form: one without its field is refused, as with a key.
        for form in (None, {"other": "x"}):
            r = await http.post("/ui/login", data=form)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "key"]


# -- the job list and the counts ----------------------------------------------------------------


async def submit_and_finish(http: httpx.AsyncClient, jobs: dict[str, dict[str, Any]]) -> None:
    for job_id, instance in jobs.items():
        r = await http.post("/v1/rollouts", json={"instance": instance, "job_id": job_id})
        assert r.status_code == 202, r.text
    for job_id in jobs:
        r = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S})
        assert r.json()["result"] is not None, r.text


JOBS = {
    "ok-1": probe_instance(),
    "crash": probe_instance(run="raise"),
    "solved": SOLVABLE,
    "misbehaved": probe_instance(eval="policy"),
    "unsolved": UNSOLVABLE,
    "ok-2": {**probe_instance(), "malformed": 2},  # two tool calls it could not read
}


def ids(page: dict[str, Any]) -> list[str]:
    return [j["job_id"] for j in page["jobs"]]


async def test_the_job_list_filters_and_pages_newest_first(client: Client) -> None:
    async with client() as http:
        await submit_and_finish(http, JOBS)
        order = [r["job_id"] for r in (await http.get("/v1/rollouts")).json()["results"]]

        async def listed(**params: Any) -> dict[str, Any]:
            r = await http.get("/v1/dashboard/jobs", params=params)
            assert r.status_code == 200, r.text
            page: dict[str, Any] = r.json()
            return page

        everything = await listed()
        assert ids(everything) == order[::-1] and everything["next_before"] is None
        crash = next(j for j in everything["jobs"] if j["job_id"] == "crash")
        assert crash["state"] == "failed" and crash["error_type"] == "RuntimeError"
        assert crash["error_kind"] == "infra" and crash["stage_failed"] == "run"
        assert "boom in run" in crash["error_message"]
        assert crash["turns"] == 1 and crash["response_tokens"] == 3 and crash["task"] == "probe"
        assert "trajectory" not in crash

        assert set(ids(await listed(state="failed"))) == {"crash", "misbehaved"}
        assert ids(await listed(error_type="PolicyError")) == ["misbehaved"]
        assert set(ids(await listed(data_source="countdown"))) == {"solved", "unsolved"}
        assert ids(await listed(min_reward=0.75)) == ["solved"]
        assert set(ids(await listed(max_reward=0.25))) == {"unsolved"}
        assert set(ids(await listed(min_reward=0.5, max_reward=0.5))) == {"ok-1", "ok-2"}
        assert ids(await listed(state="done", data_source="probe", min_reward=1)) == []

        pages, before = [], None
        while True:
            page = await listed(limit=4, **({"before": before} if before else {}))
            pages.append(ids(page))
            before = page["next_before"]
            if before is None:
                break
        assert [len(p) for p in pages] == [4, 2] and [j for p in pages for j in p] == ids(
            everything
        )

        for bad in ({"state": "running"}, {"min_reward": "nan"}, {"limit": 0}, {"before": 0}):
            assert (await http.get("/v1/dashboard/jobs", params=bad)).status_code == 422, bad


async def test_the_counts_cover_every_result(client: Client) -> None:
    async with client() as http:
        await submit_and_finish(http, JOBS)
        stats = (await http.get("/v1/dashboard/stats")).json()
    assert stats["finished"] == {"done": 4, "failed": 2}
    assert stats["failures"] == [
        {"type": "PolicyError", "kind": "policy", "count": 1},
        {"type": "RuntimeError", "kind": "infra", "count": 1},
    ]
    minute, ten = stats["throughput"]
    assert minute["window_s"] == 60 and minute["finished"] == ten["finished"] == 6
    # Three tokens each probe job (countdown plays without a model: no tokens).
    assert minute["response_tokens"] == 3 * 4
    assert stats["data_sources"] == ["countdown", "probe"]
    # By data_source: a trainer mixing datasets sees which one pays (countdown: one of two
    # solved; the probe's two done jobs score 0.5, its two failures none).
    countdown, probe = stats["sources"]
    assert countdown == {
        "data_source": "countdown",
        "finished": {"done": 2},
        "rewarded": 2,
        "mean_reward": 0.5,
        "pass_rate": 0.5,
        "finished_recently": 2,
    }
    assert probe["finished"] == {"done": 2, "failed": 2} and probe["finished_recently"] == 4
    assert (probe["rewarded"], probe["pass_rate"]) == (2, 0.0)


async def test_the_distributions_say_how_the_last_jobs_ended_and_how_long_they_ran(
    client: Client,
) -> None:
    async with client() as http:
        await submit_and_finish(http, JOBS)
        url = "/v1/dashboard/distributions"
        seen = (await http.get(url)).json()
        last_two = (await http.get(url, params={"last": 2})).json()
        assert (await http.get(url, params={"last": 0})).status_code == 422
    # The probe's four finish (one then fails in EVAL: its loop still finished), countdown's
    # unsolved one runs out of moves, the crash fails before its loop says why it stopped.
    assert seen["jobs"] == 6
    assert seen["stop_reasons"] == {"finish": 4, "no_moves": 1, "failed": 1}
    assert seen["turns"] == [0, 3, 3]  # three jobs of one turn, three of two
    # Three response tokens each probe job, none a countdown one: bins of one token.
    assert seen["response_tokens_bin"] == 1
    assert seen["response_tokens"] == [2, 0, 0, 4] + [0] * 8
    assert last_two["jobs"] == 2 and sum(last_two["turns"]) == 2


async def test_the_distributions_count_the_groups_whose_rewards_teach_nothing(
    client: Client,
) -> None:
    # GRPO's samples of a prompt name one group: one whose rewards are all equal has a zero
    # advantage. A group with one rewarded job among these is no group to count.
    jobs = {
        "same-0": ({**SOLVABLE}, "same"),
        "same-1": ({**SOLVABLE}, "same"),
        "mixed-0": ({**SOLVABLE}, "mixed"),
        "mixed-1": ({**UNSOLVABLE}, "mixed"),
        "alone-0": ({**SOLVABLE}, "alone"),
        "nogroup": ({**SOLVABLE}, None),
    }
    async with client() as http:
        for job_id, (instance, group) in jobs.items():
            body = {"instance": instance, "job_id": job_id, "group": group}
            assert (await http.post("/v1/rollouts", json=body)).status_code == 202
        for job_id in jobs:
            r = await http.get(f"/v1/rollouts/{job_id}", params={"wait": WAIT_S})
            assert r.json()["result"] is not None
        seen = (await http.get("/v1/dashboard/distributions")).json()
        newest = (await http.get("/v1/dashboard/distributions", params={"last": 3})).json()
        last_three = ids((await http.get("/v1/dashboard/jobs", params={"limit": 3})).json())
    assert (seen["groups"], seen["groups_all_equal"]) == (2, 1)
    # Only the last jobs count: a group is one where two of them are (in the order they ended).
    whole = [g for g in ("same", "mixed") if {f"{g}-0", f"{g}-1"} <= set(last_three)]
    assert newest["groups"] == len(whole)


async def test_results_of_an_earlier_process_and_an_older_database_are_listed(
    client: Client, tmp_path: Path
) -> None:
    async with client(db=tmp_path / "new.db") as http:
        await submit_and_finish(http, JOBS)
    # The same results in a database as raas wrote them before the dashboard's columns.
    with sqlite3.connect(tmp_path / "api.db") as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("ATTACH ? AS new", (str(tmp_path / "new.db"),))
        conn.execute(f"INSERT INTO jobs SELECT {OLD_COLUMNS} FROM new.jobs")
    async with client() as http:
        status = (await http.get("/v1/status")).json()
        assert not any(status["finished"].values())  # this process finished nothing itself
        stats = (await http.get("/v1/dashboard/stats")).json()
        assert stats["finished"] == {"done": 4, "failed": 2}
        assert [f["type"] for f in stats["failures"]] == ["PolicyError", "RuntimeError"]
        # The rewards counted from the table when the store opened.
        assert (stats["rewarded"], stats["mean_reward"], stats["pass_rate"]) == (4, 0.5, 0.25)
        crashed = await http.get("/v1/dashboard/jobs", params={"error_type": "RuntimeError"})
        (crash,) = crashed.json()["jobs"]
        assert crash["job_id"] == "crash" and crash["response_tokens"] == 3


async def test_the_counts_follow_a_result_written_over_and_survive_a_reopen(
    tmp_path: Path,
) -> None:
    def result(state: str, error: str | None) -> RolloutResult:
        return RolloutResult(
            job_id="j",
            state=state,
            data_source="probe",
            trajectory=Trajectory(),
            timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
            error=ErrorInfo(type=error, message="m", kind="policy") if error else None,
        )

    store = ResultStore(tmp_path / "tally.db")
    await store.open()
    await store.add_jobs([JobRecord("j", "queued", "probe", None, {}, 0.0)])
    await store.save_result("j", result("failed", "PolicyError"))
    failed = await store.stats()
    assert failed.finished == {"failed": 1} and [f.type for f in failed.failures] == ["PolicyError"]
    assert [s.finished for s in failed.sources] == [{"failed": 1}]
    await store.save_result("j", result("done", None))
    done = await store.stats()
    assert done.finished == {"done": 1} and done.failures == []
    assert [(s.data_source, s.finished) for s in done.sources] == [("probe", {"done": 1})]
    await store.close()
    reopened = ResultStore(tmp_path / "tally.db")
    await reopened.open()
    assert (await reopened.stats()).model_dump(exclude={"throughput"}) == done.model_dump(
        exclude={"throughput"}
    )
    await reopened.close()


# -- tokens -------------------------------------------------------------------------------------


async def test_a_jobs_tokens_are_decoded_finished_or_running(
    client: Client, probe: ProbeTask
) -> None:
    tok = load_tokenizer("tiny")
    async with client(tokenizer="tiny") as http:
        await submit_and_finish(http, {"done": probe_instance()})
        done = (await http.get("/v1/dashboard/jobs/done/tokens")).json()
        assert done["state"] == "done" and done["tokenizer"] == "tiny"
        assert done["response_ids"] == [1, 2, 3]
        assert done["response_text"] == token_texts(tok, [1, 2, 3])
        assert done["policy_versions"] == [4, 4, 4]  # the probe's turn record names them

        job = {"instance": probe_instance(run="block"), "job_id": "running"}
        assert (await http.post("/v1/rollouts", json=job)).status_code == 202
        await probe.wait_entered("running", "run")
        running = (await http.get("/v1/dashboard/jobs/running/tokens")).json()
        assert running["state"] == "run" and running["response_ids"] == [1, 2, 3]
        probe.release("running", "run")

        missing = await http.get("/v1/dashboard/jobs/nope/tokens")
        assert missing.status_code == 404 and "nope" in missing.json()["detail"]
    async with client(tokenizer=str(Path(__file__).parent / "no-such-tokenizer")) as http:
        ids_only = (await http.get("/v1/dashboard/jobs/done/tokens")).json()
        assert ids_only["response_ids"] == [1, 2, 3] and ids_only["response_text"] is None
        assert ids_only["tokenizer"] is None and "could not decode" in ids_only["note"]


async def test_a_gateway_jobs_segments_each_show_their_tokens(
    client: Client, tmp_path: Path
) -> None:
    # A harness job's calls that did not extend each other's conversation: two segments, the
    # second's tokens in the result's metrics, every call's turn record on the first's.
    turns = [
        {"output_tokens": 3, "segment": 0, "policy_version": 4},
        {"output_tokens": 2, "segment": 1, "policy_version": 5},
    ]
    first = Trajectory(
        prompt_ids=[5, 6], response_ids=[1, 2, 3], loss_mask=[1, 1, 1], logprobs=[-0.1] * 3
    )
    first.turns.extend(turns)
    second = Trajectory(prompt_ids=[7], response_ids=[8, 9, 10], loss_mask=[1, 0, 1])
    second.logprobs.extend([-0.2, 0.0, -0.3])
    store = ResultStore(tmp_path / "segments.db")
    await store.open()
    await store.add_jobs([JobRecord("g", "queued", "probe", None, {}, 0.0)])
    metrics = {"segments": [first.model_dump(), second.model_dump()]}
    await store.save_result(
        "g",
        RolloutResult(
            job_id="g",
            state="done",
            data_source="probe",
            trajectory=first,
            metrics=metrics,
            timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
        ),
    )
    await store.close()
    async with client(db=tmp_path / "segments.db", tokenizer="tiny") as http:
        url = "/v1/dashboard/jobs/g/tokens"
        zero = (await http.get(url)).json()
        assert (zero["segment"], zero["segments"], zero["response_ids"]) == (0, 2, [1, 2, 3])
        assert zero["policy_versions"] == [4, 4, 4]
        one = (await http.get(url, params={"segment": 1})).json()
        assert (one["segment"], one["prompt_ids"], one["response_ids"]) == (1, [7], [8, 9, 10])
        assert one["loss_mask"] == [1, 0, 1] and one["policy_versions"] == [5, None, 5]
        past = await http.get(url, params={"segment": 2})
        assert past.status_code == 404 and "has 2 segments" in past.json()["detail"]
        assert (await http.get(url, params={"segment": -1})).status_code == 422


def test_token_texts_keep_characters_whole_and_mark_unknown_ids() -> None:
    tok = load_tokenizer("tiny")
    ids = encode(tok, "héllo 🎉<|im_end|>") + [len(tok) + 7]
    texts = token_texts(tok, ids)
    assert len(texts) == len(ids) and texts[-1] is None
    assert "".join(t for t in texts if t) == "héllo 🎉<|im_end|>"
    emoji = texts.index(" 🎉")
    assert texts[emoji - 1] == "" and all("\ufffd" not in (t or "") for t in texts)


# -- plots over time ----------------------------------------------------------------------------


async def test_the_series_count_what_finished_by_bucket(client: Client) -> None:
    async with client() as http:
        await submit_and_finish(http, JOBS)
        r = await http.get("/v1/dashboard/series")
        assert r.status_code == 200, r.text
        series = r.json()
        stats = (await http.get("/v1/dashboard/stats")).json()
    n = len(series["t"])
    assert n >= 1 and all(len(v) == n for k, v in series.items() if isinstance(v, list))
    steps = {b - a for a, b in zip(series["t"], series["t"][1:], strict=False)}
    assert steps <= {series["bucket_s"]}  # one point a bucket, empty ones included

    def total(key: str) -> float:
        return sum(x or 0 for x in series[key])

    def weighted(key: str) -> float:  # a bucket's mean back to its sum
        return sum((m or 0) * w for m, w in zip(series[key], series["rewarded"], strict=True))

    assert total("finished") == 6
    assert total("rollouts_per_min") * series["bucket_s"] / 60 == 6
    # Rewards: two probes 0.5 each, countdown solved 1 and unsolved 0; the failures none.
    assert total("rewarded") == 4 and weighted("reward_mean") == 2.0
    assert weighted("pass_rate") == 1  # the solved countdown
    # The probe's three response tokens are generated (mask 1): 4 probe jobs ran RUN.
    assert total("generated_tokens_per_s") * series["bucket_s"] == 3 * 4
    # The crash's run again once (infra) and failed again; the policy error is never retried.
    assert {k: sum(v) for k, v in series["errors"].items()} == {"infra": 2, "policy": 1}
    assert total("malformed_tool_calls") == 2
    assert set(series["stage_s"]) == {"init", "run", "eval"}
    for stage, means in series["stage_s"].items():
        assert any(m is not None and m >= 0 for m in means), stage
    # The overall figures, over every result in the database.
    assert stats["rewarded"] == 4 and stats["mean_reward"] == 0.5 and stats["pass_rate"] == 0.25


def test_the_series_ring_keeps_the_last_buckets_and_fills_the_gaps() -> None:
    from raas.api.series import read_series
    from raas.pipeline.ledger import Ledger, WindowSpec

    now = [1000.0]
    ledger = Ledger(clock=lambda: now[0], recent=WindowSpec(bucket_s=10.0, keep=3))
    job = SimpleNamespace(tenant="default", data_source="probe", task="probe")
    ledger.stage_ended(job, Stage.RUN, 2.0)  # type: ignore[arg-type]
    now[0] = 1015.0
    ledger.stage_ended(job, Stage.RUN, 4.0)  # type: ignore[arg-type]
    ledger.stage_ended(job, Stage.RUN, 6.0)  # type: ignore[arg-type]
    read = read_series(ledger.recent)
    assert read.t == [1000.0, 1010.0] and read.stage_s["run"] == [2.0, 5.0]
    assert read.stage_s["init"] == [None, None] and read.finished == [0, 0]
    now[0] = 1100.0  # long after: only the last `keep` buckets, the old ones out of sight
    later = read_series(ledger.recent)
    assert later.t == [1080.0, 1090.0, 1100.0] and later.stage_s["run"] == [None] * 3


def versioned(*versions: int | None) -> Trajectory:
    """One generated token a turn, each turn's record naming the policy version of its token as
    its backend reported it (None: a backend that names none)."""
    turns = [{"output_tokens": 1, "policy_version": v} for v in versions]
    n = len(turns)
    return Trajectory(response_ids=[5] * n, loss_mask=[1] * n, logprobs=[-0.1] * n, turns=turns)


async def store_finished(db: Path, rows: list[tuple[str, str, RolloutResult, float]]) -> None:
    """Write (job_id, tenant, result, finished_at) through the store as a server before a
    restart did, each result placed at ``finished_at`` (the store writes the time of the write)."""
    store = ResultStore(db)
    await store.open()
    for job_id, tenant, result, _ in rows:
        await store.add_jobs([JobRecord(job_id, "queued", "probe", None, {}, 0.0, tenant=tenant)])
        await store.save_result(job_id, result)
    await store.close()
    with sqlite3.connect(db) as conn:
        for job_id, _, _, at in rows:
            conn.execute("UPDATE jobs SET finished_at = ? WHERE job_id = ?", (at, job_id))
    conn.close()


def stored(job_id: str, reward: float | None, trajectory: Trajectory) -> RolloutResult:
    return RolloutResult(
        job_id=job_id,
        state="done",
        data_source="probe",
        reward=reward,
        trajectory=trajectory,
        timing=Timing(queue_s=0, init_s=0.5, run_s=3.0, eval_s=1.0, total_s=4.5),
    )


async def test_the_series_show_the_results_from_before_a_restart_in_their_buckets(
    client: Client, tmp_path: Path
) -> None:
    db = tmp_path / "restart.db"
    bucket_s = 10.0  # the plots' buckets (raas.pipeline.ledger.RECENT)
    # An hour back and half an hour back, each mid-bucket; and one before the two hours kept.
    hour_ago = (math.floor(time.time() / bucket_s) - 360) * bucket_s
    half_hour_ago = hour_ago + 180 * bucket_s
    await store_finished(
        db,
        [
            ("a", "default", stored("a", 1.0, versioned(2, 4)), hour_ago + 1),
            ("b", "default", stored("b", 0.0, versioned(7, 7, 7)), hour_ago + 9),
            ("c", "default", stored("c", 0.5, versioned(None)), half_hour_ago + 5),
            ("gone", "default", stored("gone", 1.0, versioned(1, 9)), hour_ago - 7300),
        ],
    )
    async with client(db=db) as http:
        before = (await http.get("/v1/dashboard/series")).json()
        await submit_and_finish(http, {"after": probe_instance()})
        after = (await http.get("/v1/dashboard/series")).json()

    first = before["t"].index(hour_ago)
    assert first == 0  # the oldest bucket that holds something (the one of "gone" is not kept)
    second = before["t"].index(half_hour_ago)
    assert before["finished"][first] == 2 and before["finished"][second] == 1
    assert sum(before["finished"]) == 3
    assert before["reward_mean"][first] == 0.5 and before["pass_rate"][first] == 0.5
    assert before["reward_mean"][second] == 0.5
    assert before["generated_tokens_per_s"][first] * bucket_s == pytest.approx(2 + 3)
    assert before["stage_s"]["run"][first] == 3.0 and before["stage_s"]["eval"][second] == 1.0
    # Spans 4-2 and 7-7; "c"'s backend named no version: no point there, not 0.
    assert before["staleness_mean"][first] == 1.0 and before["staleness_max"][first] == 2
    assert before["staleness_mean"][second] is None and before["staleness_max"][second] is None
    # The job run after the start is counted as it finished, and those before are not again.
    assert after["finished"][first] == 2 and sum(after["finished"]) == 4


async def test_a_job_scored_zero_for_tampering_says_so_in_its_summary(tmp_path: Path) -> None:
    def result(job_id: str, metrics: dict[str, Any]) -> RolloutResult:
        return RolloutResult(
            job_id=job_id,
            state="done",
            data_source="swe",
            reward=0.0,
            metrics=metrics,
            trajectory=Trajectory(),
            timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
        )

    store = ResultStore(tmp_path / "tamper.db")
    await store.open()
    await store.add_jobs([JobRecord(j, "queued", "swe", None, {}, 0.0) for j in ("t", "h")])
    await store.save_result("t", result("t", {"tamper": "1 twin(s) passed: t.T.test_x"}))
    await store.save_result("h", result("h", {"resolved": False}))
    jobs, _ = await store.summaries(JobFilter(), None, 10)
    tamper = {job.job_id: job.tamper for job in jobs}
    assert tamper == {"t": "1 twin(s) passed: t.T.test_x", "h": None}
    await store.close()


async def test_a_job_below_a_pass_says_why_where_the_judges_metrics_do(tmp_path: Path) -> None:
    # Every judge writes a reason below a pass, and the reason is the note, before the other
    # keys ("reasoned": a math judge's today). Rows stored before judges gave reasons: a
    # verifier's error (harbor), a failing case (code), the answer a math judge read; nothing
    # for a pass or a 0 whose metrics say none.
    cases = {
        "reasoned": (
            0.0,
            {"correct": False, "read": "12", "reason": "answer read: 12, expected 13"},
        ),
        "verifier": (0.0, {"verifier_error": "test.sh ran past its 60 s"}),
        "case": (0.0, {"passed": False, "failure": {"case": 2, "why": "expected 3, got 4"}}),
        "math": (0.0, {"correct": False, "read": "41"}),
        "unread": (0.0, {"correct": False, "read": None}),
        "given": (0.5, {"reason": "2 of 4 tests failed", "error": "other"}),
        "passed": (1.0, {"correct": True, "read": "42", "error": "not shown on a pass"}),
        "silent": (0.0, {"steps": 3, "valid": True}),
    }
    store = ResultStore(tmp_path / "notes.db")
    await store.open()
    await store.add_jobs([JobRecord(j, "queued", "x", None, {}, 0.0) for j in cases])
    for job_id, (reward, metrics) in cases.items():
        await store.save_result(
            job_id,
            RolloutResult(
                job_id=job_id,
                state="done",
                data_source="x",
                reward=reward,
                metrics=metrics,
                trajectory=Trajectory(),
                timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
            ),
        )
    jobs, _ = await store.summaries(JobFilter(), None, 10)
    assert {job.job_id: job.judge_note for job in jobs} == {
        "reasoned": "answer read: 12, expected 13",
        "verifier": "test.sh ran past its 60 s",
        "case": "expected 3, got 4",
        "math": "answer read: 41",
        "unread": "answer read: none",
        "given": "2 of 4 tests failed",
        "passed": None,
        "silent": None,
    }
    await store.close()


# -- searching the list, and exporting what it lists --------------------------------------------


def judged(
    job_id: str,
    *,
    instance_id: str,
    data_source: str,
    task: str | None = None,
    reward: float | None = None,
    metrics: dict[str, Any] | None = None,
    error: ErrorInfo | None = None,
) -> RolloutResult:
    return RolloutResult(
        job_id=job_id,
        state="failed" if error is not None else "done",
        stage_failed="run" if error is not None else None,
        error=error,
        reward=reward,
        metrics=metrics or {},
        trajectory=Trajectory(),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
        instance_id=instance_id,
        data_source=data_source,
        task=task,
    )


# Each row holds each searched field once, and `%`, `_` and `\` where a wildcard (or an escape)
# would match another row too.
SEARCHED = [
    judged("run-7", instance_id="gsm-0042", data_source="gsm8k", task="math", reward=1.0),
    judged(
        "run-8",
        instance_id="humaneval/12",
        data_source="code",
        task="code",
        error=ErrorInfo(type="SandboxDied", message="action server exited: 137 in C:\\sandbox"),
    ),
    judged(
        "run-9",
        instance_id="a%b",
        data_source="my_set",
        task="probe",
        reward=0.0,
        metrics={"reason": "expected 13, got 12"},
    ),
    judged(
        "run-10",
        instance_id="axb",
        data_source="myXset",
        task="probe",
        reward=0.5,
        metrics={"reason": "PARTIAL credit"},
    ),
    # A pass: its metrics' reason is no judge's note, so no search finds it there.
    judged(
        "run-11",
        instance_id="ok",
        data_source="myXset",
        task="probe",
        reward=1.0,
        metrics={"reason": "never shown"},
    ),
]


async def store_results(db: Path, results: list[RolloutResult], tenant: str = "default") -> None:
    store = ResultStore(db)
    await store.open()
    try:
        for r in results:
            key = r.job_id if tenant == "default" else f"{tenant}~{r.job_id}"
            await store.add_jobs(
                [JobRecord(key, "queued", r.data_source, r.instance_id, {}, 0.0, tenant=tenant)]
            )
            await store.save_result(key, r.model_copy(update={"job_id": key}))
    finally:
        await store.close()


async def test_a_search_matches_each_field_and_its_wildcards_are_literal(tmp_path: Path) -> None:
    await store_results(tmp_path / "s.db", SEARCHED)
    store = ResultStore(tmp_path / "s.db")
    await store.open()

    async def found(text: str) -> set[str]:
        jobs, _ = await store.summaries(JobFilter(search=text), None, 100)
        return {j.job_id for j in jobs}

    try:
        assert await found("RUN-7") == {"run-7"}  # the job id, whatever the case
        assert await found("Gsm-00") == {"run-7"}  # instance_id
        assert await found("gsm8") == {"run-7"}  # data_source
        assert await found("MATH") == {"run-7"}  # task
        assert await found("sandboxdied") == {"run-8"}  # the error's type
        assert await found("exited: 137") == {"run-8"}  # its message
        assert await found("got 12") == {"run-9"}  # the judge's note below a pass
        assert await found("partial") == {"run-10"}
        assert await found("never shown") == set()  # a pass has no note
        # `%`, `_` and the escape character are themselves: each would match more as a
        # wildcard (every row; "axb"; "myXset"; any "s").
        assert await found("%") == {"run-9"}
        assert await found("a%b") == {"run-9"}
        assert await found("_") == {"run-9"}
        assert await found("my_set") == {"run-9"}
        assert await found("\\s") == {"run-8"}
        assert await found("no such text") == set()
        # Beside the other filters, all of which hold.
        both = JobFilter(search="probe", min_reward=0.25)
        assert {j.job_id for j in (await store.summaries(both, None, 100))[0]} == {
            "run-10",
            "run-11",
        }
        assert len(await found("run-")) == len(SEARCHED)  # the control: a text all hold
    finally:
        await store.close()


async def test_a_search_reads_only_the_newest_rows_it_is_given(tmp_path: Path) -> None:
    # A search reads each row's result JSON on the store's one thread: the server's is bounded.
    await store_results(tmp_path / "s.db", SEARCHED)
    store = ResultStore(tmp_path / "s.db")
    await store.open()
    try:
        newest = JobFilter(search="run-", search_rows=2)
        jobs, _ = await store.summaries(newest, None, 100)
        every, _ = await store.summaries(replace(newest, search_rows=None), None, 100)
    finally:
        await store.close()
    assert {j.job_id for j in jobs} == {r.job_id for r in SEARCHED[-2:]}
    assert len(every) == len(SEARCHED)  # the control: unbounded, every row


async def test_the_export_streams_exactly_what_the_list_shows(
    client: Client, tmp_path: Path
) -> None:
    await store_results(tmp_path / "api.db", SEARCHED)
    async with client() as http:

        async def listed(**params: Any) -> list[str]:
            r = await http.get("/v1/dashboard/jobs", params=params)
            assert r.status_code == 200, r.text
            return ids(r.json())

        async def exported(**params: Any) -> list[str]:
            r = await http.get("/v1/rollouts:export", params=params)
            assert r.status_code == 200, r.text
            return [json.loads(line)["job_id"] for line in r.text.splitlines()]

        every = [r.job_id for r in SEARCHED]
        assert await exported() == every  # the control: no filter, every result
        assert await listed() == every[::-1]
        for params, expected in (
            ({"q": "probe"}, ["run-9", "run-10", "run-11"]),
            ({"q": "a%b"}, ["run-9"]),
            ({"data_source": "myXset"}, ["run-10", "run-11"]),
            ({"error_type": "SandboxDied"}, ["run-8"]),
            ({"state": "done", "max_reward": 0.5}, ["run-9", "run-10"]),
            ({"min_reward": 0.5, "q": "x"}, ["run-10", "run-11"]),
            ({"q": "probe", "min_reward": 0.25, "max_reward": 0.75}, ["run-10"]),
            ({"q": "no such text"}, []),
        ):
            assert await exported(**params) == expected, params
            assert await listed(**params) == expected[::-1], params  # newest first there

        # A search is at most 200 characters, in either route; a key given twice is refused.
        for path in ("/v1/dashboard/jobs", "/v1/rollouts:export"):
            assert (await http.get(path, params={"q": "x" * 200})).status_code == 200
            long = await http.get(path, params={"q": "x" * 201})
            assert long.status_code == 422 and long.json()["detail"][0]["loc"] == ["query", "q"]
            twice = await http.get(f"{path}?q=run&q=probe")
            assert twice.status_code == 422 and twice.json()["detail"][0]["loc"] == ["query", "q"]
            for bad in ({"min_reward": "nan"}, {"state": "running"}):
                refused = await http.get(path, params=bad)
                assert refused.status_code == 422, (path, bad)
                assert refused.json()["detail"][0]["loc"] == ["query", *bad], (path, bad)
