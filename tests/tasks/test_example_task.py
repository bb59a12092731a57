"""The README's example task (examples/my_task): its entry point names a handler that registers,
and raas serve runs it end to end over HTTP: a bwrap sandbox holding the log, the task's own
tool called by a model (a scripted vLLM-protocol server), the judge in both directions."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.agent.tools import select_tools
from raas.api.app import create_app
from raas.settings import ServeSettings
from raas.tasks import TaskHandler, TaskRegistry
from raas.tasks.agentic import AgentTask
from raas.tasks.countdown import CountdownTask
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call

EXAMPLE = Path(__file__).parents[2] / "examples" / "my_task"
TASKS = [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines()]


def entry_points() -> list[EntryPoint]:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["raas.tasks"]
    return [EntryPoint(name, value, "raas.tasks") for name, value in group.items()]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> TaskRegistry:
    """A registry built as raas builds it from installed entry points, from the example's
    pyproject.toml (the module importable as the installed package makes it)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    reg = TaskRegistry()
    for ep in entry_points():
        obj = ep.load()
        reg.register(obj() if isinstance(obj, type) else obj, name=ep.name)
    reg.register(CountdownTask())
    return reg


def test_the_entry_point_registers_an_agent_task_with_its_own_tool(registry: TaskRegistry) -> None:
    assert [ep.name for ep in entry_points()] == ["log_count"]
    handler = registry.get("log_count")
    assert isinstance(handler, TaskHandler) and isinstance(handler, AgentTask)
    assert list(select_tools(handler.tools)) == ["bash", "count_lines", "finish"]


def model(prompt: str) -> str:
    """Counts with the task's tool, then answers what it said (one too many for 'timeout')."""
    if "count_lines" not in prompt.split("<|im_start|>user", 1)[1]:
        return call("count_lines", path="/workspace/app.log", text=_asked(prompt))
    counted = int(re.findall(r"\d+", prompt.rsplit("count_lines", 1)[1])[-1])
    return call("finish", answer=str(counted + (_asked(prompt) == "timeout")))


def _asked(prompt: str) -> str:
    found = re.search(r"contain '([^']*)'", prompt)
    assert found, prompt
    return found.group(1)


@pytest.fixture
def service(registry: TaskRegistry, tmp_path: Path) -> Iterator[str]:
    backend = ServerThread(AgentBackend(model).app).start()
    settings = ServeSettings(db=tmp_path / "raas.db", llm=[backend.url], tokenizer="tiny")
    server = ServerThread(create_app(settings, registry)).start()
    yield server.url
    server.stop()
    backend.stop()


def rollout(url: str, instance: dict[str, Any]) -> dict[str, Any]:
    job_id = instance["instance_id"]
    r = httpx.post(f"{url}/v1/rollouts", json={"instance": instance, "job_id": job_id})
    assert r.status_code == 202, r.text
    got = httpx.get(f"{url}/v1/rollouts/{job_id}", params={"wait": 60}, timeout=70).json()
    assert got["result"] is not None, got
    return dict(got["result"])


def test_the_example_runs_end_to_end(service: str) -> None:
    errors, timeouts = (rollout(service, task) for task in TASKS)
    assert errors["state"] == "done" and errors["task"] == "log_count", errors
    turns = errors["trajectory"]["turns"]
    assert [c["name"] for t in turns for c in t["tool_calls"]] == ["count_lines", "finish"]
    tool_messages = [m for m in errors["trajectory"]["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["name"] == "count_lines" and tool_messages[0]["content"] == "2"
    assert errors["reward"] == 1.0
    assert errors["metrics"]["artifact"] == {"answer": "2"}
    assert errors["metrics"]["truth"] == 2 and "reason" not in errors["metrics"]
    # the model counted 1 and answered 2: the judge says no, and why
    assert (timeouts["state"], timeouts["reward"], timeouts["metrics"]["truth"]) == ("done", 0.0, 1)
    assert timeouts["metrics"]["reason"] == "answer read: 2, expected 1"


def test_a_bad_instance_is_refused_naming_the_field(service: str) -> None:
    instance = {"data_source": "log_count", "log": "ERROR x\n", "pattern": 3}
    r = httpx.post(f"{service}/v1/rollouts", json={"instance": instance})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "instance", "pattern"]


def test_tools_are_checked_where_a_task_is_defined() -> None:
    class Shout:
        name = "shout"
        description = "Say it louder."
        parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

        async def __call__(self, args: dict[str, Any], sandbox: Any) -> Any:
            raise NotImplementedError

    assert list(select_tools(["finish", Shout()])) == ["finish", "shout"]
    with pytest.raises(ValueError, match=r"unknown tools \['shell'\]"):
        select_tools(["shell", "finish"])
    with pytest.raises(ValueError, match="two tools are named 'shout'"):
        select_tools([Shout(), Shout()])
    with pytest.raises(TypeError, match="is not a tool"):

        class Broken(AgentTask):
            tools = ("finish", object())
