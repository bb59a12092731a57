"""``raas.tasks.services``: what the service gives every task (sandboxes with binds of a task's
own, a build's cgroup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raas.sandbox import BwrapConfig, LocalConfig, SandboxError, SandboxLimits, cgroups
from raas.tasks.services import TaskServices, with_binds


class NoLLM:
    async def generate(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("no model call here")


def test_an_agent_programs_binds_join_the_servers_and_a_local_sandbox_takes_none() -> None:
    server = BwrapConfig(ro_binds={"/opt/data": "/.raas/data"})
    joined = with_binds(server, {"/srv/agent": "/.raas/agents"})
    assert joined.ro_binds == {"/opt/data": "/.raas/data", "/srv/agent": "/.raas/agents"}
    assert with_binds(LocalConfig(), {}) == LocalConfig()
    with pytest.raises(SandboxError, match="binds nothing in"):
        with_binds(LocalConfig(), {"/srv/agent": "/.raas/agents"})


def _value(procs: list[Path], controller: str, name: str) -> str:
    found = cgroups.hierarchy()
    assert found is not None
    (directory,) = [p.parent for p in procs if found.bases[controller] in p.parents]
    return (directory / name).read_text().strip()


async def test_a_builds_cgroup_holds_the_sandbox_caps_narrowed_by_the_task(
    tmp_path: Path,
) -> None:
    found = cgroups.hierarchy()
    if found is None or found.version != 1:
        pytest.skip("needs cgroup v1 hierarchies raas can write (root)")
    limits = SandboxLimits(sandbox_memory_bytes=1 << 30, sandbox_tasks=500)
    config = BwrapConfig(limits=limits, runtime_dir=tmp_path)
    services = TaskServices(llm=NoLLM(), sandbox_config=config)  # type: ignore[arg-type]
    # the task narrows memory, and asks in vain for more processes than the server's
    async with services.build_cgroup(
        {"sandbox_memory_bytes": 256 << 20, "sandbox_tasks": 9999}
    ) as procs:
        assert procs and all(p.exists() for p in procs)
        assert _value(procs, "memory", "memory.limit_in_bytes") == str(256 << 20)
        assert _value(procs, "pids", "pids.max") == "500"
        directories = [p.parent for p in procs]
    assert not any(d.exists() for d in directories)  # removed on the way out
