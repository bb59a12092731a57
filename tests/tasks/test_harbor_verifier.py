"""A Harbor task end to end on a real image built with buildah: a no-op agent scores 0, the gold
solution 1, and the tricks that pay under a verifier run in the agent's own runtime (a daemon
left running, a program planted first on the image's PATH, a planted reward file, a replaced
system program) score 0 beside their control. The images tier (``make test-images``)."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from raas.images.store import ImageStore
from raas.sandbox import BwrapConfig
from raas.sandbox.egress import EgressPolicy
from raas.settings import TaskSettings
from raas.tasks.agentic import AgentContext
from raas.tasks.datasets import HARBOR_DIR, harbor_tasks
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.harbor.task import HarborTask
from raas.tasks.protocol import RewardInfo, Submission, TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory
from tests.support import tiers
from tests.support.oci_images import (
    base_rootfs,
    image_builder,
    registry,
    require_tools,
    run_tool,
)

pytestmark = pytest.mark.images

BASE = "raas/harbor-base:bookworm"
DOCKERFILE = f"""FROM {BASE}
WORKDIR /app
COPY data.txt /app/data.txt
RUN mkdir -p /app/bin /app/logs && ln -s /app/logs /logs
ENV PATH=/app/bin:/usr/local/bin:/usr/bin:/bin
"""
CHECK = """import json, pathlib
want = sum(int(x) for x in pathlib.Path("/app/data.txt").read_text().split())
answer = pathlib.Path("/app/answer.txt")
ok = answer.is_file() and answer.read_text().strip() == str(want)
print(json.dumps({"reward": int(ok), "exists": int(answer.is_file())}))
"""
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
python3 /tests/check.py > /tmp/reward.json && cp /tmp/reward.json /logs/verifier/
"""
SOLVE_SH = """#!/bin/bash
python3 -c "print(sum(int(x) for x in open('/app/data.txt').read().split()))" > /app/answer.txt
"""
TOML = """schema_version = "1.1"
[task]
name = "raas/sum"
[verifier]
timeout_sec = 60.0
[environment]
cpus = 1
memory_mb = 1024
storage_mb = 512
"""


