"""SWE-Gym rows in their own images, end to end (make test-images): real images built with umoci,
pushed to a real registry on 127.0.0.1, pulled with `raas images pull`, and run through a real
`raas serve` whose sandboxes start from the image store, answered by the oracle from the rows'
own gold patches (`--oracle-rows`), once gold and once sabotaged.

Every gold rollout must resolve by SWE-bench's rules (reward 1.0, the FAIL_TO_PASS tests in the
report's successes) and every sabotaged one score 0.0; the three images share their base layer,
which the store holds once; and after the server stops, no mount of a sandbox is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import runtime_key
from raas.client import RolloutClient
from raas.client.task_files import run_requests
from raas.images.store import ImageStore
from raas.launch import ServerProcess
from raas.llm.models import load_tokenizer
from raas.oracle.app import oracle_app
from raas.oracle.model import Oracle
from raas.oracle.sabotage import SABOTAGES, sabotage_of
from raas.sandbox.procs import descendants, start_time
from raas.sandbox.runtime import runtime_dir_of
from raas.wire import RolloutRequest, RolloutResult
from tests.judge.swe_image_rows import FAIL_TO_PASS, row, write_repo
from tests.support import oci_images
from tests.support.llm_servers import AgentBackend, ServerThread

pytestmark = pytest.mark.images

DEADLINE_S = 900.0  # a safety net for a broken run, never an assertion on speed


def instance_ids() -> list[str]:
    """Three row ids whose sabotage (seed 0, every task sabotaged) covers every way of it."""
    chosen: dict[str, str] = {}
    for n in range(200):
        instance_id = f"raas-tests__stats-{n}"
        way = sabotage_of("swe", instance_id, 1.0, 0)
        assert way is not None
        chosen.setdefault(way, instance_id)
        if len(chosen) == len(SABOTAGES["swe"]):
            return [chosen[way] for way in SABOTAGES["swe"]]
    raise AssertionError("no ids cover every way of sabotage")


def checkout_files(root: Path) -> dict[str, str | bytes]:
    """The project's checkout (its .git included) as the files of an image's /testbed."""
    write_repo(root)
    return {
        f"/testbed/{path.relative_to(root)}": path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three images, one per row, pushed to a registry and pulled into a store with the CLI."""
    tmp = tmp_path_factory.mktemp("swe-images")
    files = checkout_files(tmp / "checkout")
    store = tmp / "store"
    rows = []
    with oci_images.registry(tmp / "registry") as registry:
        builder = oci_images.image_builder(tmp_path_factory, tmp / "layout")
        for instance_id in instance_ids():
            name = f"raas-tests/{instance_id.replace('__', '_s_')}:base"
            ref = oci_images.build_and_push(builder, registry, name, files)
            pull = [sys.executable, "-m", "raas", "images", "pull", "--store", str(store)]
            subprocess.run([*pull, "--tls-verify=false", ref], check=True, timeout=600)
            statement = f"{instance_id}: mean() of [1, 2, 3] is 3, not 2."
            rows.append(row(instance_id=instance_id, image_name=ref, problem_statement=statement))
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield {"tmp": tmp, "store": store, "rows": rows, "rows_file": tmp / "rows.jsonl"}


def serve_and_run(pulled: dict[str, Any], fraction: float, name: str) -> list[RolloutResult]:
    """The rows through `raas serve` (sandboxes from the store) on an oracle that sabotages
    ``fraction`` of them."""
    tmp: Path = pulled["tmp"]
    oracle = Oracle(load_tokenizer("oracle"), fraction, 0, (pulled["rows_file"],))
    backend = ServerThread(oracle_app(oracle)).start()
    args = ["--llm", backend.url, "--tokenizer", "oracle", "--max-attempts", "2"]
    env = {"RAAS_IMAGE_STORE": str(pulled["store"])}
    server = ServerProcess(tmp / f"{name}.db", tmp / f"{name}.log", args, env=env)
    try:
        server.wait_ready()
        requests = [
            RolloutRequest.model_validate(
                {"instance": {**r, "data_source": "swe"}, "job_id": f"{name}-{i}"}
            )
            for i, r in enumerate(pulled["rows"])
        ]

        async def go() -> list[RolloutResult]:
            async with RolloutClient(server.url) as client:
                return await asyncio.wait_for(run_requests(client, requests), DEADLINE_S)

        return asyncio.run(go())
    finally:
        server.stop()
        backend.stop()


def described(result: RolloutResult) -> str:
    error = result.error.message[:400] if result.error else ""
    metrics = {k: v for k, v in result.metrics.items() if k != "artifact"}
    return f"{result.job_id}: {result.state} reward={result.reward} {error} {str(metrics)[:600]}"


