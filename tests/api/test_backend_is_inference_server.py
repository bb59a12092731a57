"""A backend URL that answers, but not as an inference server (another raas server, anything
whose /v1/models is no OpenAI model list), is refused at POST /v1/backends and
/add_llm_server, and at ``raas serve`` and ``raas run`` start, with one line saying what it is:
it was taken as healthy, and every job then failed with ``cannot list its models: 'data'``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi import FastAPI

from raas.api.app import create_app
from raas.cli import main
from raas.settings import validate
from tests.conftest import ApiClient
from tests.support.llm_servers import FakeBackend, ServerThread


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Real HTTP servers: a raas server, an app whose /v1/models is something else, and the
    fake model server the tests use (the control)."""
    other = FastAPI()
    other.get("/v1/models")(lambda: {"models": ["m"]})
    threads = {
        "raas": ServerThread(create_app(validate({"db": tmp_path / "other.db"}))),
        "other": ServerThread(other),
        "model": ServerThread(FakeBackend("vllm").app),
    }
    for thread in threads.values():
        thread.start()
    try:
        yield {name: thread.url for name, thread in threads.items()}
    finally:
        for thread in threads.values():
            thread.stop()


async def test_post_backends_refuses_a_url_that_is_no_inference_server(
    client: ApiClient, servers: dict[str, str]
) -> None:
    async with client() as http:
        said: dict[str, Any] = {}
        for name in ("raas", "other"):
            refused = await http.post("/v1/backends", json={"url": servers[name]})
            assert refused.status_code == 422, refused.text
            (error,) = refused.json()["detail"]
            assert error["loc"] == ["body", "url"] and error["type"] == "not_inference_server"
            said[name] = error["msg"]
        assert said["raas"] == (
            f"{servers['raas']} answers /v1/models without a model list: it is a raas server,"
            " not an inference server (give the URL of vLLM, SGLang or raas engine)"
        )
        assert said["other"] == (
            f"{servers['other']} answers /v1/models without a model list (200): it is not an"
            " inference server (vLLM, SGLang or raas engine; a raas server?)"
        )
        assert (await http.get("/v1/backends")).json() == []  # neither was added
        added = await http.post("/v1/backends", json={"url": servers["model"]})  # the control
        assert added.status_code == 201 and added.json()["healthy"], added.text
        listed = [b["url"] for b in (await http.get("/v1/backends")).json()]
        assert listed == [servers["model"]]


def test_raas_serve_refuses_a_raas_server_as_its_llm_before_starting(
    tmp_path: Path, servers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import raas.api.server

    started: list[object] = []
    monkeypatch.setattr(raas.api.server, "serve", started.append)
    argv = ["serve", "--db", str(tmp_path / "s.db"), "--tokenizer", "tiny", "--llm"]
    refused = CliRunner().invoke(main, [*argv, servers["raas"]])
    assert refused.exit_code == 2 and not started, refused.output
    last = " ".join(refused.output.split()).split("Error: ")[-1]
    assert last == (
        f"--llm {servers['raas']} answers /v1/models without a model list: it is a raas server,"
        " not an inference server (give the URL of vLLM, SGLang or raas engine)"
    )
    served = CliRunner().invoke(main, [*argv, servers["model"]])  # the control
    assert served.exit_code == 0 and len(started) == 1, served.output


async def test_add_llm_server_refuses_a_url_that_is_no_inference_server(
    client: ApiClient, servers: dict[str, str]
) -> None:
    # ProRL's route to the same pool: the same refusal, at its own field.
    async with client() as http:
        refused = await http.post("/add_llm_server", json={"address": servers["raas"]})
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["detail"]
        assert error["loc"] == ["body", "address"] and error["type"] == "not_inference_server"
        assert "it is a raas server" in error["msg"]
        assert (await http.get("/v1/backends")).json() == []
        added = await http.post("/add_llm_server", json={"address": servers["model"]})
        assert added.status_code == 200, added.text
        assert [b["url"] for b in (await http.get("/v1/backends")).json()] == [servers["model"]]


def test_raas_run_refuses_a_raas_server_as_its_llm_before_starting(
    tmp_path: Path, servers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import raas.run

    ran: list[object] = []

    async def run_tasks(*args: object, **kwargs: object) -> list[object]:
        ran.append(args)
        return []

    monkeypatch.setattr(raas.run, "run_tasks", run_tasks)
    monkeypatch.chdir(tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"data_source": "math", "problem": "1+1", "answer": "2"}\n')
    refused = CliRunner().invoke(main, ["run", str(tasks), "--llm", servers["raas"]])
    assert refused.exit_code == 2 and not ran, refused.output
    assert "it is a raas server, not an inference server" in " ".join(refused.output.split())
    assert not (tmp_path / "out").exists()  # no run folder for a run that never started
    CliRunner().invoke(main, ["run", str(tasks), "--llm", servers["model"]])  # the control
    assert len(ran) == 1
