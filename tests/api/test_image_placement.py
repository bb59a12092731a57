"""Placement by image: servers report what their node's image store holds (/v1/status' version,
/v1/images, /metrics), and ``RolloutClient`` sends a job whose instance names an image to a
server that holds it.

Real image stores: small images built with umoci (rootless, offline) and imported with skopeo,
two of them sharing a layer; real servers on loopback, each with its own store.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from raas.api.app import create_app
from raas.api.image_store import ImageStoreMonitor
from raas.client.rollout_client import RolloutClient
from raas.images.store import ImageStore
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from raas.wire import RolloutRequest
from tests.client.test_rollout_client import CoinTask, coin
from tests.support.llm_servers import ServerThread
from tests.support.oci_images import ImageBuilder


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An OCI layout holding images ``x`` (one layer) and ``y`` (x's layer and one more)."""
    missing = [tool for tool in ("umoci", "skopeo") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: scripts/install-system-deps.sh")
    path = tmp_path_factory.mktemp("oci") / "layout"
    builder = ImageBuilder(path)
    builder.image("x", "empty", {"/x.txt": "x" * 5000})
    builder.image("y", "x", {"/y.txt": "y"})
    return path


@dataclass
class Node:
    url: str
    store: ImageStore


@pytest.fixture
def nodes(
    layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Node, Node]]:
    """Two servers, each with its own image store: the first's empty, the second's holding
    x and y. Each server reads $RAAS_IMAGE_STORE as its lifespan starts."""
    registry = TaskRegistry()
    registry.register(CoinTask())
    found, threads = [], []
    for name in ("a", "b"):
        store = ImageStore(tmp_path / f"store-{name}")
        if name == "b":
            store.import_(layout, "x")
            store.import_(layout, "y")
        monkeypatch.setenv("RAAS_IMAGE_STORE", str(store.root))
        app = create_app(ServeSettings(db=tmp_path / f"{name}.db"), registry)
        threads.append(ServerThread(app).start())
        found.append(Node(threads[-1].url, store))
    yield found[0], found[1]
    for thread in threads:
        thread.stop()


def job(image: str | None = None) -> RolloutRequest:
    instance = coin(1.0, block=True)
    if image is not None:
        instance["image_name"] = image
    return RolloutRequest(instance=instance)


async def test_jobs_go_to_the_server_whose_node_holds_their_image(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    async with RolloutClient([a.url, b.url], status_every_s=0) as client:
        # Equal servers would share these 2 and 2 by load (test_rollout_client's spread test);
        # every one goes to b, whose store holds x (named as a row names it, not spelt out).
        x_ids = await asyncio.gather(*(client.submit(job("x")) for _ in range(4)))
        # One batch: y's jobs to b; those of an image no node holds, and those naming none,
        # by load (to a, now the less loaded).
        batch = [job("y"), job("z"), job(), job("docker.io/library/y:latest")]
        batch_ids = await client.submit_batch(batch)
        where = {j: client._where[j].url for j in [*x_ids, *batch_ids]}
        for job_id in where:
            await client.cancel(job_id)
    assert [where[j] for j in x_ids] == [b.url] * 4
    assert [where[j] for j in batch_ids] == [b.url, a.url, a.url, b.url]


async def test_a_server_reports_its_node_s_images_and_store_gauges(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    async with httpx.AsyncClient() as http:
        status = (await http.get(f"{b.url}/v1/status")).json()
        listed = (await http.get(f"{b.url}/v1/images")).json()
        empty = (await http.get(f"{a.url}/v1/images")).json()
        metrics = (await http.get(f"{b.url}/metrics")).text
    assert listed == {
        "version": status["images_version"],
        "images": ["docker.io/library/x:latest", "docker.io/library/y:latest"],
    }
    assert empty["images"] == [] and empty["version"] != listed["version"]
    usage = b.store.usage()
    assert usage.layers == 2 and usage.share_ratio > 1  # y holds x's layer too
    assert "raas_image_store_images 2.0" in metrics
    assert "raas_image_store_layers 2.0" in metrics
    assert f"raas_image_store_bytes {float(usage.total_bytes)}" in metrics
    assert f"raas_image_store_share_ratio {usage.share_ratio}" in metrics


async def test_the_monitor_sees_an_import_and_keeps_its_version_otherwise(
    layout: Path, tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "store")
    monitor = ImageStoreMonitor(store)
    await monitor.refresh()
    before = monitor.version
    assert monitor.names == () and monitor.usage is not None and monitor.usage.images == 0
    await asyncio.to_thread(store.import_, layout, "x")
    await monitor.refresh()
    assert monitor.names == ("docker.io/library/x:latest",) and monitor.version != before
    assert monitor.usage is not None and monitor.usage.layers == 1
    after = monitor.version
    await asyncio.to_thread(store.remove, "x")
    await asyncio.to_thread(store.import_, layout, "x")  # index.json written anew, same names
    await monitor.refresh()
    assert monitor.version == after
