"""``harbor``: a Harbor task (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``).

INIT makes the task's image sandbox (its ``docker_image`` from the image store, or its
``environment/`` built by ``raas.tasks.harbor.environment``), with the task's caps where they
are lower than the server's, starts the image's command in the background (a service the task
relies on) and waits for its healthcheck. RUN is raas's agent loop, told the instruction and
the image's working directory, for at most the task's agent timeout (then the verifier judges
what the agent left). EVAL runs the verifier outside the agent's reach (``raas.judge.harbor``):
a fork of the agent's files alone, the agent's sandbox closed first. ``tests/`` and
``solution/`` never enter the agent's sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from typing import Any

from raas.helpers.task_dirs import TASK_FILE
from raas.images.image import StoredImage
from raas.judge.harbor import (
    DEFAULT_PATH,
    VERIFIER_CARRY,
    VerifierRun,
    run_verifier,
    system_path,
)
from raas.sandbox import Sandbox, SandboxError
from raas.sandbox.egress import EgressPolicy
from raas.sandbox.proxy import metrics_of
from raas.sandbox.rootfs import image_env
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.harbor.config import HarborConfig, HealthcheckConfig
from raas.tasks.harbor.environment import task_image
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.harbor.network import NetworkRefused, exports, open_network, phase_policy
from raas.tasks.protocol import InvalidInstance, RewardInfo, TaskJob, parse_instance
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an agent in a Linux environment, in the task's working directory. Do the task you"
    " are given with the tools (bash, the editor). When it is done, call finish."
)
SERVICE_LOG = "/tmp/.raas-service.log"
# The image's command in a session of its own, and this exec's end only once it is there: the
# exec's process group is killed when it ends (raas.sandbox.inside.execute), and a service not
# yet out of it would go with it. The session is field 6 of /proc/PID/stat (4th after comm).
START_SERVICE = """setsid {line} >{log} 2>&1 </dev/null &
pid=$!
i=0
while [ "$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f4)" != "$pid" ]; do
  i=$((i+1))
  [ -e /proc/$pid ] && [ $i -lt 100000 ] || break
done"""


class HarborTask(AgentTask):
    name = "harbor"
    instance_model = HarborInstance
    tools = ("bash", "editor", "finish", "think")
    default_max_turns = 20

    def validate(self, job: TaskJob) -> None:
        """Besides the instance and params: the network the task asks for is one this
        server's ``egress_allow`` setting allows (InvalidInstance naming the task otherwise)."""
        super().validate(job)
        instance = parse_instance(HarborInstance, job.instance)
        allowed = allowed_egress(job)
        config = instance.config
        try:
            phase_policy(config.agent_network, allowed)
            phase_policy(config.verifier_network, allowed)
        except NetworkRefused as e:
            raise InvalidInstance(
                ("instance", "files", TASK_FILE), f"{instance.label}: {e}"
            ) from None

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        parsed = HarborInstance.model_validate(instance)
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": parsed.instruction},
        ]

    async def init(self, job: TaskJob) -> AgentContext:
        self.validate(job)
        if job.branch is not None:
            return await self.branch_context(job)
        instance = HarborInstance.model_validate(job.instance)
        services = self.services_of(job)
        ctx = AgentContext(job=job)
        async with self.cleaned_up_on_error(ctx):
            ref = await task_image(services, instance)
            ctx.sandbox = await services.sandbox(ref, instance.config.limits_update())
            ctx.closing.append(ctx.sandbox)
            await start_environment(ctx.sandbox, instance.config)
            await ctx.sandbox.bash(f"cd {shlex.quote(workdir_of(ctx.sandbox))}")
        return ctx

    async def run(self, context: Any) -> Trajectory:
        ctx: AgentContext = context
        config = HarborInstance.model_validate(ctx.job.instance).config
        if ctx.sandbox is not None:  # each job's own sandbox (a group's fork, a branch's too)
            await self.open_agent_network(ctx.sandbox, ctx.job, config)
        try:
            async with asyncio.timeout(config.agent.timeout_sec):
                return await super().run(ctx)
        except TimeoutError:
            # Harbor's rule: the agent's time is up, and what it left is judged.
            ctx.stop_reason = "agent_timeout"
            return ctx.trajectory

    async def open_agent_network(
        self, sandbox: Sandbox, job: TaskJob, config: HarborConfig
    ) -> None:
        """The proxy the agent's network asks for, and its variables exported in the agent's
        shell (nothing where it asks none, or where the sandbox has its proxy already)."""
        if sandbox.egress is not None:
            return
        services = self.services_of(job)
        env = await open_network(
            sandbox, config.agent_network, services.egress, services.egress_caps
        )
        if env:
            await sandbox.bash(exports(env))

    async def eval(self, context: Any, trajectory: Trajectory) -> RewardInfo:
        ctx: AgentContext = context
        instance = HarborInstance.model_validate(ctx.job.instance)
        if ctx.sandbox is None:
            return RewardInfo(0.0, {"verifier_error": "the agent had no sandbox"})
        agents = ctx.sandbox
        verifier = await agents.fork(carry=VERIFIER_CARRY)
        ctx.closing.append(verifier)
        await agents.close()  # nothing of the agent runs on while the verifier does
        config = instance.config
        # The service again, its programs found on the verifier's PATH, not the image's (an
        # image that puts /app/bin first would run the agent's python3 beside test.sh).
        await start_environment(verifier, config, system_path(image_path(verifier)))
        services = self.services_of(ctx.job)
        network = await open_network(
            verifier, config.verifier_network, services.egress, services.egress_caps
        )
        run = VerifierRun(
            tests=instance.under("tests"),
            env={**network, **config.verifier.env},
            timeout_s=config.verifier.timeout_sec,
            workdir=workdir_of(verifier),
            reward_key=instance.reward_key,
            path=image_path(verifier),
        )
        verdict = await run_verifier(verifier, run)
        metrics: dict[str, Any] = {**verdict.metrics, "rewards": verdict.rewards}
        metrics["stop_reason"] = ctx.stop_reason
        egress = {"agent": metrics_of(agents.egress), "verifier": metrics_of(verifier.egress)}
        if any(egress.values()):
            metrics["egress"] = {phase: said for phase, said in egress.items() if said}
        if instance.name:
            metrics["harbor_task"] = instance.name
        return RewardInfo(verdict.reward, metrics)


