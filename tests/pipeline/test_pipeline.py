"""The pipeline: states, stage pools, budgets, cancellation, cleanup, admission, recovery."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from raas.pipeline import (
    TRANSITIONS,
    BadTransition,
    Draining,
    InitQueueFull,
    JobIdConflict,
    JobRequest,
    JobState,
    Phase,
    Pipeline,
    RequestRejected,
    Stage,
)
from raas.pipeline.job import Job
from raas.store.sqlite import ResultStore
from raas.tasks import InvalidInstance, TaskRegistry, UnknownTask
from raas.tasks.countdown import generate_instances
from tests.conftest import small_config
from tests.support.probe import ProbeTask, finished, probe_instance, settle

STAGES = ["init", "run", "eval"]


def req(instance: dict[str, Any], **kw: Any) -> JobRequest:
    return JobRequest.of(instance=instance, **kw)


async def submit_one(pipeline: Pipeline, instance: dict[str, Any], **kw: Any) -> str:
    (view,) = await pipeline.submit([req(instance, **kw)])
    return view.job_id


class StageLog:
    """Observer that records what the pipeline reports."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, Stage]] = []
        self.finished: list[tuple[str, JobState]] = []

    def job_submitted(self, job: Job) -> None:
        pass

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None:
        self.stages.append((job.id, stage))

    def job_finished(self, job: Job, state: JobState) -> None:
        self.finished.append((job.id, state))


async def test_countdown_job_goes_through_every_stage_to_done(make_pipeline: Any) -> None:
    async with make_pipeline() as pipeline:
        log = StageLog()
        pipeline.observers.append(log)
        instance = generate_instances(1, seed=3)[0]
        job_id = await submit_one(pipeline, instance, sampling_params={"temperature": 0.0})
        result = await finished(pipeline, job_id)
    assert result["state"] == "done"
    assert result["reward"] == 1.0  # the scripted policy solves it without exploration
    assert result["error"] is None and result["stage_failed"] is None
    assert log.stages == [(job_id, Stage.INIT), (job_id, Stage.RUN), (job_id, Stage.EVAL)]
    assert log.finished == [(job_id, JobState.DONE)]
    assert result["trajectory"]["stop_reason"] == "finish"
    assert result["instance_id"] == instance["instance_id"]
    assert result["data_source"] == "countdown"
    assert set(result["timing"]) == {"queue_s", "init_s", "run_s", "eval_s", "total_s"}


async def test_state_is_visible_in_each_stage(make_pipeline: Any, probe: ProbeTask) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(init="block", run="block", eval="block"))
        for stage in STAGES:
            await probe.wait_entered(job_id, stage)
            view = await pipeline.lookup(job_id)
            assert view is not None and view.state == JobState(stage)
            assert view.stage == Stage(stage)
            probe.release(job_id, stage)
        result = await finished(pipeline, job_id)
    assert result["state"] == "done"
    assert probe.opened[job_id] == probe.closed[job_id] == 1


@pytest.mark.parametrize("stage", STAGES)
async def test_timeout_in_each_stage(make_pipeline: Any, probe: ProbeTask, stage: str) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(**{stage: "block"}), timeout_s=0.2)
        result = await finished(pipeline, job_id)
    assert result["state"] == "timeout"
    assert result["stage_failed"] == stage
    assert result["error"]["type"] == "timeout"
    # The job's budget bound it: said as the budget asked (0.2 s), not as what was left of it.
    message = result["error"]["message"]
    # (What was left is said only where a second or more went before the stage.)
    assert message == f"the job's time budget of 0.2 s ran out in {stage}", message
    assert probe.opened[job_id] == 1 and probe.closed[job_id] == 1
    if stage != "init":  # the partial trajectory comes back
        assert result["trajectory"]["turns"][0]["action"] == "first"
        assert result["trajectory"]["response_ids"] == [1, 2, 3]


@pytest.mark.parametrize("stage", STAGES)
async def test_stage_limit_applies_to_that_stage_only(
    make_pipeline: Any, probe: ProbeTask, stage: str
) -> None:
    limits = {Stage(stage): 0.1}
    others = [s for s in STAGES if s != stage]
    async with make_pipeline(stage_timeout_s=limits) as pipeline:
        slow_here = await submit_one(pipeline, probe_instance(**{stage: "block"}))
        slow_elsewhere = await submit_one(pipeline, probe_instance(**{others[0]: "block"}))
        result = await finished(pipeline, slow_here)
        await probe.wait_entered(slow_elsewhere, others[0])
        probe.release(slow_elsewhere, others[0])
        other = await finished(pipeline, slow_elsewhere)
    assert result["state"] == "timeout" and result["stage_failed"] == stage
    assert f"{stage} did not finish within its time limit" in result["error"]["message"]
    assert other["state"] == "done"


