"""A Harbor task named by its path through a real ``raas serve --harbor-roots`` with tenants:
accepted and kept inline, every tenant may name a task beneath the roots, and no tenant reads
anything else through a path (the server's database, its tenants file, another directory, a
link out): one answer for each. And a server without roots refuses a path, as its document
says (no job needs an image: a job that got as far as INIT fails there, on a store without
its image)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from raas.api.app import create_app
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.harbor.task import HarborTask
from tests.api.test_tenants import ADMIN, ALICE, BOB, auth, tenants_toml
from tests.support.probe import WAIT_S
from tests.tasks.test_harbor_paths import make_task

PATH_LOC = ["body", "instance", "path"]


def stored_instance(db: Path, key: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        store = ResultStore(db)
        await store.open()
        try:
            record = await store.get(key)
            assert record is not None
            return dict(record.request["instance"])
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_served_path_is_read_beneath_the_roots_and_nothing_else_is(
    tmp_path: Path, server_env: dict[str, str], start_server: Any
) -> None:
    root = tmp_path / "datasets"
    task = make_task(root / "hello")
    private = make_task(tmp_path / "private" / "secret-task", instruction="private\n")
    (root / "escape").symlink_to(private)
    (task / "environment" / "leak").symlink_to("/etc/passwd")
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(tenants_toml(alice=ALICE, bob=BOB))
    db = tmp_path / "served.db"
    server_env["RAAS_API_KEY"] = ADMIN
    args = ["--harbor-roots", str(root), "--tenants-file", str(tenants)]
    server = start_server(db, *args, "--image-store", str(tmp_path / "store"))

    def submit(key: str, path: str, job_id: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"instance": {"data_source": "harbor", "path": path}}
        if job_id is not None:
            body["job_id"] = job_id
        headers = {**auth(key), "content-type": "application/json"}
        content = json.dumps(body)  # escaped as ASCII: a lone surrogate travels as \\ud800
        return httpx.post(f"{server.url}/v1/rollouts", content=content, headers=headers, timeout=60)

    # A task whose content cannot travel (a link out of it): said, naming the file, not its target.
    refused = submit(ALICE, str(task))
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["detail"]
    assert error["loc"] == PATH_LOC and error["msg"].endswith(
        "environment/leak links outside the task"
    )
    (task / "environment" / "leak").unlink()

    # Control: each tenant may name the shared task; the job keeps the files as read.
    accepted = submit(ALICE, str(task), "h1")
    assert accepted.status_code == 202, accepted.text
    assert submit(BOB, f"{root}/hello/", "h1").status_code == 202
    assert submit(ALICE, str(task), "h1").status_code == 200  # the same job, resubmitted

    # Anything else: one answer, the same for what exists and what does not.
    others = [
        str(private),
        f"{root}/escape",
        f"{root}/../private/secret-task",
        str(db),
        str(tenants),
        "/etc/shadow",
        "/proc/self/environ",
        f"{root}/no-such-task",
        str(tmp_path / "no-such-dir"),
    ]
    said = set()
    for path in others:
        r = submit(BOB, path)
        assert r.status_code == 422, (path, r.text)
        (error,) = r.json()["detail"]
        assert error["loc"] == PATH_LOC
        said.add(error["msg"])
    assert len(said) == 1, said
    (text,) = said
    assert "private" not in text and str(db) not in text and str(root) in text
    assert submit(BOB, f"{root}/\ud800").status_code == 422  # the wire refuses it: no 500

    # Once the directory changes, the job it was read into stays as it was read.
    (task / "instruction.md").write_text("Something else.\n")
    assert submit(ALICE, str(task), "h1").status_code == 409
    done = httpx.get(
        f"{server.url}/v1/rollouts/h1", params={"wait": WAIT_S}, headers=auth(ALICE), timeout=90
    )
    result = done.json()["result"]
    assert result["error"]["type"] == "ImageNotStored", done.text  # it ran, as far as INIT

    document = httpx.get(f"{server.url}/openapi.json", headers=auth(ADMIN)).json()
    path_schema = document["components"]["schemas"]["Instance.harbor"]["properties"]["path"]
    assert path_schema["type"] == "string" and str(root) in path_schema["pattern"]

    server.stop()
    instance = stored_instance(db, "alice~h1")
    assert instance["path"] == str(task) and instance["name"] == "hello"
    assert instance["files"]["instruction.md"] == "Say hello.\n"
    assert "private" not in str(stored_instance(db, "bob~h1"))


async def test_a_server_without_roots_refuses_a_path_as_its_document_says(tmp_path: Path) -> None:
    registry = TaskRegistry()
    registry.register(HarborTask())
    task = make_task(tmp_path / "hello")
    served = create_app(ServeSettings(db=tmp_path / "api.db"), registry)
    async with served.router.lifespan_context(served):
        transport = httpx.ASGITransport(app=served)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            document = (await http.get("/openapi.json")).json()
            body = {"instance": {"data_source": "harbor", "path": str(task)}}
            r = await http.post("/v1/rollouts", json=body)
            batch = await http.post("/v1/rollouts:batch", json={"jobs": [body]})
    schema = document["components"]["schemas"]["Instance.harbor"]
    assert schema["properties"]["path"]["not"] == {}  # no path is admitted here
    assert "--harbor-roots" in schema["properties"]["path"]["description"]
    assert r.status_code == 422 and batch.status_code == 422
    (error,) = r.json()["detail"]
    assert error["loc"] == PATH_LOC and "reads no task directories" in error["msg"]
    assert batch.json()["detail"][0]["loc"] == ["body", "jobs", 0, "instance", "path"]
