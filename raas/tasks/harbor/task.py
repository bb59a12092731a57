"""``harbor``: a Harbor task (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``).

INIT makes the task's image sandbox (its ``docker_image`` from the image store, or its
``environment/`` built by ``raas.tasks.harbor.environment``), with the task's caps where they
are lower than the server's, starts the image's command in the background (a service the task
relies on) and waits for its healthcheck. RUN is raas's agent loop, told the instruction and
the image's working directory, for at most the task's agent timeout (then the verifier judges
what the agent left). EVAL runs the verifier outside the agent's reach (``raas.judge.harbor``):
a fork of the agent's files alone, the agent's sandbox closed first. ``tests/`` and
``solution/`` never enter the agent's sandbox. Where ``tests/`` holds Python test files, that
fork is kept frozen and every verifier run is a fork of it: the real one, then twins of the
tests (``raas.judge.harbor_twins``), calibrated by the gold solution run in a sandbox of its own.
A fork of the sandbox (a group's job, a branch)
starts the image's command again: a fork carries no process.

A harness job (``raas.tasks.harness``, ``"judge": "harbor"``) runs an agent program raas did not
write instead of the loop: it gets the same sandbox (``agent_sandbox``, with the program's files
bound in), works in the same directory for at most the same time, and is judged by this EVAL.

At submission (``prepare``), an instance that names its task by ``path`` instead of ``files``
is read from that directory, which must lie beneath the server's Harbor roots
(``TaskServices.read_task_dir``), into the inline form the job keeps and runs, ``path`` kept
beside the files.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from raas.helpers.task_dirs import TASK_FILE, TaskDirError
from raas.images.image import StoredImage
from raas.judge.harbor import (
    DEFAULT_PATH,
    HarborVerdict,
    VerifierRun,
    run_verifier,
    system_path,
    verifier_carry,
)
from raas.judge.harbor_twins import GoldRuns, Tests, named_as_tests, verify_with_twins
from raas.judge.reasons import REASON
from raas.judge.twins import task_key
from raas.sandbox import ForkCarry, Sandbox, SandboxError
from raas.sandbox.egress import EgressPolicy
from raas.sandbox.proxy import metrics_of
from raas.sandbox.rootfs import image_env
from raas.settings import TaskSettings
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.harbor.config import HarborConfig, HealthcheckConfig
from raas.tasks.harbor.environment import task_image
from raas.tasks.harbor.instance import FILES_OR_PATH, HarborInstance, document_path_form
from raas.tasks.harbor.network import NetworkRefused, exports, open_network, phase_policy
from raas.tasks.protocol import InvalidInstance, RewardInfo, Submission, TaskJob, parse_instance
from raas.tasks.services import NoTaskRoots, TaskServices
from raas.wire import Trajectory

log = logging.getLogger(__name__)
# Where ``verify`` puts the verifier's proxy figures, which EVAL moves under ``egress``.
VERIFIER_EGRESS = "verifier_egress"

SYSTEM_PROMPT = (
    "You are an agent in a Linux environment, in the task's working directory. Do the task you"
    " are given with the tools (bash, the editor). When it is done, call finish."
)
SERVICE_LOG = "/tmp/.raas-service.log"
SOLVE_TIMEOUT_S = 600.0  # solution/solve.sh, run as the gold policy
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

    async def prepare(self, instance: dict[str, Any], submission: Submission) -> dict[str, Any]:
        """A path-form instance read into its files (the inline form, ``path`` kept beside
        them); any other as it is. A directory many jobs of the submission name is read once,
        and each job counts its bytes against ``submission.bytes_left``."""
        if "path" not in instance:
            return instance
        beside = [key for key in FILES_OR_PATH if key in instance]
        if beside:
            raise InvalidInstance(
                ("instance", beside[0]),
                "given beside path: a Harbor task comes inline (files) or by its directory's"
                " path, which the server reads into files, not both",
            )
        path = instance["path"]
        if not isinstance(path, str):
            raise InvalidInstance(
                ("instance", "path"), "Input should be a valid string", "string_type"
            )
        services = submission.services
        read = submission.memo.get(("harbor", path))
        if read is None:
            try:
                if not isinstance(services, TaskServices):
                    raise NoTaskRoots()
                files = await services.read_task_dir(path)
            except TaskDirError as e:
                raise InvalidInstance(("instance", "path"), str(e)) from None
            size = sum(map(len, files["files"].values()))
            size += sum(map(len, files.get("binary_files", {}).values()))
            read = submission.memo[("harbor", path)] = (files, size)
        files, size = read
        if not submission.spend(size):
            raise InvalidInstance(
                ("instance", "path"),
                f"{path}: this submission's tasks, read, come to more than this server takes in"
                " one body (max_body_mb), each job counting its own copy: submit fewer jobs at"
                " once",
                "too_large",
            )
        prepared = {**files, **instance}
        try:
            HarborInstance.model_validate(prepared)
        except ValidationError as e:
            wrong = InvalidInstance.from_validation_error(e)
            raise InvalidInstance(
                ("instance", "path"), f"{path}: {wrong.field}: {wrong.message}", wrong.kind
            ) from None
        return prepared

    def document_instance(self, schema: dict[str, Any], settings: TaskSettings) -> None:
        """The path form in the document of a server that reads task directories."""
        if settings.harbor_roots:
            document_path_form(schema, settings.harbor_roots)

    def validate(self, job: TaskJob) -> None:
        """Besides the instance and params: the network the task asks for is one this
        server's ``egress_allow`` setting allows (InvalidInstance naming the task otherwise)."""
        super().validate(job)
        self.check_network(job)

    def check_network(self, job: TaskJob, *, agent: bool = True) -> None:
        """The network each phase asks for is one this server allows; with ``agent`` False (a
        harness agent, whose program gets no proxy yet), the agent's phase may ask none."""
        instance = parse_instance(HarborInstance, job.instance)
        allowed = allowed_egress(job)
        config = instance.config
        try:
            if agent:
                phase_policy(config.agent_network, allowed)
            elif config.agent_network:
                raise NetworkRefused(
                    "asks for the network for its agent, which an agent program raas did not"
                    " write does not get yet: run it with raas's own loop (data_source harbor)"
                )
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
        ctx = AgentContext(job=job)
        async with self.cleaned_up_on_error(ctx):
            ctx.sandbox = await self.agent_sandbox(job, {})
            ctx.closing.append(ctx.sandbox)
            await ctx.sandbox.bash(f"cd {shlex.quote(workdir_of(ctx.sandbox))}")
        return ctx

    async def agent_sandbox(self, job: TaskJob, binds: Mapping[str, str]) -> Sandbox:
        """The task's image (built first where it must be), with the task's caps where they
        are lower than the server's and ``binds`` bound read-only in (a harness's agent
        program), its service started and its healthcheck passed; closed again if any of it
        fails."""
        instance = HarborInstance.model_validate(job.instance)
        services = self.services_of(job)
        ref = await task_image(services, instance)
        sandbox = await services.sandbox(ref, instance.config.limits_update(), binds)
        try:
            await start_environment(sandbox, instance.config)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def after_fork(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None
        await start_environment(ctx.sandbox, HarborInstance.model_validate(ctx.job.instance).config)

    def agent_workdir(self, sandbox: Sandbox) -> str:
        return workdir_of(sandbox)

    def agent_time_limit_s(self, instance: dict[str, Any]) -> float | None:
        return HarborInstance.model_validate(instance).config.agent.timeout_sec

    async def run(self, context: Any) -> Trajectory:
        ctx: AgentContext = context
        config = HarborInstance.model_validate(ctx.job.instance).config
        if ctx.sandbox is not None:  # each job's own sandbox (a group's fork, a branch's too)
            await self.open_agent_network(ctx.sandbox, ctx.job, config)
        try:
            async with asyncio.timeout(self.agent_time_limit_s(ctx.job.instance)):
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
            why = "the agent had no sandbox"
            return RewardInfo(0.0, {"verifier_error": why, REASON: why})
        agents = ctx.sandbox
        config = instance.config
        services = self.services_of(ctx.job)
        run = verifier_run(instance, agents)
        tests = run.tests
        # The server's own binds only: a harness agent's program and packages stay behind.
        carry = self.verifier_carry(ctx.job)
        files = await agents.fork(carry=carry)
        ctx.closing.append(files)
        await agents.close()  # nothing of the agent runs on while the verifier does
        if not named_as_tests(tests):  # no twins: the one fork is the verifier
            verdict = await verify(files, config, run, services)
        else:
            # The agent's files, frozen in ``files`` (which runs nothing): the real run and each
            # twin's are forks of it, so nothing one run did is there in the next.
            verdict = await verify_with_twins(
                functools.partial(verify_fork, files, carry, config, run, services),
                tests,
                key=await asyncio.to_thread(task_key, ctx.job.instance),
                gold=self.gold_runs(ctx.job, instance, run),
            )
        metrics: dict[str, Any] = {**verdict.metrics, "rewards": verdict.rewards}
        metrics["stop_reason"] = ctx.stop_reason
        verifier = metrics.pop(VERIFIER_EGRESS, None)
        egress = {"agent": metrics_of(agents.egress), "verifier": verifier}
        if any(egress.values()):
            metrics["egress"] = {phase: said for phase, said in egress.items() if said}
        if instance.name:
            metrics["harbor_task"] = instance.name
        if instance.path:
            metrics["harbor_path"] = instance.path
        return RewardInfo(verdict.reward, metrics)

    def verifier_carry(self, job: TaskJob) -> ForkCarry:
        """What a verifier's fork carries: the agent's files and the server's own read-only
        binds, none of a harness agent's (its program, its packages, the user's agent files)."""
        return verifier_carry(getattr(self.services_of(job).sandbox_config, "ro_binds", {}))

    def gold_runs(
        self, job: TaskJob, instance: HarborInstance, run: VerifierRun
    ) -> GoldRuns | None:
        """The twins' calibration: the task's ``solution/solve.sh`` run where the agent would
        work (as ``raas datasets check`` runs it), then the verifier on forks of what it left,
        once for each set of tests; None where the task has no gold."""
        command = instance.gold_command()
        if command is None:
            return None
        carry = self.verifier_carry(job)
        services = self.services_of(job)

        async def runs(variants: list[Tests]) -> list[HarborVerdict]:
            gold = TaskJob(job.job_id + "-gold", job.instance, {}, services=job.services)
            ctx = await self.init(gold)
            try:
                if ctx.sandbox is None:
                    raise SandboxError(f"{instance.label}: gold had no sandbox")
                # A solve.sh that fails or runs past its time is judged as it left things: gold
                # scoring 0 then counts no twin.
                await ctx.sandbox.bash(command, timeout_s=SOLVE_TIMEOUT_S)
                files = await ctx.sandbox.fork(carry=carry)
            finally:
                await self.cleanup(ctx)
            try:
                return [
                    await verify_fork(files, carry, instance.config, run, services, variant)
                    for variant in variants
                ]
            finally:
                await files.close()

        return runs


def verifier_run(instance: HarborInstance, sandbox: Sandbox) -> VerifierRun:
    """What the verifier runs for ``instance``, in forks of ``sandbox`` (the agent's: its
    image's working directory and PATH)."""
    config = instance.config
    return VerifierRun(
        tests=instance.under("tests"),
        env=dict(config.verifier.env),
        timeout_s=config.verifier.timeout_sec,
        workdir=workdir_of(sandbox),
        reward_key=instance.reward_key,
        path=image_path(sandbox),
    )


async def verify(
    verifier: Sandbox, config: HarborConfig, run: VerifierRun, services: TaskServices
) -> HarborVerdict:
    """``run`` in ``verifier`` (a fork with ``verifier_carry``), the task's service started
    first, and the network the task's ``[verifier]`` asks for where the server allows it (its
    proxy's figures in the metrics, ``VERIFIER_EGRESS``)."""
    # The service again, its programs found on the verifier's PATH, not the image's (an image
    # that puts /app/bin first would run the agent's python3 beside test.sh).
    await start_environment(verifier, config, system_path(run.path))
    network = await open_network(
        verifier, config.verifier_network, services.egress, services.egress_caps
    )
    verdict = await run_verifier(verifier, replace(run, env={**network, **run.env}))
    said = metrics_of(verifier.egress)
    if said:
        verdict.metrics[VERIFIER_EGRESS] = said
    return verdict


async def verify_fork(
    files: Sandbox,
    carry: ForkCarry,
    config: HarborConfig,
    run: VerifierRun,
    services: TaskServices,
    tests: Tests,
) -> HarborVerdict:
    """``run`` with ``tests`` in a fresh fork of ``files`` (the agent's, frozen, forked with
    ``carry``), closed after."""
    verifier = await files.fork(carry=carry)
    try:
        return await verify(verifier, config, replace(run, tests=tests), services)
    finally:
        await verifier.close()


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
