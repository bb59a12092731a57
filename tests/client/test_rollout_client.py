"""The trainer-side client: retries without duplicates, several servers, groups, DAPO."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.client.dapo import collect_groups
from raas.client.rollout_client import RolloutClient, SyncRolloutClient
from raas.client.single_server import AsyncRolloutClient, RaasHTTPError
from raas.settings import ServeSettings
from raas.tasks import RewardInfo, TaskContext, TaskJob, TaskRegistry
from raas.wire import Branch, RolloutRequest, Trajectory
from tests.support.llm_servers import ServerThread


class CoinTask:
    """Reward ``rewards[k]`` for the k-th sample (job id ``...-k``); ``block`` never finishes."""

    name = "coin"

    async def init(self, job: TaskJob) -> TaskContext:
        return TaskContext(job=job)

    async def run(self, context: TaskContext) -> Trajectory:
        if context.job.instance.get("block"):
            await asyncio.Event().wait()
        return context.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        rewards = context.job.instance.get("rewards", [1.0])
        tail = context.job.job_id.rsplit("-", 1)[-1]
        k = int(tail) if tail.isdigit() else 0
        return RewardInfo(float(rewards[k % len(rewards)]))

    async def cleanup(self, context: TaskContext) -> None:
        return None


class ForkingCoin(CoinTask):
    """A coin whose set-up (init) the server can fork for a group's samples; counts inits."""

    name = "forking-coin"

    def __init__(self) -> None:
        self.inits: list[str] = []
        self.forks: list[str] = []

    async def init(self, job: TaskJob) -> TaskContext:
        self.inits.append(job.job_id)
        return TaskContext(job=job)

    async def fork_context(self, template: TaskContext, job: TaskJob) -> TaskContext:
        self.forks.append(job.job_id)
        return TaskContext(job=job)


FORKING = ForkingCoin()


def coin(*rewards: float, block: bool = False) -> dict[str, Any]:
    return {"data_source": "coin", "rewards": list(rewards), "block": block}


@pytest.fixture
def coin_server(tmp_path: Path) -> Iterator[str]:
    registry = TaskRegistry()
    registry.register(CoinTask())
    registry.register(FORKING)
    app = create_app(ServeSettings(db=tmp_path / "coin.db", cancel_grace_s=0.1), registry)
    server = ServerThread(app).start()
    yield server.url
    server.stop()