async def test_queue_waits_do_not_count_against_the_budget(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=1) as pipeline:
        blocker = await submit_one(pipeline, probe_instance(init="block"))
        await probe.wait_entered(blocker, "init")
        waiting = await submit_one(pipeline, probe_instance(), timeout_s=0.3)
        await asyncio.sleep(0.5)  # longer than the waiting job's whole budget
        probe.release(blocker, "init")
        result = await finished(pipeline, waiting)
    assert result["state"] == "done"
    assert result["timing"]["queue_s"] >= 0.5


@pytest.mark.parametrize("stage", STAGES)
async def test_cancel_in_each_stage(make_pipeline: Any, probe: ProbeTask, stage: str) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(**{stage: "block"}))
        await probe.wait_entered(job_id, stage)
        assert pipeline.cancel(job_id) is not None
        result = await finished(pipeline, job_id)
        pipeline.cancel(job_id)  # a second cancel changes nothing
    assert result["state"] == "cancelled"
    assert result["stage_failed"] == stage
    assert result["error"] == {
        "type": "cancelled",
        "message": "cancelled by request",
        "kind": "infra",
        "stage": stage,
    }
    assert probe.opened[job_id] == 1 and probe.closed[job_id] == 1
    if stage != "init":
        assert result["trajectory"]["turns"][0]["action"] == "first"


async def test_cancel_while_queued_never_starts_the_job(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=1) as pipeline:
        blocker = await submit_one(pipeline, probe_instance(init="block"))
        await probe.wait_entered(blocker, "init")
        queued = await submit_one(pipeline, probe_instance())
        pipeline.cancel(queued)
        result = await finished(pipeline, queued)
        probe.release(blocker, "init")
        assert (await finished(pipeline, blocker))["state"] == "done"
    assert result["state"] == "cancelled" and result["stage_failed"] is None
    assert probe.opened[queued] == 0 and probe.closed[queued] == 0


