"""The dashboard in a real browser: `raas serve` as a process, with an API key, real sandboxes and
a model that acts (a vLLM-protocol server answering with real tool calls); headless Chromium
loads /ui and a job's page and the test reads what they show.

One job is solved with the editor and finished (done, reward 1), one kills its own action server
(failed: an infra error), and one waits on the model, which holds its request (running). The
screenshots of the pages go to out/ui/ at the repository's root.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.launch import ServerProcess
from raas.store.sqlite import JobRecord, ResultStore
from raas.tasks.datasets import humaneval, humaneval_problems
from raas.wire import RolloutResult, Timing, Trajectory
from tests.support.browser import Browser, Node
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call

KEY = "dashboard-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SOLVED, BROKEN, HELD = humaneval()[:3]
SOLUTION = humaneval_problems()[0]["canonical_solution"]
STEP = "[[step]]"  # in every answer: how many the prompt holds is the turn number
SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "ui"
DEADLINE_S = 120.0  # a safety net for a broken run, never an assertion on speed
MODEL: AgentBackend  # the dashboard's model, which the script tells what version to report


def _is(problem: dict[str, Any], prompt: str) -> bool:
    return str(problem["prompt"]).strip()[:300] in prompt


def script(prompt: str) -> str:
    turn = prompt.count(STEP)
    # The solved job's turns come from two policies (a weight update between them), as raas's
    # engine reports them; the others' backend names none, as vLLM.
    MODEL.weight_version = 3 + turn if _is(SOLVED, prompt) else None
    if _is(SOLVED, prompt) and turn == 0:
        lines = len(str(SOLVED["prompt"]).splitlines())
        write = call(
            "editor",
            command="insert",
            path="/workspace/solution.py",
            insert_line=lines,
            new_str=SOLUTION,
        )
        return f"{STEP} Writing the body. {write}"
    if _is(BROKEN, prompt):
        return f"{STEP} {call('bash', command='kill -9 $PPID')}"
    return f"{STEP} Done. {call('finish', message='solved')}"


def logprob(position: int, token: int) -> float:
    """From sure to unsure and back, so that the token view has every shade."""
    return -3.0 * (position % 8) / 7


@dataclass
class Dashboard:
    url: str
    backend_url: str
    results: dict[str, dict[str, Any]]

    def page(self, fragment: str = "", key: str | None = KEY) -> str:
        query = f"?key={key}" if key is not None else ""
        return f"{self.url}/ui{query}{fragment}"


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    tmp = tmp_path_factory.mktemp("dashboard")
    model = AgentBackend(script, hold=lambda prompt: _is(HELD, prompt), logprob=logprob)
    global MODEL
    MODEL = model
    backend = ServerThread(model.app).start()
    args = ["--llm", backend.url, "--tokenizer", "tiny", "--max-attempts", "1"]
    env = {k: v for k, v in os.environ.items() if k != "RAAS_API_KEY_FILE"}
    env["RAAS_API_KEY"] = KEY  # a key on the command line is refused (ps shows it)
    server = ServerProcess(tmp / "raas.db", tmp / "serve.log", args, env)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=DEADLINE_S) as http:
            for job_id, instance in (("solved", SOLVED), ("broken", BROKEN), ("held", HELD)):
                r = http.post("/v1/rollouts", json={"instance": instance, "job_id": job_id})
                assert r.status_code == 202, r.text
            results = {j: finished(http, j) for j in ("solved", "broken")}
        assert model.holding.wait(DEADLINE_S), "the held job never asked the model"
        yield Dashboard(server.url, backend.url, results)
    finally:
        model.release()
        server.stop()
        backend.stop()


def finished(http: httpx.Client, job_id: str) -> dict[str, Any]:
    status = http.get(f"/v1/rollouts/{job_id}", params={"wait": DEADLINE_S}).json()
    assert status["result"] is not None, f"{job_id} did not finish: {status}"
    result: dict[str, Any] = status["result"]
    return result


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Browser:
    return Browser(tmp_path_factory.mktemp("chromium"))


def row(dom: Node, job_id: str) -> Node:
    return dom.one("tr", data_job=job_id)


def test_the_overview_shows_the_service_and_its_jobs(
    browser: Browser, dashboard: Dashboard
) -> None:
    solved, broken = dashboard.results["solved"], dashboard.results["broken"]
    assert solved["state"] == "done" and solved["reward"] == 1.0, solved
    assert broken["state"] == "failed" and broken["error"]["kind"] == "infra", broken
    dom = browser.dom(dashboard.page())
    assert dom.one("body").attrs.get("data-loaded") == "overview", dom.text[:2000]
    assert not dom.all(id="error") or "hidden" in dom.one(id="error").attrs

    jobs = {r.attrs["data-job"]: r for r in dom.one(id="jobs").all("tr", data_job=None)}
    assert {j: r.attrs["data-state"] for j, r in jobs.items()} == {
        "solved": "done",
        "broken": "failed",
        "held": "running",
    }
    assert jobs["solved"].all("td")[3].text == "1"  # its reward
    assert broken["error"]["type"] in jobs["broken"].text
    assert "run" in jobs["held"].text  # the stage it is in
    # Each job by its instance, not its job id (that is in the link's title).
    for job_id, instance in (("solved", SOLVED), ("broken", BROKEN), ("held", HELD)):
        link = jobs[job_id].all("td")[0].one("a")
        assert link.text == instance["instance_id"] and link.attrs["title"] == f"job {job_id}"
    # The held job waits on its first turn: no response tokens yet, its prompt's counted.
    tokens = next(td for td in jobs["held"].all("td") if td.has_class("tokens")).text
    assert re.fullmatch(r"0 \+[1-9]\d* prompt", tokens), tokens

    failures = dom.one(id="failures")
    (failure,) = failures.all("tr", data_failure=None)
    assert failure.attrs["data-failure"] == broken["error"]["type"]
    assert "infra" in failure.text and failure.all("td")[-1].text == "1"

    backend = dom.one("tr", data_backend=dashboard.backend_url)
    assert backend.attrs["data-healthy"] == "true" and "healthy" in backend.text
    run = dom.one(id="stages").one("tr", data_stage="run")
    active = run.all("td")[1].text
    assert re.fullmatch(r"1 / \d+", active), active  # the held job holds a RUN worker
    finished = dom.one(id="finished").text
    assert "done 1" in finished and "failed 1" in finished, finished
    assert dom.one(id="throughput").text  # jobs/min and tokens/s
    # Over the two finished jobs: one rewarded (1), one failed without a reward.
    assert dom.one(id="mean-reward").text == "1" and dom.one(id="pass-rate").text == "100.0%"
    assert "1 rewarded" in dom.one(id="rewards").text

    # The plots: each drawn by uPlot on a canvas, with its legend.
    assert dom.one("body").attrs.get("data-plots") == "5"
    legends = {}
    for plot in (d for d in dom.one(id="plots").all("div") if d.has_class("plot")):
        assert plot.all("canvas"), plot.attrs["id"]
        legends[plot.attrs["id"]] = [t.text for t in plot.all("th")]
    assert legends == {
        "plot-reward": ["mean reward", "pass rate"],
        "plot-throughput": ["rollouts/min", "generated tokens/s"],
        "plot-stages": ["INIT", "RUN", "EVAL"],
        "plot-errors": ["infra", "policy", "malformed tool calls"],
        "plot-staleness": ["mean span", "max span"],
    }, legends
    # The solved job's turns came from versions 3 and 4 (a span of 1), the others' from a
    # backend that named none: one bucket has a point, whichever it is.
    assert dom.one(id="plot-staleness").attrs["data-points"] == "1,1"

    browser.screenshot(dashboard.page(), SCREENSHOTS / "dashboard.png", size=(1400, 1700))


def test_the_filters_narrow_the_list(browser: Browser, dashboard: Dashboard) -> None:
    failed = browser.dom(dashboard.page("#/?state=failed"))
    assert [r.attrs["data-job"] for r in failed.all("tr", data_job=None)] == ["broken"]
    rewarded = browser.dom(dashboard.page("#/?min_reward=0.5"))
    assert [r.attrs["data-job"] for r in rewarded.all("tr", data_job=None)] == ["solved"]


def test_typing_a_search_narrows_the_list_and_its_export_downloads_what_it_lists(
    browser: Browser, dashboard: Dashboard
) -> None:
    """A person types part of the failed job's error in the search box: once typing pauses the
    list holds that job alone, the address keeps the search, the box keeps the focus and what
    was typed; "Export these" downloads exactly the rows listed (every one, not a page)."""
    broken = dashboard.results["broken"]
    typed = broken["error"]["type"][2:].lower()  # a part of it, in another case
    with browser.tab(size=(1400, 1700)) as tab:
        tab.go(dashboard.page("#/"))
        tab.wait_for("document.body.dataset.loaded === 'overview'")
        listed = "[...document.querySelectorAll('#jobs tr[data-job]')].map((r) => r.dataset.job)"
        assert sorted(tab.evaluate(listed)) == ["broken", "held", "solved"]
        everything, _ = tab.download("#export")
        every_row = [json.loads(line)["job_id"] for line in everything.read_text().splitlines()]
        assert sorted(every_row) == ["broken", "solved"]  # the finished ones: held runs

        tab.type("#search", typed)
        tab.wait_for(f"document.getElementById('jobs').dataset.search === {json.dumps(typed)}")
        assert tab.evaluate(listed) == ["broken"]
        assert tab.evaluate("location.hash") == f"#/?q={typed}"
        focus = "[document.activeElement.id, document.activeElement.value]"
        assert tab.evaluate(focus) == ["search", typed]
        downloaded, name = tab.download("#export")
        rows = [json.loads(line) for line in downloaded.read_text().splitlines()]
        assert name == "raas-jobs.jsonl"
        assert [(r["job_id"], r["error"]["type"]) for r in rows] == [
            ("broken", broken["error"]["type"])
        ]
        tab.screenshot(SCREENSHOTS / "search.png")

        # The search in the address is the list's on a load too, and the box shows it.
        tab.go(dashboard.page(f"#/?q={typed}&state=done"))
        tab.wait_for("document.body.dataset.loaded === 'overview'")
        assert tab.evaluate("document.getElementById('search').value") == typed
        assert tab.evaluate("document.querySelectorAll('#jobs tr[data-job]').length") == 0


def test_the_overview_shows_each_data_sources_jobs_and_rewards(
    browser: Browser, dashboard: Dashboard
) -> None:
    # The solved job (reward 1) and the broken one (an infra failure, no reward) are both code;
    # the held one runs, so it is no finished job of any source yet.
    dom = browser.dom(dashboard.page())
    (code,) = dom.one(id="sources").all("tr", data_source=None)
    assert code.attrs["data-source"] == "code"
    cells = {
        td.attrs.get("data-state") or td.attrs.get("data-col"): td.text for td in code.all("td")
    }
    assert (cells["done"], cells["failed"], cells["timeout"]) == ("1", "1", "0")
    assert (cells["mean-reward"], cells["pass-rate"]) == ("1", "100.0%")
    assert cells["per-min"] == "0.2"  # 2 in the last 10 minutes
    assert code.one("a").attrs["href"] == "#/?data_source=code"  # lists them


def test_the_overview_draws_how_the_finished_jobs_ended_and_how_long_they_ran(
    browser: Browser, dashboard: Dashboard
) -> None:
    finished = [dashboard.results["solved"], dashboard.results["broken"]]
    dom = browser.dom(dashboard.page())

    def drawn(chart: str) -> list[tuple[str, int, str]]:
        """Each bar: its label, its count and the width it is drawn at."""
        bars = []
        for row in dom.one(id=chart).all("div", data_label=None):
            (bar,) = [span for span in row.all("span") if span.has_class("bar")]
            bars.append((row.attrs["data-label"], int(row.attrs["data-count"]), bar.attrs["style"]))
        return bars

    # The solved job finished; the broken one failed in its first turn, before any stop reason.
    reasons = drawn("stop-reasons")
    assert sorted((label, n) for label, n, _ in reasons) == [("failed", 1), ("finish", 1)]
    assert all("width: 100%" in style for *_, style in reasons)  # as many: both full
    turns = Counter(len(r["trajectory"]["turns"]) for r in finished)
    assert {int(label): n for label, n, _ in drawn("turns-hist") if n} == turns
    lengths = drawn("length-hist")
    assert len(lengths) == 12 and sum(n for _, n, _ in lengths) == 2
    longest = max(len(r["trajectory"]["response_ids"]) for r in finished)
    last_label, count, _ = lengths[-1]
    low, high = (int(x) for x in (last_label.split("\u2013") * 2)[:2])  # "a\u2013b", or "a" alone
    assert count >= 1 and low <= longest <= high  # the longest response, in the last bin
    # No request named a group: the GRPO chart says so rather than draw nothing.
    assert dom.one(id="groups").text.startswith("None: no two rewarded jobs")


def test_a_job_page_shows_the_conversation_and_the_tokens(
    browser: Browser, dashboard: Dashboard
) -> None:
    solved = dashboard.results["solved"]
    dom = browser.dom(dashboard.page("#/jobs/solved"))
    assert dom.one("body").attrs.get("data-loaded") == "job", dom.text[:2000]
    assert dom.one(id="job-id").text == "solved"
    assert "done" in dom.one(id="facts").text

    turns = dom.one(id="turns").all("tr", data_turn=None)
    assert [t.attrs["data-turn"] for t in turns] == ["0", "1"]
    assert "editor" in turns[0].text and "finish" in turns[1].text
    messages = dom.one(id="messages")
    (editor,) = messages.all(data_call="editor")
    assert "solution.py" in editor.text
    outputs = messages.all(data_role="tool")
    assert outputs and "solution.py" in outputs[0].text  # the editor's answer

    tokens = dom.one(id="response-tokens").all("span", data_mask=None)
    trajectory = solved["trajectory"]
    assert len(tokens) == len(trajectory["response_ids"])
    masks = [int(t.attrs["data-mask"]) for t in tokens]
    assert masks == trajectory["loss_mask"]
    generated = "".join(t.text for t in tokens if t.attrs["data-mask"] == "1")
    inserted = "".join(t.text for t in tokens if t.attrs["data-mask"] == "0")
    assert '"name": "editor"' in generated and '"name": "finish"' in generated
    assert "<|im_start|>" in inserted and "<|im_start|>" not in generated
    assert all(t.has_class("env") for t in tokens if t.attrs["data-mask"] == "0")
    # Shaded by probability: the model's logprobs cycle through 8 values, so do the colours.
    shades = {t.attrs.get("style") for t in tokens if t.attrs["data-mask"] == "1"}
    assert len(shades) == 8, shades
    lp = [t.attrs["title"] for t in tokens if t.attrs["data-mask"] == "1"][1]
    assert f"logprob {logprob(1, 0):.3f}" in lp and f"p {math.exp(-3 / 7):.3f}" in lp
    # Each generated token's policy: the first turn's (v3) behind the second's (v4), marked.
    versions = [t.attrs.get("data-version") for t in tokens if t.attrs["data-mask"] == "1"]
    first = trajectory["turns"][0]["output_tokens"]
    assert versions == ["3"] * first + ["4"] * (len(versions) - first)
    stale = [t for t in tokens if t.has_class("stale")]
    assert len(stale) == first and all(t.attrs["data-lag"] == "1" for t in stale)
    assert "1 behind the newest (v4)" in stale[0].attrs["title"]
    summary = dom.one(id="token-versions").text
    assert f"policy v3\u2013v4: {first} generated tokens behind" in summary
    assert not any("data-version" in t.attrs for t in tokens if t.attrs["data-mask"] == "0")

    browser.screenshot(
        dashboard.page("#/jobs/solved"), SCREENSHOTS / "trajectory.png", size=(1400, 2400)
    )


def test_a_running_job_shows_its_tokens_so_far(browser: Browser, dashboard: Dashboard) -> None:
    dom = browser.dom(dashboard.page("#/jobs/held"))
    # A backend that names no weight version (vLLM): the view says so.
    assert "policy versions not reported" in dom.one(id="token-versions").text
    assert dom.one("body").attrs.get("data-loaded") == "job", dom.text[:2000]
    facts = dom.one(id="facts").text
    assert "running" in facts and "run" in facts
    prompt = dom.one(id="prompt-tokens").all("span")
    assert "<|im_start|>" in "".join(t.text for t in prompt)


def test_without_the_key_the_browser_gets_the_sign_in_form(
    browser: Browser, dashboard: Dashboard
) -> None:
    for url, wrong in ((dashboard.page(key=None), False), (dashboard.page(key="nope"), True)):
        dom = browser.dom(url)
        assert dom.one("input", name="key").attrs["type"] == "password"
        assert "data-loaded" not in dom.one("body").attrs and not dom.all("tr")
        assert ("not the server's" in dom.one(id="message").text) is wrong


# -- a gateway job's segments ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose database holds a finished harness job of two segments (its calls did not
    extend each other's conversation), as raas stores one: the second in the metrics."""
    tmp = tmp_path_factory.mktemp("segmented")
    first = Trajectory(prompt_ids=[5, 6], response_ids=[1, 2, 3], loss_mask=[1, 1, 1])
    first.logprobs.extend([-0.1, -0.1, -0.1])
    second = Trajectory(prompt_ids=[7], response_ids=[8, 9, 10, 11], loss_mask=[1, 0, 1, 1])
    second.logprobs.extend([-0.2, 0.0, -0.3, -0.4])
    result = RolloutResult(
        job_id="g",
        state="done",
        data_source="harness",
        trajectory=first,
        metrics={"segments": [first.model_dump(), second.model_dump()]},
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
    )

    async def store() -> None:
        db = ResultStore(tmp / "raas.db")
        await db.open()
        await db.add_jobs([JobRecord("g", "queued", "harness", None, {}, 0.0)])
        await db.save_result("g", result)
        # Two GRPO groups of two: one whose rewards are equal (it teaches nothing), one not.
        samples = (("p-0", "p", 1.0), ("p-1", "p", 1.0), ("q-0", "q", 0.0), ("q-1", "q", 1.0))
        for job_id, group, reward in samples:
            await db.add_jobs([JobRecord(job_id, "queued", "math", None, {"group": group}, 0.0)])
            judged = {"correct": reward == 1.0, "read": "7"}  # as the math judge writes
            sample = result.model_copy(
                update={"job_id": job_id, "reward": reward, "metrics": judged}
            )
            await db.save_result(job_id, sample)
        # A job whose tokens came from policy versions 2 to 5 (weights updated mid-rollout).
        await db.add_jobs([JobRecord("stale", "queued", "harness", None, {}, 0.0)])
        turns = [{"output_tokens": 2, "policy_versions": [2, 5]}]
        stale = Trajectory(response_ids=[1, 2], loss_mask=[1, 1], turns=turns)
        stale.logprobs.extend([-0.1, -0.1])
        await db.save_result("stale", result.model_copy(update={"trajectory": stale}))
        await db.close()

    asyncio.run(store())
    env = {k: v for k, v in os.environ.items() if k not in ("RAAS_API_KEY_FILE", "RAAS_API_KEY")}
    server = ServerProcess(tmp / "raas.db", tmp / "serve.log", ["--tokenizer", "tiny"], env)
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