class DropFirstAnswer(httpx.AsyncBaseTransport):
    """Delivers the first submission to the server, then loses the answer (a network blip)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.dropped = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and "rollouts" in request.url.path and not self.dropped:
            await response.aread()
            self.dropped += 1
            raise httpx.ReadError("connection reset after the server accepted", request=request)
        return response


async def test_a_lost_answer_is_retried_without_duplicating_jobs(coin_server: str) -> None:
    transport = DropFirstAnswer()
    async with RolloutClient(coin_server, transport=transport) as client:
        ids = await client.submit_batch([RolloutRequest(instance=coin(1.0)) for _ in range(3)])
        results = [await client.wait(j) for j in ids]
    assert transport.dropped == 1 and len(set(ids)) == 3
    assert [r.state for r in results] == ["done"] * 3
    listed = httpx.get(f"{coin_server}/v1/rollouts", params={"limit": 100}).json()["results"]
    assert sorted(r["job_id"] for r in listed) == sorted(ids)  # 3 jobs, not 6


async def test_groups_and_as_completed(coin_server: str) -> None:
    async with RolloutClient(coin_server) as client:
        groups = await client.generate_groups([coin(1, 0), coin(0.5)], n=4)
        assert [g.rewards for g in groups] == [[1, 0, 1, 0], [0.5] * 4]
        ids = await client.submit_batch([RolloutRequest(instance=coin(1)) for _ in range(5)])
        seen = [r.job_id async for r in client.as_completed(ids)]
    assert sorted(seen) == sorted(ids)


async def test_a_groups_samples_share_one_set_up_on_the_server(coin_server: str) -> None:
    FORKING.inits.clear()
    FORKING.forks.clear()
    tasks = [{**coin(1, 0), "data_source": "forking-coin", "p": p} for p in range(3)]
    async with RolloutClient(coin_server) as client:
        groups = await client.generate_groups(tasks, n=4)
        assert [g.rewards for g in groups] == [[1, 0, 1, 0]] * 3
        assert len(FORKING.inits) == 3 and len(FORKING.forks) == 12
        kept, report = await collect_groups(client, tasks, n=4, batch_size=3, max_in_flight=12)
    assert len(kept) == 3
    assert len(FORKING.inits) == 3 + report.prompts_submitted
    assert len(FORKING.forks) == 12 + report.jobs_submitted


def test_the_sync_client(coin_server: str) -> None:
    client = SyncRolloutClient(coin_server)
    try:
        (group,) = client.generate_groups([coin(1, 0, 0)], n=3)
        assert group.rewards == [1, 0, 0]
    finally:
        client.close()


async def test_dapo_stops_at_b_informative_groups_and_cancels_the_rest(coin_server: str) -> None:
    prompts = [
        coin(1, 1, 1),
        coin(1, 0, 0),
        coin(block=True),
        coin(0, 1, 0),
        coin(block=True),
        coin(1, 0, 1),
    ]
    async with RolloutClient(coin_server) as client:
        groups, report = await collect_groups(client, prompts, n=3, batch_size=2, max_in_flight=9)
        assert len(groups) == 2 and all(len(set(g.rewards)) > 1 for g in groups)
        assert report.groups_kept == 2 and not report.exhausted
        # Which prompts were submitted depends on timing; the accounting must not.
        finished = 3 * (report.groups_kept + report.groups_dropped)
        assert report.jobs_submitted == finished + report.jobs_cancelled
        assert report.jobs_cancelled >= 3  # at least the first blocked prompt's samples
        listed = httpx.get(f"{coin_server}/v1/rollouts", params={"state": "cancelled"}).json()
    # The service cancelled every job still in flight, at once.
    assert len(listed["results"]) == report.jobs_cancelled


async def in_flight(url: str) -> int:
    return int((await asyncio.to_thread(httpx.get, f"{url}/v1/status")).json()["in_flight"])


async def finished(url: str, state: str) -> int:
    reply = await asyncio.to_thread(httpx.get, f"{url}/v1/rollouts", params={"state": state})
    return len(reply.json()["results"])


async def test_dapo_cancels_its_jobs_when_every_task_is_cancelled_at_once(coin_server: str) -> None:
    # As asyncio.run does when an exception (SystemExit from a signal handler) leaves its loop:
    # the submitter is cancelled with the collection, and the jobs in flight must still be.
    async with RolloutClient(coin_server) as client:
        collecting = asyncio.create_task(
            collect_groups(client, [coin(block=True)] * 2, n=3, batch_size=1, max_in_flight=6)
        )
        async with asyncio.timeout(30):  # until all 6 run on the server
            while await in_flight(coin_server) < 6:  # noqa: ASYNC110 - another process's state
                await asyncio.sleep(0.05)
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await collecting
    listed = httpx.get(f"{coin_server}/v1/rollouts", params={"state": "cancelled"}).json()
    assert len(listed["results"]) == 6


class HoldAnswers(httpx.AsyncBaseTransport):
    """Delivers each submission to the server, then holds its answer until the caller gives up
    (a slow network): the jobs are on the server, their ids never reach the caller's code."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.delivered = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path.endswith("/rollouts:batch"):
            await response.aread()
            self.delivered.set()
            await asyncio.Event().wait()
        return response


async def test_dapo_cancels_jobs_whose_submission_was_cut_short(coin_server: str) -> None:
    # Every task cancelled (as asyncio.run does on leaving) while the server's answer to a
    # submission is on its way: the jobs run there, so they must be cancelled as the ones whose
    # answer came back are.
    transport = HoldAnswers()
    async with RolloutClient(coin_server, transport=transport) as client:
        collecting = asyncio.create_task(
            collect_groups(client, [coin(block=True)], n=3, batch_size=1, max_in_flight=3)
        )
        async with asyncio.timeout(30):
            await transport.delivered.wait()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await collecting
    listed = httpx.get(f"{coin_server}/v1/rollouts", params={"state": "cancelled"}).json()
    assert len(listed["results"]) == 3


