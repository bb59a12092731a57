"""A job whose model call brings no token: a stall the backend owns (infra, run again), told
from a slow model that sends tokens (the policy's), with the tokens of a running turn seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raas.llm.pool import BackendPool
from raas.llm.types import Generation, Heard, LiveCall, SamplingParams
from raas.pipeline import JobRequest, Pipeline, Stage
from raas.pipeline.job import Ending, Job
from raas.pipeline.stages import _timed_out
from raas.store.sqlite import ResultStore
from raas.tasks import RewardInfo, TaskContext, TaskJob
from raas.tasks.registry import TaskRegistry
from raas.wire import Trajectory
from tests.conftest import small_config
from tests.support.llm_servers import FakeBackend, ServerThread
from tests.support.probe import WAIT_S, finished

PROMPT = [5, 6, 7]


class AskTask:
    """One model call through the services' pool, as the agent loop makes it (the job's id as
    its session); the reward is 1 once it answers."""

    name = "ask"

    def validate(self, job: TaskJob) -> None:
        return None

    async def init(self, job: TaskJob) -> TaskContext:
        return TaskContext(job=job)

    async def run(self, context: TaskContext) -> Trajectory:
        traj = context.trajectory
        traj.prompt_ids = list(PROMPT)
        # The policy's own time first (a tool that sleeps), where the instance says so.
        await asyncio.sleep(float(context.job.instance.get("tools_s", 0)))
        gen = await context.job.services.llm.generate(
            context.job.job_id, PROMPT, SamplingParams(max_tokens=5)
        )
        traj.add_generated(gen.token_ids, gen.logprobs)
        return traj

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        return RewardInfo(1.0)

    async def cleanup(self, context: TaskContext) -> None:
        return None


@pytest.fixture
def fake() -> Iterator[tuple[FakeBackend, ServerThread]]:
    backend = FakeBackend("vllm")
    backend.streams = True
    server = ServerThread(backend.app).start()
    yield backend, server
    backend.released.set()
    server.stop()


async def run_one(
    tmp_path: Path, url: str, timeout_s: float, tools_s: float = 0.0
) -> dict[str, Any]:
    registry = TaskRegistry()
    registry.register(AskTask())
    pool = BackendPool()
    pool.add(url)
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    pipeline = Pipeline(
        registry, store, small_config(max_attempts=2), services=SimpleNamespace(llm=pool)
    )
    await pipeline.start()
    try:
        instance = {"data_source": "ask", "tools_s": tools_s}
        request = JobRequest.of(instance=instance, timeout_s=timeout_s)
        (view,) = await pipeline.submit([request])
        return await finished(pipeline, view.job_id)
    finally:
        await pipeline.stop(grace_s=0)
        await store.close()
        await pool.stop()


async def test_a_backend_that_sends_no_token_is_an_infra_timeout_run_again(
    tmp_path: Path, fake: Any
) -> None:
    backend, server = fake
    backend.hold_after = 0  # headers, then nothing: stalled before its first token
    result = await run_one(tmp_path, server.url, timeout_s=1.0)
    assert result["state"] == "timeout"
    error = result["error"]
    assert error["kind"] == "infra" and error["stage"] == "run"
    assert error["message"].startswith(f"{server.url} sent no token in ")
    assert "the job's time budget of 1 s ran out in run" in error["message"]
    # Run again, in its own budget, and stalled again the same way.
    assert result["attempts"] == 2
    assert [e["kind"] for e in result["attempt_errors"]] == ["infra"]
    assert len(backend.requests) == 2


async def test_a_policy_that_asks_the_model_with_a_moment_left_times_out_as_itself(
    tmp_path: Path, fake: Any
) -> None:
    # The attack: wait out most of the budget in a tool, then ask a model that cannot answer
    # in the moment left, to have the timeout blamed on the backend and the job run again.
    backend, server = fake
    backend.hold_after = 0
    result = await run_one(tmp_path, server.url, timeout_s=1.0, tools_s=0.75)
    assert result["state"] == "timeout"
    assert result["error"]["kind"] == "policy" and result["attempts"] == 1
    assert "sent no token" not in result["error"]["message"]


async def test_a_model_that_answers_is_unaffected(tmp_path: Path, fake: Any) -> None:
    _, server = fake
    result = await run_one(tmp_path, server.url, timeout_s=60.0)
    assert result["state"] == "done" and result["reward"] == 1.0
    assert len(result["trajectory"]["response_ids"]) == 5


async def test_the_tokens_of_a_running_turn_are_counted_as_they_stream(
    tmp_path: Path, fake: Any
) -> None:
    backend, server = fake
    backend.hold_after = 3
    registry = TaskRegistry()
    registry.register(AskTask())
    pool = BackendPool()
    pool.add(server.url)
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    pipeline = Pipeline(registry, store, small_config(), services=SimpleNamespace(llm=pool))
    await pipeline.start()
    try:
        (view,) = await pipeline.submit([JobRequest.of(instance={"data_source": "ask"})])
        job = pipeline.stages.jobs[view.job_id]
        assert await asyncio.to_thread(backend.holding.wait, WAIT_S)
        deadline = time.monotonic() + WAIT_S  # the three chunks sent reach the pool
        while job.tokens_so_far()[1] < 3 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert job.tokens_so_far() == (3, 3)
        call = job.model_call()
        assert call is not None and call.backend == server.url and call.streaming
        backend.released.set()
        result = await finished(pipeline, view.job_id)
    finally:
        backend.released.set()
        await pipeline.stop(grace_s=0)
        await store.close()
        await pool.stop()
    assert result["state"] == "done" and job.model_call() is None


def a_job(call: LiveCall | None) -> Job:
    """A job whose pool has ``call`` in flight for it (None: no call)."""
    pool = BackendPool()
    job = Job("j1", JobRequest.of(instance={}), AskTask(), SimpleNamespace(llm=pool))
    if call is not None:
        pool._live["j1"] = call
    return job


@pytest.mark.parametrize(
    ("call", "kind", "said"),
    [
        (LiveCall("http://b", time.monotonic(), 0, True), "infra", "http://b sent no token in"),
        (LiveCall("http://b", time.monotonic()), "infra", "nor any other call meanwhile"),
        (LiveCall("", time.monotonic()), "infra", "no backend took the turn's model call"),
        (LiveCall("http://b", time.monotonic(), 3, True), "policy", None),
        (None, "policy", None),
    ],
)
def test_whose_timeout_it_is(call: LiveCall | None, kind: str, said: str | None) -> None:
    # (A limit of 0: any wait is at least half of it; the half is the test above's.)
    ending = _timed_out(a_job(call), Stage.RUN, "the budget ran out", "policy", 0.0)
    assert ending.kind == kind and ending.message.endswith("the budget ran out")
    if said is None:
        assert ending.message == "the budget ran out"
    else:
        assert said in ending.message


def test_a_call_that_waited_less_than_half_the_limit_is_no_stall() -> None:
    call = LiveCall("http://b", time.monotonic(), 0, True)  # started a moment ago
    ending = _timed_out(a_job(call), Stage.RUN, "the budget ran out", "policy", 10.0)
    assert ending.kind == "policy" and ending.message == "the budget ran out"


class Siblings:
    """A streaming backend's client for overlapping calls of one session: a call of
    ``max_tokens`` 3 streams its three tokens and goes on running; any other waits, tokenless
    (queued behind them), until released."""

    def __init__(self) -> None:
        self.streaming, self.queued = asyncio.Event(), asyncio.Event()
        self.released = asyncio.Event()

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, vocab: Any, live: LiveCall
    ) -> Generation:
        live.streaming = True
        if params.max_tokens == 3:
            live.count(3)
            self.streaming.set()
        else:
            self.queued.set()
        await self.released.wait()
        return Generation([1] * live.tokens, [-0.1] * live.tokens, "length")

    async def aclose(self) -> None:
        return None


async def overlapping(with_sibling: bool) -> Ending:
    """How a job ends whose time ran out while its latest model call, waiting for ~100 s of a
    limit of 150, had no token; ``with_sibling``: while an earlier call of the same job (an
    agent behind the gateway makes as many at once as it likes) was streaming tokens."""
    job = a_job(None)
    pool = job.services.llm
    client = Siblings()
    pool.add("http://b").client = client
    calls = []
    if with_sibling:
        calls.append(asyncio.create_task(pool.generate("j1", PROMPT, SamplingParams(max_tokens=3))))
        await client.streaming.wait()
    calls.append(asyncio.create_task(pool.generate("j1", PROMPT, SamplingParams(max_tokens=9))))
    await client.queued.wait()
    call = job.model_call()
    assert call is not None and call.tokens == 0
    call.started -= 100.0  # (as if it had waited 100 s)
    try:
        return _timed_out(job, Stage.RUN, "the budget ran out", "policy", 150.0)
    finally:
        client.released.set()
        await asyncio.gather(*calls)
        await pool.stop()


async def test_a_call_queued_behind_its_own_siblings_is_no_stall() -> None:
    # The attack: flood the backend with the job's own calls at once, so that the latest
    # waits in its queue with no token while the others stream; the timeout would be the
    # backend's, the job run again and its 0 dropped. Its siblings' tokens say it is not.
    ending = await overlapping(with_sibling=True)
    assert ending.kind == "policy" and ending.message == "the budget ran out"


async def test_a_lone_call_without_a_token_is_still_a_stall() -> None:
    ending = await overlapping(with_sibling=False)
    assert ending.kind == "infra" and "http://b sent no token in" in ending.message


def test_a_long_generation_on_a_backend_that_answers_whole_is_the_policys() -> None:
    # The attack: generate for more than half the limit on a backend that answers whole (no
    # token counted until it ends), to have the timeout blamed on the backend. The backend
    # answered other jobs meanwhile: alive, so the long generation is the policy's.
    alive = Heard(time.monotonic() - 10.0)
    call = LiveCall("http://b", time.monotonic() - 100.0, backend_heard=alive)
    ending = _timed_out(a_job(call), Stage.RUN, "the budget ran out", "policy", 150.0)
    assert ending.kind == "policy" and ending.message == "the budget ran out"


def test_a_backend_that_answers_whole_and_answered_no_one_meanwhile_stalled() -> None:
    silent = Heard(time.monotonic() - 500.0)  # its last answer came before the call began
    call = LiveCall("http://b", time.monotonic() - 100.0, backend_heard=silent)
    ending = _timed_out(a_job(call), Stage.RUN, "the budget ran out", "policy", 150.0)
    assert ending.kind == "infra"
    assert ending.message.startswith("http://b had not answered the turn's model call in ")
    assert "nor any other call meanwhile" in ending.message