async def test_cancel_while_waiting_for_run_cleans_up_once(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(run_workers=1) as pipeline:
        blocker = await submit_one(pipeline, probe_instance(run="block"))
        await probe.wait_entered(blocker, "run")
        waiting = await submit_one(pipeline, probe_instance())
        await probe.wait_entered(waiting, "init")
        job = pipeline.active(waiting)
        assert job is not None
        await settle(
            lambda: job.state is JobState.RUN and job.phase is Phase.QUEUED
        )  # in the RUN queue
        pipeline.cancel(waiting)
        result = await finished(pipeline, waiting)
        probe.release(blocker, "run")
        await finished(pipeline, blocker)
    assert result["state"] == "cancelled" and result["stage_failed"] == "run"
    assert (waiting, "run") not in probe.order
    assert probe.opened[waiting] == 1 and probe.closed[waiting] == 1


async def test_backpressure_holds_jobs_in_the_queue_before_a_full_one(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=1, run_workers=1, run_queue=1) as pipeline:
        running = await submit_one(pipeline, probe_instance(run="block"))
        await probe.wait_entered(running, "run")
        in_queue = await submit_one(pipeline, probe_instance())
        held = await submit_one(pipeline, probe_instance())
        behind = await submit_one(pipeline, probe_instance())
        await settle(lambda: pipeline.stats()["stages"]["run"]["queued"] == 1)
        # The RUN queue is full, so no INIT worker takes another job: `held` waits in the INIT
        # queue, holding no INIT slot and no sandbox, where a cancel ends it at once.
        stats = pipeline.stats()["stages"]
        assert stats["init"]["active"] == 0 and stats["init"]["queued"] == 2
        pipeline.cancel(held)
        result = await finished(pipeline, held)
        probe.release(running, "run")
        for job_id in (running, in_queue, behind):
            assert (await finished(pipeline, job_id))["state"] == "done"
    assert result["state"] == "cancelled" and result["stage_failed"] is None
    assert probe.opened[held] == 0 and (held, "init") not in probe.order


async def test_a_long_eval_does_not_hold_a_run_slot(make_pipeline: Any, probe: ProbeTask) -> None:
    async with make_pipeline(run_workers=1, eval_workers=2) as pipeline:
        slow_eval = await submit_one(pipeline, probe_instance(eval="block"))
        await probe.wait_entered(slow_eval, "eval")
        second = await submit_one(pipeline, probe_instance(eval="block"))
        await probe.wait_entered(second, "eval")  # it got through the single RUN slot
        stats = pipeline.stats()["stages"]
        assert stats["eval"]["active"] == 2 and stats["run"]["active"] == 0
        for job_id in (slow_eval, second):
            probe.release(job_id, "eval")
            assert (await finished(pipeline, job_id))["state"] == "done"


@pytest.mark.parametrize("stage", STAGES)
async def test_a_handler_that_raises_fails_the_job_not_the_service(
    make_pipeline: Any, probe: ProbeTask, stage: str
) -> None:
    async with make_pipeline() as pipeline:
        bad = await submit_one(pipeline, probe_instance(**{stage: "raise"}))
        result = await finished(pipeline, bad)
        good = await submit_one(pipeline, probe_instance())
        assert (await finished(pipeline, good))["state"] == "done"
    assert result["state"] == "failed" and result["stage_failed"] == stage
    assert result["error"] == {
        "type": "RuntimeError",
        "message": f"boom in {stage}",
        "kind": "infra",
        "stage": stage,
    }
    assert result["reward"] is None
    assert probe.opened[bad] == 1 and probe.closed[bad] == 1


async def test_a_trajectory_that_breaks_the_invariant_fails_the_job_and_is_kept(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(max_attempts=2) as pipeline:
        job_id = await submit_one(pipeline, probe_instance(run="broken"))
        result = await finished(pipeline, job_id)
        stored = await pipeline.store.get(job_id)
    reason = (
        "the trajectory breaks the token invariant: 3 response_ids but 2 loss_mask and 3 logprobs"
    )
    assert result["state"] == "failed" and result["stage_failed"] == "run"
    # Not the model's doing: run again while attempts are left, like any infra failure.
    assert result["error"] == {
        "type": "broken_trajectory",
        "message": reason,
        "kind": "infra",
        "stage": "run",
    }
    assert [e["type"] for e in result["attempt_errors"]] == ["broken_trajectory"]
    # What can be kept is: the tokens, the turns, the reward of the last attempt.
    assert result["trajectory"]["response_ids"] == [1, 2, 3] and result["reward"] == 0.5
    assert result["metrics"]["trajectory_error"] == reason
    assert stored is not None and stored.result is not None
    assert stored.result.model_dump(mode="json") == result


async def test_a_nan_logprob_fails_the_job_and_its_result_can_still_be_read_back(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(run="nan"))
        await finished(pipeline, job_id)
        stored = await pipeline.store.get(job_id)  # NaN is no JSON: it would not parse back
    assert stored is not None and stored.result is not None
    result = stored.result
    assert result.state == "failed" and result.error is not None
    assert result.error.message.endswith("logprobs holds values that are not finite numbers")
    assert result.trajectory.response_ids == [1, 2, 3] and result.trajectory.logprobs == []


async def test_a_job_that_fails_otherwise_keeps_its_reason_and_notes_the_broken_trajectory(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(run="broken", eval="policy"))
        result = await finished(pipeline, job_id)
    assert result["state"] == "failed" and result["error"]["kind"] == "policy"
    assert result["error"]["type"] == "PolicyError"
    assert "3 response_ids but 2 loss_mask" in result["metrics"]["trajectory_error"]


@pytest.mark.parametrize("stage", STAGES)
async def test_a_handler_that_hangs_and_ignores_cancellation_times_out(
    make_pipeline: Any, probe: ProbeTask, stage: str
) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(**{stage: "stubborn"}), timeout_s=0.1)
        result = await finished(pipeline, job_id)
        assert result["state"] == "timeout" and result["stage_failed"] == stage
        if stage == "init":
            # init never returned, so there was no context to clean up yet; when the abandoned
            # init finally returns, what it opened is still closed, once.
            assert probe.closed[job_id] == 0
            probe.release(job_id, stage)
            await asyncio.wait_for(probe.closed_event[job_id].wait(), 10)
        else:
            probe.release(job_id, stage)
    assert probe.opened[job_id] == 1 and probe.closed[job_id] == 1


async def test_wrong_return_type_is_a_clear_failure(
    make_pipeline: Any, probe: ProbeTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def bad_eval(context: Any, trajectory: Any) -> float:
        return 1.0

    monkeypatch.setattr(probe, "eval", bad_eval)
    async with make_pipeline() as pipeline:
        result = await finished(pipeline, await submit_one(pipeline, probe_instance()))
    assert result["state"] == "failed" and result["stage_failed"] == "eval"
    assert result["error"]["type"] == "TypeError"
    assert "probe.eval returned float, not a RewardInfo" in result["error"]["message"]


async def test_full_init_queue_is_refused_and_nothing_accepted_is_dropped(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=1, init_queue=2) as pipeline:
        first = await submit_one(pipeline, probe_instance(init="block"))
        await probe.wait_entered(first, "init")
        queued = [await submit_one(pipeline, probe_instance()) for _ in range(2)]
        with pytest.raises(InitQueueFull) as exc:
            await submit_one(pipeline, probe_instance())
        assert exc.value.retry_after_s >= 1
        probe.release(first, "init")
        states = [(await finished(pipeline, j))["state"] for j in [first, *queued]]
    assert states == ["done", "done", "done"]


async def test_a_batch_is_accepted_whole_or_not_at_all(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline(init_workers=1, init_queue=1) as pipeline:
        first = await submit_one(pipeline, probe_instance(init="block"))
        await probe.wait_entered(first, "init")
        batch = [req(probe_instance(), job_id=f"b{i}") for i in range(2)]
        with pytest.raises(InitQueueFull):
            await pipeline.submit(batch)
        assert await pipeline.lookup("b0") is None and await pipeline.lookup("b1") is None
        probe.release(first, "init")


async def test_resubmitting_a_job_id_is_idempotent(make_pipeline: Any, probe: ProbeTask) -> None:
    async with make_pipeline() as pipeline:
        instance = probe_instance(run="block")
        (a,) = await pipeline.submit([req(instance, job_id="same")])
        (b,) = await pipeline.submit([req(instance, job_id="same")])
        assert a.created and not b.created and a.job_id == b.job_id == "same"
        with pytest.raises(JobIdConflict):
            await pipeline.submit([req(probe_instance(), job_id="same")])
        await probe.wait_entered("same", "run")
        probe.release("same", "run")
        await finished(pipeline, "same")
        (c,) = await pipeline.submit([req(instance, job_id="same")])  # after it finished
        assert not c.created and c.state is JobState.DONE and c.result is not None
        # The same id twice in one batch is one job.
        views = await pipeline.submit(
            [req(instance, job_id="twice"), req(instance, job_id="twice")]
        )
        assert [v.created for v in views] == [True, False]
        probe.release("twice", "run")
        await finished(pipeline, "twice")
    assert probe.opened["same"] == 1 and probe.opened["twice"] == 1


async def test_bad_input_is_rejected_before_anything_is_accepted(make_pipeline: Any) -> None:
    async with make_pipeline() as pipeline:
        good = req(probe_instance(), job_id="good")
        with pytest.raises(RequestRejected) as exc:
            await pipeline.submit([good, req({"data_source": "nope"})])
        assert exc.value.index == 1 and isinstance(exc.value.cause, UnknownTask)
        with pytest.raises(RequestRejected) as exc:
            await pipeline.submit([req({"data_source": "countdown", "numbers": [1], "target": 3})])
        assert isinstance(exc.value.cause, InvalidInstance)
        assert exc.value.cause.field == "instance.numbers"
        assert await pipeline.lookup("good") is None


async def test_priority_orders_each_stage_queue(make_pipeline: Any, probe: ProbeTask) -> None:
    async with make_pipeline(init_workers=1) as pipeline:
        blocker = await submit_one(pipeline, probe_instance(init="block"))
        await probe.wait_entered(blocker, "init")
        low = await submit_one(pipeline, probe_instance(), priority=0)
        high = await submit_one(pipeline, probe_instance(), priority=5)
        probe.release(blocker, "init")
        await finished(pipeline, low)
        await finished(pipeline, high)
    inits = [job for job, stage in probe.order if stage == "init"]
    assert inits == [blocker, high, low]


async def test_drain_finishes_jobs_in_flight_and_refuses_new_ones(
    make_pipeline: Any, probe: ProbeTask
) -> None:
    async with make_pipeline() as pipeline:
        job_id = await submit_one(pipeline, probe_instance(run="block"))
        await probe.wait_entered(job_id, "run")
        drain = asyncio.create_task(pipeline.drain(grace_s=30))
        await asyncio.sleep(0)
        with pytest.raises(Draining, match="shutting down"):
            await submit_one(pipeline, probe_instance())
        with pytest.raises(Draining):  # ProRL's /start does not undo a shutdown
            pipeline.resume()
        assert not pipeline.accepting and not drain.done()
        probe.release(job_id, "run")
        await asyncio.wait_for(drain, 10)
        record = await pipeline.store.get(job_id)
    assert record is not None and record.state == "done" and record.result is not None


async def test_drain_cancels_what_outlasts_the_grace_period(
    make_pipeline: Any, probe: ProbeTask, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="raas.pipeline")
    async with make_pipeline() as pipeline:
        asked = await submit_one(pipeline, probe_instance(run="block"))
        await probe.wait_entered(asked, "run")
        pipeline.cancel(asked)
        await finished(pipeline, asked)
        job_id = await submit_one(pipeline, probe_instance(run="block"))
        await probe.wait_entered(job_id, "run")
        await pipeline.drain(grace_s=0.05)
        record = await pipeline.store.get(job_id)
    assert record is not None and record.result is not None
    assert record.result.state == "cancelled"
    assert record.result.error is not None and record.result.error.type == "shutdown"
    assert probe.closed[job_id] == 1
    # A cancel that was asked for is logged as news; one forced by a shutdown as a warning.
    levels = {
        r.getMessage().split()[1]: r.levelname
        for r in caplog.records
        if " cancelled " in r.getMessage()
    }
    assert levels == {asked: "INFO", job_id: "WARNING"}


async def test_restart_reports_in_flight_jobs_as_failed_and_keeps_results(
    tmp_path: Path, registry: TaskRegistry, probe: ProbeTask
) -> None:
    db = tmp_path / "crash.db"
    store = ResultStore(db)
    await store.open()
    first = Pipeline(registry, store, small_config())
    await first.start()
    await first.submit([req(probe_instance(), job_id="finished-before")])
    await finished(first, "finished-before")
    await first.submit([req(probe_instance(run="block"), job_id="in-flight")])
    await probe.wait_entered("in-flight", "run")
    # The process "dies": workers vanish without finishing anything, the store just closes.
    for task in first.stages.workers:
        task.cancel()
    await store.close()

    store2 = ResultStore(db)
    await store2.open()
    second = Pipeline(registry, store2, small_config())
    await second.start()
    try:
        lost = await second.lookup("in-flight")
        kept = await second.lookup("finished-before")
    finally:
        await second.stop()
        await store2.close()
    assert lost is not None and lost.state is JobState.FAILED and lost.result is not None
    assert lost.result.error is not None and lost.result.error.type == "server_restart"
    assert lost.result.stage_failed == "run"
    assert kept is not None and kept.state is JobState.DONE
    assert kept.result is not None and kept.result.reward == 0.5


@pytest.mark.parametrize(("how", "attempts"), [("no_image", 1), ("raise", 3)])
async def test_an_infra_failure_a_retry_cannot_help_ends_the_job_at_once(
    make_pipeline: Any, probe: ProbeTask, how: str, attempts: int
) -> None:
    """A missing image (``retry = False`` on its error) is not run again; any other infra
    failure is, while attempts are left (the control)."""
    async with make_pipeline(max_attempts=3) as pipeline:
        job_id = await submit_one(pipeline, probe_instance(init=how))
        result = await finished(pipeline, job_id)
    assert result["state"] == "failed" and result["error"]["kind"] == "infra"
    assert result["attempts"] == attempts
    assert probe.calls[job_id, "init"] == attempts


def test_a_job_moves_only_along_the_transition_table(probe: ProbeTask) -> None:
    job = Job("j", JobRequest.of(probe_instance()), probe)
    assert job.phase is Phase.QUEUED
    for phase in (Phase.HELD, Phase.RETRYING, Phase.HELD, Phase.FINISHING, Phase.FINISHED):
        assert phase in TRANSITIONS[job.phase]
        job.move(phase)
    with pytest.raises(BadTransition):
        job.move(Phase.HELD)  # a finished job is held by no one again
    assert job.phase is Phase.FINISHED
    assert set(TRANSITIONS) == set(Phase)


async def test_a_worker_handed_a_job_it_may_not_hold_keeps_working(
    make_pipeline: Any, probe: ProbeTask, caplog: pytest.LogCaptureFixture
) -> None:
    # Only a bug of the pipeline's queues a job that is not QUEUED; the worker that takes it
    # says so and takes the next job, rather than dying with the stage one worker short.
    async with make_pipeline(init_workers=1) as pipeline:
        stray = Job("stray", JobRequest.of(probe_instance()), probe)
        for phase in (Phase.HELD, Phase.FINISHING):
            stray.move(phase)
        pipeline.stages.queues[Stage.INIT].put_nowait(stray)
        job_id = await submit_one(pipeline, probe_instance())
        result = await finished(pipeline, job_id)
    assert result["state"] == "done"
    assert "took job stray, not queued" in caplog.text