def test_the_overview_draws_the_share_of_grpo_groups_that_teach_nothing(
    browser: Browser, segmented: str
) -> None:
    dom = browser.dom(f"{segmented}/ui")
    assert dom.one("body").attrs.get("data-loaded") == "overview", dom.text[:2000]
    rows = dom.one(id="groups").all("div", data_label=None)
    counts = {r.attrs["data-label"]: int(r.attrs["data-count"]) for r in rows}
    assert counts == {"all equal": 1, "differ": 1}  # the groups' rewards
    titles = [h3.text for h3 in dom.one(id="distributions").all("h3")]
    assert "GRPO groups: 50% teach nothing" in titles
    browser.screenshot(f"{segmented}/ui", SCREENSHOTS / "distributions.png", size=(1400, 1200))
    # A job below a pass says why in the list, where its judge's metrics do; a pass does not.
    notes = {
        row.attrs["data-job"]: [span.text for span in row.all("span", data_judge=None)]
        for row in dom.one(id="jobs").all("tr", data_job=None)
    }
    assert notes["q-0"] == [" \u00b7 judge: answer read: 7"] and notes["q-1"] == []


def test_the_plots_after_a_restart_show_what_finished_before_it_and_its_staleness(
    browser: Browser, segmented: str
) -> None:
    """The server started on a database whose results an earlier one wrote: its plots over
    time are drawn from them, the staleness plot with the one job whose backend named
    versions (a span of 5 - 2)."""
    dom = browser.dom(f"{segmented}/ui")
    assert dom.one("body").attrs.get("data-plots") == "5", dom.text[:2000]
    staleness, reward = dom.one(id="plot-staleness"), dom.one(id="plot-reward")
    assert staleness.all("canvas") and reward.all("canvas")
    assert [t.text for t in staleness.all("th")] == ["mean span", "max span"]
    assert staleness.attrs["data-points"] == "1,1"  # the other jobs' backends named none
    rewarded = [int(n) for n in reward.attrs["data-points"].split(",")]
    assert rewarded[0] >= 1 and rewarded[0] == rewarded[1]  # mean reward and pass rate
    assert "from the results in the database" in dom.one(id="plots-note").text
    browser.screenshot(
        f"{segmented}/ui", SCREENSHOTS / "plots-after-restart.png", size=(1400, 1700)
    )


