"""raas servers as Ray actors on a local two-node Ray cluster (``make test-ray``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.client.rollout_client import RolloutClient
from raas.deploy.ray import RayDeployment
from raas.tasks.countdown import generate_instances
from raas.wire import RolloutRequest, RolloutResult
from tests.support.tiers import require

# The servers listen on the nodes' addresses, so they need a key (given as an option, it goes
# to their environment, not their command lines).
KEY = "ray-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPTIONS = {"log_level": "warning", "api_key": KEY}

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # Required here, not at import, so that `make test` (which deselects these) never mentions it.
    ray = require("ray", "ray", "make test-ray")
    from ray.cluster_utils import Cluster

    # Two raylets on this machine stand in for two nodes (same IP, separate node ids).
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def raas_pids(marker: Path) -> list[int]:
    """Live processes whose command line names ``marker`` (zombies have none)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if str(marker).encode() in cmd:
                pids.append(int(d.name))
    return pids


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Until ``pid`` has exited and its parent can reap it: a killed process shows state Z as
    soon as its main thread is gone, but waitpid() reports it only once every thread is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            threads = len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            return
        if state == "Z" and threads <= 1:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs")


async def rollouts(urls: list[str], n: int, seed: int) -> list[RolloutResult]:
    """n countdown rollouts through the trainer's client over all the servers, then two more
    on each server alone: countdown jobs finish too fast for the client's load balancing to be
    sure to use every server."""
    tasks = generate_instances(n + 2 * len(urls), seed=seed)
    async with RolloutClient(urls, api_key=KEY) as client:
        ids = await client.submit_batch([RolloutRequest(instance=t) for t in tasks[:n]])
        results = await asyncio.gather(*(client.wait(j) for j in ids))
    for i, url in enumerate(urls):
        async with RolloutClient(url, api_key=KEY) as client:
            mine = tasks[n + 2 * i : n + 2 * i + 2]
            ids = await client.submit_batch([RolloutRequest(instance=t) for t in mine])
            results += await asyncio.gather(*(client.wait(j) for j in ids))
    return results


def finished(url: str) -> int:
    """Results in the server's database (from before a restart too)."""
    return len(
        httpx.get(url + "/v1/rollouts", params={"limit": 1000}, headers=AUTH).json()["results"]
    )


def test_per_node_servers_survive_kills(cluster: Any, tmp_path: Path) -> None:
    import ray

    dep = RayDeployment(
        {"run_workers": 2, "llm": ["http://127.0.0.1:9"], "log_level": "warning", "api_key": KEY},
        workdir=tmp_path,
        server_list=tmp_path / "servers.txt",
    )
    try:
        urls = dep.start()
        assert (tmp_path / "servers.txt").read_text().split() == urls
        assert len(urls) == 2 and len(set(urls)) == 2
        ip = ray.util.get_node_ip_address()
        assert all(u.startswith(f"http://{ip}:") for u in urls)
        assert len({s.node_id for s in dep.servers()}) == 2
        # The key reached the servers through their environment, not their command lines.
        assert all(KEY not in Path(f"/proc/{s.pid}/cmdline").read_text() for s in dep.servers())
        for url in urls:  # the options reached every server
            status = httpx.get(url + "/v1/status", headers=AUTH).json()
            assert status["stages"]["run"]["workers"] == 2
            assert status["llm_servers"] == ["http://127.0.0.1:9"]
        assert dep.check() == []

        results = asyncio.run(rollouts(urls, 8, seed=1))
        assert [r.state for r in results] == ["done"] * 12
        assert all(r.reward == 1.0 for r in results)
        before = [finished(u) for u in urls]
        assert sum(before) == 12 and min(before) >= 2

        # SIGKILL one raas serve: its actor restarts it on the same port and database.
        victim = dep.servers()[0].pid
        os.kill(victim, signal.SIGKILL)
        wait_gone(victim)
        repairs = dep.check()
        assert len(repairs) == 1
        assert "exited with -9" in repairs[0].reason
        assert repairs[0].new_url == repairs[0].old_url == urls[0]
        assert dep.urls() == urls and victim not in [s.pid for s in dep.servers()]
        assert finished(urls[0]) == before[0]  # results from before the kill are still there
        results = asyncio.run(rollouts(dep.urls(), 6, seed=2))
        assert [r.state for r in results] == ["done"] * 10

        # Killed again while something else holds its port: a new port, and a new URL.
        victim = dep.servers()[0].pid
        port = int(urls[0].rsplit(":", 1)[1])
        os.kill(victim, signal.SIGKILL)
        wait_gone(victim)
        with socket.socket() as squatter:
            squatter.bind(("0.0.0.0", port))
            squatter.listen()
            (repair,) = dep.check()
        assert repair.old_url == urls[0] and repair.new_url not in (None, urls[0])
        assert dep.urls() == [repair.new_url, urls[1]]
        assert (tmp_path / "servers.txt").read_text().split() == dep.urls()

        # The whole actor dies: a new one on the same node; the old server went with it.
        old_pid = dep.servers()[1].pid
        ray.kill(dep._slots[1].actor, no_restart=True)
        wait_gone(old_pid)
        (repair,) = dep.check()
        assert "actor died" in repair.reason and repair.new_url == urls[1]
        results = asyncio.run(rollouts(dep.urls(), 6, seed=3))
        assert [r.state for r in results] == ["done"] * 10
        assert dep.check() == []
    finally:
        dep.stop()
    assert raas_pids(tmp_path) == []
    assert not (tmp_path / "servers.txt").exists()


def test_fixed_count_and_nodes_joining_and_leaving(cluster: Any, tmp_path: Path) -> None:
    with RayDeployment(OPTIONS, workdir=tmp_path, name="three") as dep:
        dep.start(num_servers=3)
        nodes = [s.node_id for s in dep.servers()]
        assert sorted(nodes.count(n) for n in set(nodes)) == [1, 2]
        assert all(httpx.get(u + "/healthz").status_code == 200 for u in dep.urls())
    assert raas_pids(tmp_path) == []

    with RayDeployment(OPTIONS, workdir=tmp_path, name="follow") as dep:
        assert len(dep.start()) == 2
        node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        (joined,) = dep.check()
        assert joined.old_url is None and joined.new_url is not None
        assert len(dep.urls()) == 3
        assert httpx.get(joined.new_url + "/healthz").status_code == 200
        cluster.remove_node(node)
        deadline = time.monotonic() + 60
        while not (left := [r for r in dep.check() if r.slot == joined.slot]):
            assert time.monotonic() < deadline, "the removed node was never noticed"
            time.sleep(0.5)
        assert left[0].new_url is None and left[0].reason == "its node left the cluster"
        assert len(dep.urls()) == 2 and joined.new_url not in dep.urls()
    assert raas_pids(tmp_path) == []
