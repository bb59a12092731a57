"""A Harbor task that asks for the network: refused in one line naming the task and the setting
while the server allows none (the default), admitted with what the admin's ``egress_allow``
lists (narrowed to the task's allowed_hosts), and its agent's sandbox then reaches exactly
that through raas's proxy. The whole task with its verifier: tests/tasks/test_harbor_verifier.py
(images tier)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.sandbox import Sandbox
from raas.sandbox.egress import EgressPolicy
from raas.settings import validate as validate_settings
from raas.tasks import TaskRegistry
from raas.tasks.harbor.check import check_task
from raas.tasks.harbor.config import HarborConfig, NetworkAsk
from raas.tasks.harbor.network import NetworkRefused, phase_policy
from raas.tasks.harbor.task import HarborTask
from raas.tasks.harness import HarnessTask
from raas.tasks.protocol import InvalidInstance, TaskJob
from raas.tasks.services import TaskServices
from tests.sandbox import test_sandbox_exec
from tests.sandbox.test_proxy import echo_server
from tests.sandbox.test_sandbox_egress import CONNECT
from tests.tasks.test_harbor_instance import instance

sandbox = test_sandbox_exec.sandbox  # the fixture: a started bwrap sandbox

BASE = '[environment]\ndocker_image = "raas/no-such-image:1"\n'
ADMIN = EgressPolicy.parse(["pypi.org", "files.pythonhosted.org:443", "10.0.0.5:3128"])


def validate(toml: str, egress: EgressPolicy) -> None:
    services = TaskServices(llm=None, egress=egress)  # type: ignore[arg-type]
    HarborTask().validate(TaskJob("j", instance(toml), {}, services))


def refusal(toml: str, egress: EgressPolicy) -> InvalidInstance:
    with pytest.raises(InvalidInstance) as caught:
        validate(toml, egress)
    return caught.value


@pytest.mark.parametrize(
    "network",
    [
        "allow_internet = true\n",
        'network_mode = "public"\n',
        'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n',
        'allowed_hosts = ["pypi.org"]\n',
    ],
)
def test_a_task_asking_for_the_network_is_refused_while_the_server_allows_none(
    network: str,
) -> None:
    error = refusal(BASE + network, EgressPolicy())
    assert error.loc == ("instance", "files", "task.toml")
    assert "'hello'" in error.message and "egress_allow" in error.message
    validate(BASE + network, ADMIN)  # the control: an admin allows some destinations


@pytest.mark.parametrize(
    "sections",
    [
        '[agent]\nnetwork_mode = "public"\n',
        '[verifier]\nnetwork_mode = "public"\n',  # the verifier's own network is asking too
        '[verifier]\nallowed_hosts = ["pypi.org"]\n',
    ],
)
def test_a_phase_asking_for_the_network_is_asking(sections: str) -> None:
    assert "egress_allow" in refusal(BASE + sections, EgressPolicy()).message
    validate(BASE + sections, ADMIN)


def test_the_default_and_no_network_are_not_asking() -> None:
    # Harbor's allow_internet defaults to true; a task that does not say it runs offline here.
    for toml in [BASE, BASE + 'network_mode = "no-network"\n', BASE + "allow_internet = false\n"]:
        validate(toml, EgressPolicy())
        config = HarborConfig.from_toml(toml)
        assert not config.agent_network and not config.verifier_network


@pytest.mark.parametrize(
    ("hosts", "missing"),
    [
        ('["pypi.org", "github.com"]', "github.com"),  # a host the admin does not list
        ('["10.0.0.5:443"]', "10.0.0.5:443"),  # listed, but on another port
        ('["127.0.0.1:3128"]', "127.0.0.1:3128"),
        ('["pypi.org:80"]', "pypi.org:80"),
    ],
)
def test_an_allowlist_naming_a_host_the_admin_does_not_list_is_refused_naming_it(
    hosts: str, missing: str
) -> None:
    toml = BASE + f'network_mode = "allowlist"\nallowed_hosts = {hosts}\n'
    error = refusal(toml, ADMIN)
    assert f"asks for {missing}," in error.message and "'hello'" in error.message


@pytest.mark.parametrize(
    ("host", "said"),
    [("*.pythonhosted.org", "no wildcards"), ("user@pypi.org", "user info")],
)
def test_a_host_that_is_no_destination_is_refused_naming_it(host: str, said: str) -> None:
    toml = BASE + f'network_mode = "allowlist"\nallowed_hosts = ["{host}"]\n'
    error = refusal(toml, ADMIN)
    assert said in error.message and host in error.message


def test_an_allowlist_without_hosts_is_refused() -> None:
    error = refusal(BASE + 'network_mode = "allowlist"\n', ADMIN)
    assert "names no allowed_hosts" in error.message


def test_a_phase_gets_the_admins_list_or_its_own_hosts_of_it() -> None:
    assert phase_policy(NetworkAsk(public=True), ADMIN) == ADMIN
    narrowed = phase_policy(NetworkAsk(hosts=("PyPI.org",)), ADMIN)
    assert narrowed == EgressPolicy.parse(["pypi.org:443"])
    assert phase_policy(NetworkAsk(), ADMIN) == EgressPolicy()  # asks none: gets none
    with pytest.raises(NetworkRefused):
        phase_policy(NetworkAsk(public=True), EgressPolicy())


async def test_the_agents_shell_reaches_only_the_tasks_hosts_of_the_admins_list(
    sandbox: Sandbox,
) -> None:
    async with echo_server() as echo, echo_server() as other:
        # The admin lists both; the task names one of them.
        services = TaskServices(
            llm=None,  # type: ignore[arg-type]
            egress=EgressPolicy.parse([echo.address, other.address]),
        )
        toml = BASE + f'network_mode = "allowlist"\nallowed_hosts = ["{echo.address}"]\n'
        job = TaskJob("j", instance(toml), {}, services)
        await HarborTask().open_agent_network(sandbox, job, HarborConfig.from_toml(toml))
        await sandbox.write_file("/tmp/connect.py", CONNECT)
        script = 'python3 /tmp/connect.py "${HTTPS_PROXY##*:}"'
        allowed = await sandbox.bash(f"{script} {echo.address} ping")
        assert allowed.output == "HTTP/1.1 200 Connection established\nping\n"
        refused = await sandbox.bash(f"{script} {other.address} ping")
        assert refused.output == "HTTP/1.1 403 Forbidden\n"
        assert (echo.connections, other.connections) == (1, 0)
        env = await sandbox.bash("echo $https_proxy $NO_PROXY")
        assert env.output.startswith("http://127.0.0.1:") and "localhost" in env.output


async def test_an_agent_that_asks_none_gets_no_proxy(sandbox: Sandbox) -> None:
    services = TaskServices(llm=None, egress=ADMIN)  # type: ignore[arg-type]
    job = TaskJob("j", instance(BASE), {}, services)
    await HarborTask().open_agent_network(sandbox, job, HarborConfig.from_toml(BASE))
    assert sandbox.egress is None
    assert (await sandbox.bash("echo x${HTTPS_PROXY}x")).output == "xx\n"


@pytest.mark.parametrize(("allowed", "status"), [([], 422), (["pypi.org"], 202)])
async def test_submission_follows_the_servers_setting(
    tmp_path: Path, allowed: list[str], status: int
) -> None:
    registry = TaskRegistry()
    registry.register(HarborTask())
    settings = validate_settings(
        {"db": tmp_path / "api.db", "egress_allow": allowed, "max_attempts": 1}
    )
    app = create_app(settings, registry)
    body: dict[str, Any] = {"instance": instance(BASE + "allow_internet = true\n")}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            answer = await http.post("/v1/rollouts", json=body)
            assert answer.status_code == status, answer.text
            if status == 422:
                detail = answer.json()["detail"][0]
                assert detail["loc"] == ["body", "instance", "files", "task.toml"]
                assert "egress_allow" in detail["msg"]
                return
            job = answer.json()["job_id"]
            for _ in range(600):  # it fails in INIT (no such image), which ends the test
                result = (await http.get(f"/v1/rollouts/{job}")).json()
                if result["result"] is not None:
                    break
                await asyncio.sleep(0.1)
            assert "no-such-image" in str(result), result


async def test_a_dataset_check_reports_a_task_asking_for_the_network_naming_the_setting() -> None:
    # `raas datasets check` allows no egress: a task that asks is a line, not a crash.
    toml = BASE + "allow_internet = true\n"
    services = TaskServices(llm=None)  # type: ignore[arg-type]
    check = await check_task(services, instance(toml))
    assert check.verdict == "broken" and "egress_allow" in str(check.error)
    offline = await check_task(services, instance(toml.replace("true", "false")))
    assert "no-such-image" in str(offline.error)  # the control: it got as far as the image


def test_a_harness_agent_gets_no_network_so_a_task_asking_one_for_it_is_refused() -> None:
    """A harness agent's program is given no proxy: a task whose agent asks for the network is
    refused for it (not run offline unsaid) even where the admin allows that network; the
    control: its verifier's network, which raas opens itself, is admitted."""
    services = TaskServices(llm=None, egress=ADMIN)  # type: ignore[arg-type]
    harness = {"judge": "harbor", "agent": "reference"}
    agent_asks = instance(BASE + 'network_mode = "public"\n')
    with pytest.raises(InvalidInstance) as caught:
        HarnessTask().validate(TaskJob("j", {**agent_asks, **harness}, {}, services))
    assert "an agent program raas did not write does not get yet" in caught.value.message
    assert caught.value.field == "instance.files.task.toml"
    HarborTask().validate(TaskJob("j", agent_asks, {}, services))  # raas's own loop: admitted
    verifier_asks = instance(BASE + '[verifier]\nnetwork_mode = "public"\n')
    HarnessTask().validate(TaskJob("j", {**verifier_asks, **harness}, {}, services))