def test_each_segment_of_a_gateway_job_has_a_page_of_its_tokens(
    browser: Browser, segmented: str
) -> None:
    pages = {}
    for fragment in ("#/jobs/g", "#/jobs/g/segment/2"):
        dom = browser.dom(f"{segmented}/ui{fragment}")
        assert dom.one("body").attrs.get("data-loaded") == "job", dom.text[:2000]
        pages[fragment] = dom
    first, second = pages["#/jobs/g"], pages["#/jobs/g/segment/2"]
    assert "segment 1 of 2" in first.one(id="tokenview").one("h2").text
    assert "segment 2 of 2" in second.one(id="tokenview").one("h2").text
    spans = second.one(id="response-tokens").all("span", data_mask=None)
    assert [int(s.attrs["data-mask"]) for s in spans] == [
        1,
        0,
        1,
        1,
    ]  # the second's, not the first's
    assert len(first.one(id="response-tokens").all("span", data_mask=None)) == 3
    # Each page links to the other segment, and marks its own.
    links = {a.text: a.attrs["href"] for a in first.one(id="token-segments").all("a")}
    assert links == {"2": "#/jobs/g/segment/2"}
    assert [a.text for a in second.one(id="token-segments").all("a")] == ["1"]
    browser.screenshot(
        f"{segmented}/ui#/jobs/g/segment/2", SCREENSHOTS / "segments.png", size=(1400, 1000)
    )