async def test_cancelled_groups_cancel_their_jobs_on_the_server(coin_server: str) -> None:
    """A held-out pass stopped by Ctrl-C: its jobs would otherwise run on for nobody (and a
    server stopping after it would wait for them)."""
    async with RolloutClient(coin_server) as client:
        answering = asyncio.create_task(client.generate_groups([coin(1), coin(block=True)], n=2))
        async with asyncio.timeout(30):  # until the first task's two are done on the server
            while await finished(coin_server, "done") < 2:  # noqa: ASYNC110 - another process's
                await asyncio.sleep(0.05)
        answering.cancel()
        with pytest.raises(asyncio.CancelledError):
            await answering
    listed = httpx.get(f"{coin_server}/v1/rollouts", params={"limit": 100}).json()["results"]
    assert sorted(r["state"] for r in listed) == ["cancelled", "cancelled", "done", "done"]


async def test_dapo_drops_stale_groups(coin_server: str) -> None:
    calls = [0]

    def version() -> int:  # the policy moves on every time anyone asks
        calls[0] += 1
        return calls[0]

    prompts = [coin(1, 0), coin(0, 1), coin(1, 0)]
    settings: dict[str, Any] = {
        "n": 2,
        "batch_size": 2,
        "max_in_flight": 6,
        "policy_version": version,
    }
    async with RolloutClient(coin_server) as client:
        stale, report = await collect_groups(client, prompts, **settings, max_staleness=0)
        assert stale == [] and report.groups_stale == 3 and report.exhausted
        fresh, report = await collect_groups(client, prompts, **settings, max_staleness=100)
    assert len(fresh) == 2 and report.groups_stale == 0


@pytest.fixture
def two_coin_servers(tmp_path: Path) -> Iterator[list[str]]:
    registry = TaskRegistry()
    registry.register(CoinTask())
    servers = [
        ServerThread(create_app(ServeSettings(db=tmp_path / f"{i}.db"), registry)).start()
        for i in range(2)
    ]
    yield [s.url for s in servers]
    for server in servers:
        server.stop()


async def test_concurrent_submits_spread_over_equal_servers(two_coin_servers: list[str]) -> None:
    async with RolloutClient(two_coin_servers, status_every_s=0) as client:
        requests = [RolloutRequest(instance=coin(1.0, block=True)) for _ in range(8)]
        ids = await asyncio.gather(*(client.submit(r) for r in requests))
        per_server = [sum(client._where[j].url == url for j in ids) for url in two_coin_servers]
        for job_id in ids:
            await client.cancel(job_id)
    assert per_server == [4, 4]


def test_two_servers_one_killed_mid_batch_loses_nothing(start_server: Any, tmp_path: Path) -> None:
    first, second = start_server(tmp_path / "a.db"), start_server(tmp_path / "b.db")
    gate = tmp_path / "gate"

    async def scenario() -> list[Any]:
        async with RolloutClient([first.url, second.url], status_every_s=0) as client:
            ids = []
            for i in range(6):
                request = RolloutRequest(
                    instance={"data_source": "gated", "gate": str(gate)}, job_id=f"job-{i}"
                )
                ids.append(await client.submit(request))
            on_first = [j for j in ids if client._where[j].url == first.url]
            assert 0 < len(on_first) < 6  # spread over both
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
            gate.touch()
            results = await asyncio.gather(*(client.wait(j, poll_s=5) for j in ids))
            assert all(client._where[j].url == second.url for j in ids)
            return results

    results = asyncio.run(scenario())
    assert sorted(r.job_id for r in results) == [f"job-{i}" for i in range(6)]
    assert {r.state for r in results} == {"done"}