def test_the_images_share_their_base_layer_in_the_store(pulled: dict[str, Any]) -> None:
    store = ImageStore(pulled["store"])
    images = [store.resolve(r["image_name"]) for r in pulled["rows"]]
    assert len({image.layers[0] for image in images}) == 1  # one base layer, unpacked once
    assert all(len(image.layers) == 2 for image in images)
    assert store.usage().share_ratio > 1.5


def test_gold_patches_resolve_by_swebench_rules(pulled: dict[str, Any]) -> None:
    results = serve_and_run(pulled, 0.0, "gold")
    for result in results:
        assert result.state == "done" and result.reward == 1.0, described(result)
        assert result.metrics["resolution"] == "RESOLVED_FULL", described(result)
        assert sorted(result.metrics["FAIL_TO_PASS"]["success"]) == sorted(FAIL_TO_PASS)
    assert no_sandbox_mounts(pulled["tmp"], pulled["store"])


def test_every_sabotage_scores_zero(pulled: dict[str, Any]) -> None:
    results = serve_and_run(pulled, 1.0, "sabotaged")
    for result in results:
        assert result.state == "done" and result.reward == 0.0, described(result)
        assert result.metrics["FAIL_TO_PASS"]["failure"], described(result)
    assert no_sandbox_mounts(pulled["tmp"], pulled["store"])


def no_sandbox_mounts(*roots: Path) -> bool:
    """No mount in this mount namespace lies under ``roots`` (the sandboxes mount in their own,
    gone with them)."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return not any(str(root) in line for root in roots for line in mounts)


def test_raas_run_runs_the_rows_as_they_come(pulled: dict[str, Any]) -> None:
    """`raas run ROWS --task swe`: SWE-Gym's rows name no data_source; the sandboxes start from
    the store that `raas images pull` filled."""
    tmp: Path = pulled["tmp"]
    oracle = Oracle(load_tokenizer("oracle"), 0.0, 0, (pulled["rows_file"],))
    backend = ServerThread(oracle_app(oracle)).start()
    out = tmp / "run" / "results.jsonl"
    command = [sys.executable, "-m", "raas", "run", str(pulled["rows_file"]), "--task", "swe"]
    command += ["--llm", backend.url, "--out", str(out)]
    env = {**os.environ, "RAAS_IMAGE_STORE": str(pulled["store"])}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    finally:
        backend.stop()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == len(pulled["rows"])
    assert all(r["state"] == "done" and r["reward"] == 1.0 for r in results), results
    assert "pass rate 3/3" in " ".join(done.stdout.split())


def test_a_killed_server_leaves_no_image_sandbox(pulled: dict[str, Any]) -> None:
    """SIGKILL to `raas serve` while a row's image sandbox runs (its model call held): every
    process of it ends, no mount of it is left, and the next server on the database takes its
    runtime directory and leaves nothing there."""
    tmp: Path = pulled["tmp"]
    held = AgentBackend(lambda prompt: "thinking", hold=lambda prompt: True)
    backend = ServerThread(held.app).start()
    db, args = tmp / "killed.db", ["--llm", backend.url, "--tokenizer", "tiny"]
    env = {"RAAS_IMAGE_STORE": str(pulled["store"])}
    server = ServerProcess(db, tmp / "killed.log", args, env=env)
    try:
        server.wait_ready()
        job = {"instance": {**pulled["rows"][0], "data_source": "swe"}, "job_id": "held"}
        assert httpx.post(f"{server.url}/v1/rollouts", json=job).status_code == 202
        assert held.holding.wait(DEADLINE_S), "the job never reached its model call"
        seen = {(p, start_time(p)) for p in descendants(server.proc.pid)}
        runtime = runtime_dir_of(runtime_key(db))
        killed_sandboxes = {d.name for d in runtime.iterdir() if d.is_dir()}
        assert killed_sandboxes, "no sandbox directory while the job runs"
        assert any(Path(f"/proc/{p}/comm").read_text().strip() == "bwrap" for p, _ in seen)
        server.proc.kill()
        server.proc.wait()
        deadline = time.monotonic() + DEADLINE_S
        while any(start_time(p) == started is not None for p, started in seen):
            assert time.monotonic() < deadline, "a process of the killed server lives on"
            time.sleep(0.05)
        assert no_sandbox_mounts(pulled["store"], runtime)
        again = ServerProcess(db, tmp / "again.log", args, env=env)  # claims the runtime dir
        try:
            again.wait_ready()
            # The job runs again there (a server restart is infra): only its new sandbox.
            left = {d.name for d in runtime.iterdir()} if runtime.exists() else set()
            assert not left & killed_sandboxes, sorted(runtime.rglob("*"))
        finally:
            held.release()  # the re-run's model call, so that the server stops at once
            again.stop()
    finally:
        held.release()
        server.stop()
        backend.stop()
