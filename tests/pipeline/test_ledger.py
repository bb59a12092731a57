"""The ledger (raas.pipeline.ledger): each finished job is one JobEvent, counted once, and every
reader (Pipeline.stats(), /v1/usage, the dashboard's plots, /metrics) reads the same counts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raas.api.series import read_series
from raas.api.usage import read_usage
from raas.pipeline import JobRequest, JobState, Pipeline, Stage
from raas.pipeline.events import JobEvent
from raas.pipeline.ledger import UNKNOWN_SOURCE, Histogram, Ledger, WindowSpec, source_label
from raas.store.dashboard import FinishedGroup
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tenants import job_key
from tests.conftest import small_config
from tests.support.probe import ProbeTask, finished, probe_instance, settle


def event(tenant: str = "a", state: JobState = JobState.DONE, **kw: Any) -> JobEvent:
    values: dict[str, Any] = {
        "tenant": tenant,
        "data_source": "probe",
        "task": "probe",
        "state": state,
        "queue_s": 0.2,
        "stage_s": {Stage.INIT: 0.1, Stage.RUN: 1.0, Stage.EVAL: 0.5},
        "error_kind": None,
        "error_type": None,
        "attempt_error_kinds": (),
        "tokens_in": 10,
        "tokens_out": 3,
        "generated_tokens": 3,
        "malformed_tool_calls": 0,
        "tamper": False,
        "sandbox_s": 2.0,
        "reward": 1.0,
        "policy_version_span": None,
        "finished_at": 0.0,
        **kw,
    }
    return JobEvent(**values)


def spy(pipeline: Pipeline) -> list[JobEvent]:
    """The events the pipeline hands its ledger, in order (still counted)."""
    seen: list[JobEvent] = []
    record = pipeline.ledger.record

    def recording(e: JobEvent) -> None:
        seen.append(e)
        record(e)

    pipeline.ledger.record = recording  # type: ignore[method-assign]
    return seen


async def test_each_finished_job_is_one_event_however_it_ended(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(max_attempts=2) as pipeline:
        events = spy(pipeline)
        jobs = {
            "ok": probe_instance(),
            "crash": probe_instance(run="raise"),  # infra: run again once, fails again
            "misbehaved": probe_instance(eval="policy"),
            "cancelled": probe_instance(run="block"),
        }
        await pipeline.submit([JobRequest.of(i, job_id=j) for j, i in jobs.items()])
        await probe.wait_entered("cancelled", "run")
        assert pipeline.cancel("cancelled") is not None
        for job_id in jobs:
            await finished(pipeline, job_id)
        stats = pipeline.stats()
    ends = sorted((e.state.value, e.error_type, e.attempt_error_kinds) for e in events)
    assert ends == [
        ("cancelled", "cancelled", ()),
        ("done", None, ()),
        ("failed", "PolicyError", ()),
        ("failed", "RuntimeError", ("infra",)),
    ]
    assert stats["finished"] == {"done": 1, "failed": 2, "timeout": 0, "cancelled": 1}
    (ok,) = (e for e in events if e.state is JobState.DONE)
    assert (ok.tenant, ok.data_source, ok.reward, ok.tokens_out) == ("default", "probe", 0.5, 3)
    assert ok.sandbox_s > 0 and ok.stage_s[Stage.RUN] >= 0


async def test_a_job_failed_at_a_restart_is_an_event_of_the_new_process(
    tmp_path: Path, registry: TaskRegistry, probe: ProbeTask
) -> None:
    db = tmp_path / "crash.db"
    store = ResultStore(db)
    await store.open()
    first = Pipeline(registry, store, small_config())
    await first.start()
    await first.submit([JobRequest.of(probe_instance(run="block"), job_id="in-flight")])
    await probe.wait_entered("in-flight", "run")
    for task in first.stages.workers:  # the process "dies" with the job in RUN
        task.cancel()
    await store.close()

    store2 = ResultStore(db)
    await store2.open()
    second = Pipeline(registry, store2, small_config())
    try:
        events = spy(second)
        await second.start()  # one attempt, spent: the job fails as the service starts
        stats = second.stats()
    finally:
        await second.stop()
        await store2.close()
    (lost,) = events
    assert (lost.state, lost.error_type, lost.error_kind) == (
        JobState.FAILED,
        "server_restart",
        "infra",
    )
    assert stats["finished"]["failed"] == 1


def test_the_ledger_keeps_totals_and_each_tenants_windows() -> None:
    now = [1000.0]
    ledger = Ledger(clock=lambda: now[0], recent=WindowSpec(10.0, 3), daily=WindowSpec(60.0, 5))
    a_job = SimpleNamespace(tenant="a", data_source="probe", task="probe")
    ledger.job_submitted(a_job)  # type: ignore[arg-type]
    ledger.stage_ended(a_job, Stage.RUN, 1.0)  # type: ignore[arg-type]
    ledger.record(event("a"))
    now[0] = 1030.0
    ledger.record(event("b", JobState.FAILED, error_kind="policy", reward=None, tokens_out=7))

    assert ledger.finished() == {"done": 1, "failed": 1}
    tenants = ledger.by(lambda tenant, data_source: tenant)
    assert tenants["a"].submitted == 1 and tenants["a"].stage_s == {"run": 1.0}
    assert tenants["b"].errors == {"policy": 1} and tenants["b"].tokens_out == 7
    assert ledger.queue_seconds.count == 2 and ledger.stage_seconds[Stage.RUN].count == 1

    mine = read_series(ledger.recent, "b")
    assert mine.t == [1030.0] and mine.finished == [1] and mine.errors["policy"] == [1]
    everyone = read_series(ledger.recent)
    assert everyone.t == [1010.0, 1020.0, 1030.0]  # keep: 3 buckets back from now
    assert everyone.finished == [0, 0, 1]

    usage = read_usage(ledger, since_s=3600)
    assert [(u.tenant, u.finished, u.tokens_out) for u in usage.tenants] == [
        ("a", {"done": 1}, 3),
        ("b", {"failed": 1}, 7),
    ]
    assert [u.tenant for u in read_usage(ledger, 3600, only="b").tenants] == ["b"]
    now[0] = 1600.0  # the daily window keeps five minutes: nothing of these is in it
    assert read_usage(ledger, 3600).tenants == []
    assert ledger.finished() == {"done": 1, "failed": 1}  # the totals stay


@pytest.mark.parametrize(("value", "bucket"), [(0.01, 0), (0.011, 1), (1800, 14), (1e9, 15)])
def test_a_histogram_counts_a_value_under_the_first_bound_it_does_not_pass(
    value: float, bucket: int
) -> None:
    histogram = Histogram()
    histogram.observe(value)
    assert histogram.counts.index(1) == bucket and histogram.sum == value


@pytest.mark.parametrize(
    ("data_source", "task", "label"),
    [
        ("probe", "probe", "probe"),  # a task's own name
        ("openai/gsm8k", "math", "openai/gsm8k"),  # a dataset name stays that
        ("OpenAI/GSM8K", "math", "openai/gsm8k"),  # as the alias table spells it
        ("aime_2024", "math", "aime*"),  # a prefix takes any tail: its pattern
        ("aime" + "x" * 100_000, "math", "aime*"),
        ('aime"}\n# forged', "math", "aime*"),
        ("deepcoder", "code", "deepcoder"),
        ("deepcoder-v2", "code", "deepcoder*"),
        ("", None, UNKNOWN_SOURCE),  # a result stored without its data_source
        ("gone-task", None, UNKNOWN_SOURCE),  # a job from before a restart, its task gone
    ],
)
def test_a_data_source_is_counted_under_the_servers_name_for_it(
    data_source: str, task: str | None, label: str
) -> None:
    assert source_label(data_source, task) == label


def test_a_data_source_spelled_anew_for_each_job_is_one_total() -> None:
    """A tenant writes data_source: a new spelling a job (a prefix with any tail, a name in any
    case) is no new total, so neither memory nor /metrics' series grow with the jobs."""
    ledger = Ledger()
    for i in range(1000):
        spelled = (
            f"aime-{i}"
            if i % 2
            else "".join(c.upper() if (i >> n) & 1 else c for n, c in enumerate("openai/gsm8k"))
        )
        job = SimpleNamespace(tenant="mallory", data_source=spelled, task="math")
        ledger.job_submitted(job)  # type: ignore[arg-type]
        ledger.stage_ended(job, Stage.RUN, 0.1)  # type: ignore[arg-type]
        ledger.record(event("mallory", data_source=spelled, task="math"))
    assert sorted(ledger.totals) == [("mallory", "aime*"), ("mallory", "openai/gsm8k")]
    assert sum(c.submitted for c in ledger.totals.values()) == 1000
    assert ledger.finished() == {"done": 1000}