def test_a_killed_server_s_finished_jobs_are_read_back_after_restart(
    start_server: Any, tmp_path: Path
) -> None:
    first, second = start_server(tmp_path / "a.db"), start_server(tmp_path / "b.db")
    finished_gate, running_gate = tmp_path / "finished", tmp_path / "running"
    finished_gate.touch()

    def gated(gate: Path, i: int) -> RolloutRequest:
        return RolloutRequest(instance={"data_source": "gated", "gate": str(gate)}, job_id=f"j{i}")

    async def scenario() -> tuple[list[Any], list[str]]:
        client = RolloutClient([first.url, second.url], status_every_s=0, down_for_s=0.5)
        client.read_back_every_s = 0.1
        finished = [gated(finished_gate, i) for i in range(3)]
        running = [gated(running_gate, i) for i in range(3, 6)]
        ids = await client.submit_batch(finished + running)  # one batch: one server
        assert {client._where[j].url for j in ids} == {first.url}
        async with AsyncRolloutClient(first.url) as direct:  # finished there, unread by `client`
            for job_id in ids[:3]:
                assert (await direct.wait(job_id, poll_s=5)).state == "done"
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        # Run elsewhere, the finished jobs would wait at their (now closed) gate: they can only
        # finish by being read back. The unfinished ones finish on the second server.
        finished_gate.unlink()
        running_gate.touch()
        read_back = asyncio.gather(*(client.wait(j, poll_s=5) for j in ids[:3]))
        moved = await asyncio.gather(*(client.wait(j, poll_s=5) for j in ids[3:]))
        await asyncio.to_thread(start_server, tmp_path / "a.db", port=first.port)  # restarted
        # A guard, not a timing: without the read-back these jobs would wait at their gate forever.
        results = [*(await asyncio.wait_for(read_back, 120)), *moved]
        where = [client._where[j].url for j in ids]
        await client.aclose()
        return results, where

    results, where = asyncio.run(scenario())
    assert [r.job_id for r in results] == [f"j{i}" for i in range(6)]
    assert {r.state for r in results} == {"done"}
    assert where == [first.url] * 3 + [second.url] * 3
    copies = [httpx.get(f"{second.url}/v1/rollouts/j{i}").json() for i in range(3)]
    assert [c["state"] for c in copies] == ["cancelled"] * 3  # the copies did not run on
    # The restarted server ran its unfinished jobs again (their gate is open, so faster than the
    # client's cancel, see the next test): the trainer still got each job once.
    restarted = [
        httpx.get(f"{first.url}/v1/rollouts/j{i}", params={"wait": 60}).json() for i in range(3, 6)
    ]
    assert {r["result"]["attempt_errors"][0]["type"] for r in restarted} == {"server_restart"}


def test_a_moved_job_is_cancelled_on_its_old_server_once_that_is_back(
    start_server: Any, tmp_path: Path
) -> None:
    old = start_server(tmp_path / "old.db")
    gated = {"instance": {"data_source": "gated", "gate": str(tmp_path / "never")}, "job_id": "m"}
    assert httpx.post(f"{old.url}/v1/rollouts", json=gated).status_code == 202
    old.proc.send_signal(signal.SIGKILL)
    old.proc.wait()

    async def scenario() -> str:
        client = RolloutClient([old.url], status_every_s=0)
        client.read_back_every_s = 0.05
        client._cancel_when_back("m", client.servers[0])  # its result came from elsewhere
        # Back on its database: it runs the job again (the gate never opens) until cancelled.
        again = await asyncio.to_thread(start_server, tmp_path / "old.db", port=old.port)
        async with AsyncRolloutClient(again.url) as direct:
            state = (await direct.wait("m", poll_s=5)).state
        await client.aclose()
        return state

    assert asyncio.run(scenario()) == "cancelled"


def test_a_server_without_http_is_said_at_once_not_taken_for_one_that_is_down() -> None:
    for client in (RolloutClient, AsyncRolloutClient):
        with pytest.raises(httpx.InvalidURL, match=r"'127.0.0.1:8002'.*http://HOST:PORT"):
            client(["127.0.0.1:8002"] if client is RolloutClient else "127.0.0.1:8002")
    assert RolloutClient(["http://127.0.0.1:8002/"]).servers[0].url == "http://127.0.0.1:8002"


async def test_a_branch_goes_to_the_server_of_its_job(two_coin_servers: list[str]) -> None:
    async with RolloutClient(two_coin_servers, status_every_s=0) as client:
        parent = await client.submit(RolloutRequest(instance=coin(1.0)))
        await client.wait(parent, poll_s=5)
        # The job's server made the busier, so that placement alone would pick the other.
        home = client._where[parent]
        busy = [RolloutRequest(instance=coin(1.0, block=True), job_id=f"b{i}") for i in range(3)]
        await home.client.submit_batch(busy)
        branch = RolloutRequest(instance=coin(1.0), branch=Branch(job_id=parent, turn=1))
        with pytest.raises(RaasHTTPError) as refused:
            await client.submit(branch)
        for request in busy:
            await home.client.cancel(str(request.job_id))
    # The server that ran the job knows it: what it refuses is the coin task's branching (the
    # other would say it knows no such job, at branch.job_id).
    assert refused.value.status_code == 422 and refused.value.server == client._where[parent].url
    (detail,) = refused.value.detail
    assert detail["loc"] == ["body", "jobs", 0, "branch"] and "cannot branch" in detail["msg"]
