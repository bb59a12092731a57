"""What the service gives every task: here, the sandboxes a task asks for with binds of its own."""

from __future__ import annotations

import pytest

from raas.sandbox import BwrapConfig, LocalConfig, SandboxError
from raas.tasks.services import with_binds


def test_an_agent_programs_binds_join_the_servers_and_a_local_sandbox_takes_none() -> None:
    server = BwrapConfig(ro_binds={"/opt/data": "/.raas/data"})
    joined = with_binds(server, {"/srv/agent": "/.raas/agents"})
    assert joined.ro_binds == {"/opt/data": "/.raas/data", "/srv/agent": "/.raas/agents"}
    assert with_binds(LocalConfig(), {}) == LocalConfig()
    with pytest.raises(SandboxError, match="binds nothing in"):
        with_binds(LocalConfig(), {"/srv/agent": "/.raas/agents"})