async def test_one_tenants_retries_cancels_and_endless_jobs_count_as_its_own_only(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    """Mallory names Alice's job ids (her own namespace), cancels them and never lets one of
    hers end: Alice's counts are her jobs', each counted once however it ended."""
    # Slots for every job at once: none waits behind another's blocked run.
    async with make_pipeline(max_attempts=2, init_workers=8, run_workers=8) as pipeline:
        ledger: Ledger = pipeline.ledger
        alice = [
            JobRequest.of(probe_instance(run="raise_once"), job_id="retried", tenant="alice"),
            JobRequest.of(probe_instance(run="block"), job_id="cancelled", tenant="alice"),
        ]
        mallory = [
            JobRequest.of(probe_instance(run="block"), job_id=job_id, tenant="mallory")
            for job_id in ("retried", "cancelled", "endless")
        ]
        await pipeline.submit(alice)
        await pipeline.submit(mallory)  # the same ids: her own jobs
        assert pipeline.cancel(job_key("mallory", "retried")) is not None  # hers, not Alice's
        await finished(pipeline, job_key("alice", "retried"))
        await probe.wait_entered(job_key("alice", "cancelled"), "run")
        assert pipeline.cancel(job_key("alice", "cancelled")) is not None  # Alice's own cancel
        await finished(pipeline, job_key("alice", "cancelled"))
        await pipeline.submit(alice)  # again: known ids, no new job, nothing counted
        await finished(pipeline, job_key("mallory", "retried"))
        await probe.wait_entered(job_key("mallory", "endless"), "run")
        await settle(lambda: pipeline.stats()["in_flight"] == 2)
        tenants = ledger.by(lambda tenant, data_source: tenant)
        usage = {u.tenant: u for u in read_usage(ledger, 3600).tenants}
        series = read_series(ledger.recent, "alice")
        everyone = ledger.finished()
    hers = tenants["alice"]
    assert hers.submitted == 2 and hers.finished == {"done": 1, "cancelled": 1}
    # The retried job's first run, and the cancel (an ending of kind infra, as ever).
    assert hers.errors == {"infra": 2}
    assert hers.stage_runs["run"] == 3  # two runs of the retried job, one of the cancelled
    assert (usage["alice"].submitted, usage["alice"].finished) == (2, {"done": 1, "cancelled": 1})
    assert sum(series.finished) == 2 and sum(series.errors["infra"]) == 2
    # The control: Mallory's jobs are hers: three accepted, one cancelled, two never ending.
    theirs = tenants["mallory"]
    assert theirs.submitted == 3 and theirs.finished == {"cancelled": 1}
    assert everyone == {"done": 1, "cancelled": 2}


def test_the_plots_count_each_jobs_policy_version_span_where_it_is_known() -> None:
    now = [1000.0]
    ledger = Ledger(clock=lambda: now[0], recent=WindowSpec(10.0, 3))
    ledger.record(event("a", policy_version_span=0))
    ledger.record(event("a", policy_version_span=3))
    ledger.record(event("a", policy_version_span=None))  # its backend named no version
    now[0] = 1010.0
    ledger.record(event("a", policy_version_span=None))
    series = read_series(ledger.recent)
    assert series.finished == [3, 1]
    assert series.staleness_mean == [1.5, None] and series.staleness_max == [3, None]


def group(bucket: int, tenant: str, state: str = "done", **kw: Any) -> FinishedGroup:
    values: dict[str, Any] = {
        "bucket": bucket,
        "tenant": tenant,
        "state": state,
        "error_kind": None,
        "jobs": 2,
        "attempt_errors": {},
        "rewarded": 2,
        "reward_sum": 1.5,
        "passed": 1,
        "generated_tokens": 30,
        "malformed_tool_calls": 1,
        "stage_s": {"init": 1.0, "run": 4.0, "eval": 0.0},
        "stage_runs": {"init": 2, "run": 2, "eval": 0},
        "staleness_known": 2,
        "staleness_sum": 3,
        "staleness_max": 2,
        **kw,
    }
    return FinishedGroup(**values)


def test_the_recent_window_is_filled_from_the_stores_groups() -> None:
    now = [1035.0]
    ledger = Ledger(clock=lambda: now[0], recent=WindowSpec(10.0, 3))
    ledger.restore(
        [
            group(100, "a"),  # before the window's span (1010 on): left out
            group(101, "a"),
            group(101, "b", "failed", error_kind="policy", attempt_errors={"infra": 1}),
            group(103, "a", staleness_known=0, staleness_sum=0, staleness_max=None),
            group(104, "a"),  # after now (a clock set back): not a bucket of the live jobs'
        ]
    )
    ledger.record(event("a", policy_version_span=5))  # live, into the restored bucket 103
    series = read_series(ledger.recent)
    assert series.t == [1010.0, 1020.0, 1030.0]
    assert series.finished == [4, 0, 3]
    assert series.rewarded == [4, 0, 3] and series.reward_mean == [0.75, None, 2.5 / 3]
    assert series.errors == {"infra": [1, 0, 0], "policy": [2, 0, 0]}
    assert series.generated_tokens_per_s == [6.0, 0.0, 3.3]
    assert series.stage_s["run"] == [2.0, None, 2.0]  # a live run counts as it ends (none here)
    assert series.staleness_mean == [1.5, None, 5.0] and series.staleness_max == [2, None, 5]
    theirs = read_series(ledger.recent, "b")
    assert theirs.t == [1010.0, 1020.0, 1030.0] and theirs.finished == [2, 0, 0]


async def test_results_from_before_a_restart_are_counted_once(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    before = ("before-1", "before-2")
    async with make_pipeline() as first:
        await first.submit([JobRequest.of(probe_instance(), job_id=j) for j in before])
        for job_id in before:
            await finished(first, job_id)
        assert sum(read_series(first.ledger.recent).finished) == 2
    async with make_pipeline() as second:  # the same database, a new process
        assert sum(read_series(second.ledger.recent).finished) == 2  # from the store
        await second.submit([JobRequest.of(probe_instance(), job_id="after")])
        await finished(second, "after")
        series = read_series(second.ledger.recent)  # the store holds 3 now; counted once each
        assert sum(series.finished) == 3 and sum(series.rewarded) == 3
        assert sum(series.generated_tokens_per_s) * series.bucket_s == pytest.approx(3 * 3)