def allowed_egress(job: TaskJob) -> EgressPolicy:
    """The destinations the server allows a task (none where it has no services)."""
    services = job.services
    return services.egress if isinstance(services, TaskServices) else EgressPolicy()


def image_path(sandbox: Sandbox) -> str:
    """The image's PATH (its config's Env), else the verifier's default."""
    image = getattr(sandbox, "image", None)
    if not isinstance(image, StoredImage):
        return DEFAULT_PATH
    return image_env(image).get("PATH", DEFAULT_PATH)


def workdir_of(sandbox: Sandbox) -> str:
    """The image's WORKDIR (Harbor's tasks work and are judged there), else /."""
    image = getattr(sandbox, "image", None)
    workdir = getattr(image, "workdir", "") or "/"
    return str(workdir)


async def start_environment(
    sandbox: Sandbox, config: HarborConfig, path: str | None = None
) -> None:
    """The image's command started in the background, as a container of it would run it (a
    service the task relies on), then the task's healthcheck waited for; ``path``: the PATH
    both run with (a verifier's), else the sandbox's; the task's environment env may set it."""
    base = {} if path is None else {"PATH": path}
    image = getattr(sandbox, "image", None)
    command = tuple(getattr(image, "command", ()) or ())
    if command and not _is_a_shell(command):
        line = " ".join(shlex.quote(a) for a in command)
        started = await sandbox.exec(
            ["sh", "-c", START_SERVICE.format(line=line, log=SERVICE_LOG)],
            cwd=workdir_of(sandbox),
            env={**base, **config.environment.env},
        )
        if started.exit_code != 0:
            raise SandboxError(f"the image's command {line} did not start: {started.stderr}")
    if config.environment.healthcheck is not None:
        env = {**base, **config.environment.env} if base else None
        await wait_healthy(sandbox, config.environment.healthcheck, env)


def _is_a_shell(command: tuple[str, ...]) -> bool:
    """An image whose command is a bare shell (``/bin/bash``, base images' default) runs no
    service: a shell without a terminal would only exit."""
    return len(command) == 1 and command[0].rsplit("/", 1)[-1] in ("sh", "bash", "dash")


async def wait_healthy(
    sandbox: Sandbox, check: HealthcheckConfig, env: dict[str, str] | None = None
) -> None:
    """Run the healthcheck until it passes: every ``start_interval_sec`` during the start
    period (failures not counted), then every ``interval_sec`` until ``retries`` failures."""
    start = time.monotonic()
    failures = 0
    last = ""
    while True:
        result = await sandbox.exec(
            ["sh", "-c", check.command], env=env, timeout_s=check.timeout_sec
        )
        if result.exit_code == 0:
            return
        last = (result.stdout + result.stderr).strip()[-300:]
        in_start = time.monotonic() - start < check.start_period_sec
        if not in_start:
            failures += 1
            if failures >= check.retries:
                raise SandboxError(
                    f"the task's healthcheck failed {failures} times: {check.command}: {last}"
                )
        await asyncio.sleep(check.start_interval_sec if in_start else check.interval_sec)