def instance() -> dict[str, Any]:
    return {
        "data_source": "harbor",
        "name": "sum",
        "files": {
            "task.toml": TOML,
            "instruction.md": "Write the sum of the numbers in /app/data.txt to /app/answer.txt.\n",
            "environment/Dockerfile": DOCKERFILE,
            "environment/data.txt": "3 4\n5\n",
            "tests/test.sh": TEST_SH,
            "tests/check.py": CHECK,
            "solution/solve.sh": SOLVE_SH,
        },
        "executable": ["tests/test.sh", "solution/solve.sh"],
    }


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TaskServices]:
    require_tools()
    if shutil.which("buildah") is None:
        why = "the Harbor tests build with buildah: scripts/install-system-deps.sh"
        if tiers.selected("images"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    rootfs = base_rootfs()
    work = tmp_path_factory.mktemp("harbor-run")
    builder = image_builder(tmp_path_factory, work / "layout", rootfs)
    tag = builder.base_of(rootfs)
    single = work / "base-layout"
    subprocess.run(
        ["skopeo", "copy", "--quiet", f"oci:{builder.layout}:{tag}", f"oci:{single}:base"],
        check=True,
        timeout=300,
    )
    store = ImageStore(work / "store")
    store.import_(single, BASE)
    config = BwrapConfig(image_store=work / "store")
    yield TaskServices(llm=None, sandbox_config=config, image_store=store)  # type: ignore[arg-type]


@pytest.fixture
async def task() -> AsyncIterator[HarborTask]:
    yield HarborTask()


async def scored(
    services: TaskServices, agent: str | None, task_instance: dict[str, Any] | None = None
) -> RewardInfo:
    """The task's reward after ``agent`` (bash run in the agent's sandbox, or nothing)."""
    task = HarborTask()
    inst = task_instance or instance()
    job = TaskJob(job_id="j", instance=inst, sampling_params={}, services=services)
    ctx = await task.init(job)
    assert isinstance(ctx, AgentContext) and ctx.sandbox is not None
    try:
        if agent is not None:
            done = await ctx.sandbox.bash(agent, timeout_s=60)
            assert done.exit_code == 0, done.output
        return await task.eval(ctx, Trajectory())
    finally:
        await task.cleanup(ctx)


def solve() -> str:
    return SOLVE_SH.split("\n", 1)[1].strip()


async def test_the_gold_solution_scores_one_and_a_no_op_zero(services: TaskServices) -> None:
    gold = await scored(services, solve())
    assert gold.reward == 1.0, gold.metrics
    assert gold.metrics["rewards"] == {"reward": 1.0, "exists": 1.0}  # reward.json's names kept
    noop = await scored(services, None)
    assert noop.reward == 0.0 and noop.metrics["rewards"] == {"reward": 0.0, "exists": 0.0}


async def test_the_agent_never_sees_the_tests_or_the_solution(services: TaskServices) -> None:
    looked = "ls /tests /solution 2>&1; grep -rl check.py / --exclude-dir=proc 2>/dev/null | head"
    task = HarborTask()
    job = TaskJob(job_id="j", instance=instance(), sampling_params={}, services=services)
    ctx = await task.init(job)
    assert isinstance(ctx, AgentContext) and ctx.sandbox is not None
    try:
        seen = await ctx.sandbox.bash(looked, timeout_s=120)
    finally:
        await task.cleanup(ctx)
    assert "No such file" in seen.output and "check.py" not in seen.output.replace("ls", "")


async def test_a_daemon_left_running_does_not_reach_the_verifier(services: TaskServices) -> None:
    # Waits for the verifier's check and writes the answer it wants just in time: under a
    # verifier run in the agent's runtime, it scores; here nothing of the agent runs on.
    daemon = (
        "nohup sh -c 'while :; do [ -e /tests/check.py ] && echo 12 > /app/answer.txt;"
        " sleep 0.01; done' >/dev/null 2>&1 & disown; echo 0 > /app/answer.txt"
    )
    assert (await scored(services, daemon)).reward == 0.0
    control = daemon.replace("echo 0 >", "echo 12 >")  # the same daemon, the right answer
    assert (await scored(services, control)).reward == 1.0


async def test_a_program_planted_first_on_the_images_path_is_not_run(
    services: TaskServices,
) -> None:
    # The image puts /app/bin (the agent's) first on PATH: a fake python3 there would print
    # the verifier a passing reward.
    fake = (
        'printf \'#!/bin/sh\\necho {\\"reward\\": 1, \\"exists\\": 1}\\n\' > /app/bin/python3;'
        " chmod +x /app/bin/python3"
    )
    assert (await scored(services, fake)).reward == 0.0
    assert (await scored(services, solve() + "; " + fake)).reward == 1.0


async def test_a_planted_reward_file_is_not_read(services: TaskServices) -> None:
    # /logs is a link into /app in this image: the agent can write the verifier's file there.
    reward = '{"reward": 1, "exists": 1}'
    plant = f"mkdir -p /logs/verifier && echo '{reward}' > /logs/verifier/reward.json"
    breaks = plant + " && rm /app/data.txt"  # the check then crashes and writes nothing
    planted = await scored(services, breaks)
    assert planted.reward == 0.0 and "verifier_error" in planted.metrics
    assert (await scored(services, plant + "; " + solve())).reward == 1.0


async def test_changes_to_system_directories_do_not_reach_the_verifier(
    services: TaskServices,
) -> None:
    # A rootless raas gives the agent the image's files: one that replaces python3 would run
    # in the verifier. As root, the host writes it into the sandbox's upper layer the same way.
    task = HarborTask()
    job = TaskJob(job_id="j", instance=instance(), sampling_params={}, services=services)
    ctx = await task.init(job)
    assert isinstance(ctx, AgentContext) and ctx.sandbox is not None
    try:
        pid = next(iter(ctx.sandbox.host_pids()))
        fake = Path(f"/proc/{pid}/root/usr/bin/python3")
        await asyncio.to_thread(fake.unlink)
        await asyncio.to_thread(fake.write_text, "#!/bin/sh\necho '{\"reward\": 1}'\n")
        fake.chmod(0o755)
        seen = await ctx.sandbox.exec(["python3", "-c", "print(1)"])
        assert '{"reward": 1}' in seen.stdout  # the agent's sandbox runs the replacement
        info = await task.eval(ctx, Trajectory())
    finally:
        await task.cleanup(ctx)
    assert info.reward == 0.0 and info.metrics["rewards"]["exists"] == 0.0


@pytest.mark.parametrize("name", [t["name"] for t in harbor_tasks()])
async def test_each_shipped_task_scores_its_gold_one_and_a_no_op_zero(
    services: TaskServices, name: str
) -> None:
    (shipped,) = [t for t in harbor_tasks() if t["name"] == name]
    HarborInstance.model_validate(shipped)  # as submission reads it
    solve_sh = shipped["files"]["solution/solve.sh"]
    # The gold policy: solve.sh written where the agent works and run there (the oracle).
    gold = f"cat > /tmp/solve.sh <<'RAAS_EOF'\n{solve_sh}\nRAAS_EOF\nbash /tmp/solve.sh"
    assert (await scored(services, gold, shipped)).reward == 1.0
    assert (await scored(services, None, shipped)).reward == 0.0


async def test_a_shipped_task_named_by_its_path_runs_as_read(services: TaskServices) -> None:
    """The path form end to end: the task read beneath a root at submission (``prepare``),
    then run from what was read; its result says where it was read."""
    path = str(HARBOR_DIR / "create-file")
    rooted = TaskServices(
        llm=None,  # type: ignore[arg-type]
        sandbox_config=services.sandbox_config,
        tasks=TaskSettings(harbor_roots=[HARBOR_DIR]),
    )
    try:
        given = {"data_source": "harbor", "path": path}
        read = await HarborTask().prepare(given, Submission(rooted, 1 << 30))
    finally:
        await rooted.close()
    solve_sh = read["files"]["solution/solve.sh"]
    gold = f"cat > /tmp/solve.sh <<'RAAS_EOF'\n{solve_sh}\nRAAS_EOF\nbash /tmp/solve.sh"
    info = await scored(services, gold, read)
    assert info.reward == 1.0 and info.metrics["harbor_path"] == path
    assert info.metrics["harbor_task"] == "create-file"


async def test_a_prebuilt_image_pulled_from_a_registry_runs_the_task(
    services: TaskServices, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # task.toml's docker_image instead of a Dockerfile: the image is pulled into the store
    # first (raas images pull), here from a registry on 127.0.0.1.
    builder = image_builder(tmp_path_factory, tmp_path / "layout")
    files = {"/app/data.txt": "3 4\n5\n"}
    with registry(tmp_path) as reg:
        tag = builder.image("sum", builder.base_of(base_rootfs()), files)
        layout = f"{builder.layout}:{tag}"
        run_tool("umoci", "config", "--image", layout, "--config.workingdir", "/app")
        ref = builder.push(tag, reg, "harbor/sum:v1")
        store = services.image_store
        assert isinstance(store, ImageStore)
        pulled = await asyncio.to_thread(store.pull, ref, tls_verify=False)
    prebuilt = instance()
    del prebuilt["files"]["environment/Dockerfile"], prebuilt["files"]["environment/data.txt"]
    toml = TOML.replace("[environment]\n", f'[environment]\ndocker_image = "{pulled.ref}"\n')
    prebuilt["files"]["task.toml"] = toml
    assert (await scored(services, solve(), prebuilt)).reward == 1.0
    assert (await scored(services, None, prebuilt)).reward == 0.0


async def test_a_fork_of_the_tasks_sandbox_starts_its_service_again(
    services: TaskServices,
) -> None:
    # A group's jobs run from forks of one INIT: a fork carries files, not the service.
    (shipped,) = [t for t in harbor_tasks() if t["name"] == "service-query"]
    task = HarborTask()
    template = await task.init(TaskJob("t", shipped, {}, services))
    try:
        ctx = await task.fork_context(template, TaskJob("j", shipped, {}, services))
        assert ctx.sandbox is not None and ctx.sandbox is not template.sandbox
        try:
            asked = await ctx.sandbox.bash(
                "python3 -c 'import urllib.request as u;"
                ' print(u.urlopen("http://127.0.0.1:8080/categories", timeout=5).status)\'; pwd',
                timeout_s=60,
            )
        finally:
            await task.cleanup(ctx)
    finally:
        await task.cleanup(template)
    assert asked.output.split() == ["200", "/app"], asked.output  # and its shell where it was


# Through the phase's proxy (HTTPS_PROXY), a CONNECT tunnel to 127.0.0.1:PORT, and one GET in it.
FETCH = """import http.client, os, sys
proxy = int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])
conn = http.client.HTTPConnection("127.0.0.1", proxy, timeout=60)
conn.set_tunnel("127.0.0.1", int(sys.argv[1]))
conn.request("GET", "/numbers")
print(conn.getresponse().read().decode())
"""


async def numbers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An HTTP server on the host's loopback: the numbers the task sums."""
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    body = b"20 22\n"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    writer.close()


async def test_a_task_allowed_the_network_reaches_the_admins_host_in_both_phases(
    services: TaskServices,
) -> None:
    """The agent and the verifier each get a proxy of their own, to the one host the task names
    and the admin lists; without the network the same agent scores 0 (the control)."""
    server = await asyncio.start_server(numbers, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    check = f"""import json, pathlib, subprocess
got = subprocess.run(["python3", "/tests/fetch.py", "{port}"], capture_output=True, text=True)
want = sum(int(x) for x in got.stdout.split()) if got.returncode == 0 else None
answer = pathlib.Path("/app/answer.txt")
ok = want is not None and answer.is_file() and answer.read_text().strip() == str(want)
print(json.dumps({{"reward": int(ok), "exists": int(answer.is_file())}}))
"""
    hosts = f'network_mode = "allowlist"\nallowed_hosts = ["127.0.0.1:{port}"]\n'
    task_instance = instance()
    files = task_instance["files"]
    files["task.toml"] = TOML.replace("[verifier]\n", f"[verifier]\n{hosts}") + hosts
    files["tests/check.py"], files["tests/fetch.py"] = check, FETCH
    agent = (
        f"cat > /tmp/fetch.py <<'EOF'\n{FETCH}EOF\n"
        f"python3 /tmp/fetch.py {port} | python3 -c"
        " 'import sys; print(sum(int(x) for x in sys.stdin.read().split()))' > /app/answer.txt"
    )
    allowed = dataclasses.replace(services, egress=EgressPolicy.parse([f"127.0.0.1:{port}"]))
    task = HarborTask()
    async with server:
        for network in (True, False):
            job = TaskJob(job_id="j", instance=task_instance, sampling_params={}, services=allowed)
            ctx = await task.init(job)
            assert isinstance(ctx, AgentContext) and ctx.sandbox is not None
            try:
                if network:  # what RUN does before the agent's first turn
                    config = HarborInstance.model_validate(task_instance).config
                    await task.open_agent_network(ctx.sandbox, job, config)
                await ctx.sandbox.bash(agent, timeout_s=120)
                info = await task.eval(ctx, Trajectory())
            finally:
                await task.cleanup(ctx)
            if network:
                assert info.reward == 1.0, info.metrics
                egress = info.metrics["egress"]
                assert egress["agent"]["tunnels"] == egress["verifier"]["tunnels"] == 1
            else:
                assert info.reward == 0.0 and "agent" not in info.metrics["egress"]
