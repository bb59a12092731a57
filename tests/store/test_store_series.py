"""What the plots over time read from the store at a start (raas.store.dashboard.finished_groups):
the results finished in a span, counted by bucket, tenant, state and error kind in one query over
the columns a result's write copies (store version 7), through the finished_at index."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from raas.store.dashboard import _GROUPS, FinishedGroup
from raas.store.sqlite import JobRecord, ResultStore
from raas.wire import ErrorInfo, RolloutResult, Timing, Trajectory

BUCKET_S = 10.0


def result(job_id: str, reward: float | None = 1.0, **kw: Any) -> RolloutResult:
    values: dict[str, Any] = {
        "job_id": job_id,
        "state": "done",
        "data_source": "probe",
        "reward": reward,
        "trajectory": Trajectory(response_ids=[1, 2, 3, 4], loss_mask=[1, 1, 0, 1]),
        "timing": Timing(queue_s=0, init_s=0.5, run_s=2.0, eval_s=0.0, total_s=2.5),
        **kw,
    }
    values["trajectory"].logprobs.extend([-0.1] * len(values["trajectory"].response_ids))
    return RolloutResult(**values)


def turns(*versions: Any) -> Trajectory:
    """A trajectory of one generated token a turn, each turn's record naming its version (an
    int, a list of one a token, or None: its backend named none)."""
    records = []
    for v in versions:
        key = "policy_versions" if isinstance(v, list) else "policy_version"
        records.append({"output_tokens": len(v) if isinstance(v, list) else 1, key: v})
    generated = sum(r["output_tokens"] for r in records)
    return Trajectory(
        response_ids=[7] * generated,
        loss_mask=[1] * generated,
        logprobs=[-0.5] * generated,
        turns=records,
    )


async def write(db: Path, rows: list[tuple[str, str, RolloutResult, float]]) -> None:
    """Write (job_id, tenant, result, finished_at) through the store's own API, then place each
    result at ``finished_at`` (the store writes the time of the write)."""
    store = ResultStore(db)
    await store.open()
    for job_id, tenant, res, _ in rows:
        await store.add_jobs([JobRecord(job_id, "queued", "probe", None, {}, 0.0, tenant=tenant)])
        if res.attempt_errors:  # as the pipeline notes each run again
            store.note_attempt(job_id, len(res.attempt_errors) + 1, res.attempt_errors)
        await store.save_result(job_id, res)
    await store.close()
    with closing(sqlite3.connect(db)) as conn, conn:
        for job_id, _, _, at in rows:
            conn.execute("UPDATE jobs SET finished_at = ? WHERE job_id = ?", (at, job_id))


async def groups(db: Path, since: float) -> list[FinishedGroup]:
    store = ResultStore(db)
    await store.open()
    try:
        found = await store.finished_groups(BUCKET_S, since)
    finally:
        await store.close()
    return sorted(found, key=lambda g: (g.bucket, g.tenant, g.state))


async def test_results_are_counted_by_bucket_tenant_and_state(tmp_path: Path) -> None:
    db = tmp_path / "raas.db"
    infra = ErrorInfo(type="SandboxError", message="died", kind="infra", stage="init")
    policy = ErrorInfo(type="PolicyError", message="broke it", kind="policy", stage="run")
    await write(
        db,
        [
            ("old", "a", result("old"), 990.0),  # before the span: not read
            ("a1", "a", result("a1", reward=1.0), 1001.0),
            ("a2", "a", result("a2", reward=0.5, attempt_errors=[infra]), 1009.9),
            (
                "a3",
                "a",
                result("a3", reward=None, state="failed", error=policy, attempt_errors=[infra]),
                1005.0,
            ),
            ("b1", "b", result("b1", reward=0.0), 1012.0),
        ],
    )
    found = await groups(db, since=1000.0)
    assert [(g.bucket, g.tenant, g.state, g.error_kind, g.jobs) for g in found] == [
        (100, "a", "done", None, 2),
        (100, "a", "failed", "policy", 1),
        (101, "b", "done", None, 1),
    ]
    done, failed, bob = found
    assert (done.rewarded, done.reward_sum, done.passed) == (2, 1.5, 1)
    assert done.attempt_errors == {"infra": 1} and failed.attempt_errors == {"infra": 1}
    assert (failed.rewarded, failed.reward_sum) == (0, 0.0)
    assert done.generated_tokens == 2 * 3  # loss mask 1, not every response token
    assert done.stage_s == {"init": 1.0, "run": 4.0, "eval": 0.0}
    assert done.stage_runs == {"init": 2, "run": 2, "eval": 0}  # no second in EVAL: no run
    assert (bob.rewarded, bob.reward_sum, bob.passed) == (1, 0.0, 0)


async def test_the_policy_version_span_is_counted_where_a_backend_named_versions(
    tmp_path: Path,
) -> None:
    db = tmp_path / "raas.db"
    await write(
        db,
        [
            ("one-version", "a", result("v1", trajectory=turns(4, 4)), 1001.0),
            ("two-updates", "a", result("v2", trajectory=turns(3, [4, 5])), 1002.0),
            ("unknown", "a", result("v3", trajectory=turns(None, None)), 1003.0),
            ("no-turns", "a", result("v4"), 1004.0),
        ],
    )
    (group,) = await groups(db, since=1000.0)
    assert group.jobs == 4
    # 4-4 and 5-3; the two whose backend named no version add nothing (not 0).
    assert (group.staleness_known, group.staleness_sum, group.staleness_max) == (2, 2, 2)
    with closing(sqlite3.connect(db)) as conn:
        spans = dict(conn.execute("SELECT job_id, policy_version_span FROM jobs"))
    assert spans == {"one-version": 0, "two-updates": 2, "unknown": None, "no-turns": None}


async def test_only_the_spans_rows_are_read_through_the_finished_at_index(
    tmp_path: Path,
) -> None:
    db = tmp_path / "raas.db"
    await write(db, [("j", "a", result("j"), 1001.0)])
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE jobs SET attempt_errors = 'not json'")  # an odd row: no failure
        conn.commit()
        plan = " ".join(
            row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {_GROUPS}", (10, 1, 0))
        )
    assert "jobs_finished_at (finished_at>?)" in plan, plan
    (group,) = await groups(db, since=1000.0)
    assert group.jobs == 1 and group.attempt_errors == {}
