"""Harness tasks: an agent program raas did not write runs in the sandbox against the gateway.

RUN opens a gateway session for the job (``services.gateway.open(job_id, params, trajectory)``;
the session records every model call into the trajectory), exposes it inside the sandbox
(``Sandbox.expose``: ``http://127.0.0.1:PORT/v1``, no network), and runs the agent's command
line with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (the session's token; ``ANTHROPIC_BASE_URL``
and ``ANTHROPIC_API_KEY`` the same for Anthropic's clients),
``RAAS_MESSAGES_FILE`` (a file of the task's chat messages as JSON), ``RAAS_TASK_FILE`` (a file
of the same as text), ``RAAS_ANSWER_FILE`` (where the answer goes) and ``RAAS_MAX_TURNS``, within
``agent_timeout_s``; ``RAAS_MESSAGES`` and ``RAAS_TASK`` are the first two's earlier names (the
same paths). EVAL is the EVAL of the task the instance names (``judge``: code, swe or math, the
judge on the same artifact that task takes: solution file, patch, answer; harbor, Harbor's
verifier on a fork of the agent's files).

The judged task makes the sandbox (``AgentTask.agent_sandbox``: a plain one, or a Harbor task's
image with its caps and its service started), says where the agent works in it
(``agent_workdir``: a Harbor image's WORKDIR) and for how long at most (``agent_time_limit_s``:
Harbor's ``[agent] timeout_sec``, past which what the agent left is judged), and starts again
what a fork of it does not carry (``after_fork``: a Harbor task's service, for a group's jobs).

A user's own agent comes in as the service's ``agent_files`` (``raas serve --agent-files DIR``):
a directory copied (links as links, so that none reaches outside it) and bound read-only at
``RAAS_AGENT_DIR``, where the instance's ``agent_command`` runs it.

The instance's ``agent`` picks a bundled agent: its packages are bound read-only into the
sandbox, on ``PYTHONPATH``, and its command line is the default one (``agent_command`` replaces
it). ``reference`` (raas.harness_agents.reference) gets ``openai`` and what it requires from
raas's own environment at /.raas/py (raas.sandbox.pydeps); ``mini-swe-agent`` gets the
site-packages of the service's agents environment (``agents_venv``: mini-swe-agent's
dependencies, litellm's among them, conflict with raas's own) at /.raas/agent-py. Compiled
parts (pydantic_core, jiter) need the sandbox's python3 to be the environment's Python minor
version, which is checked first. ``qwen-code``, ``pi``, ``opencode``, ``claude-code``, ``gemini``
and ``codex`` (CLIs from npm) get the service's node environment (``agents_node``: its
node_modules) and the host's node, bound read-only (raas.tasks.harness_node), and ``openai``'s
closure as the reference does; its launcher needs any python3 (3.8 or newer), so no version is
checked. The agents' launchers are at /.raas/agents.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field

from raas.agent.loop import LoopParams
from raas.llm.types import WHOLE
from raas.sandbox import (
    ApptainerConfig,
    BwrapConfig,
    Sandbox,
    SandboxError,
    ToolError,
)
from raas.sandbox.pydeps import DEST, package_dirs, python_version, staged_binds
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.code import CodeTask
from raas.tasks.harbor.task import HarborTask
from raas.tasks.harness_node import NODE_AGENTS, NodeEnvironment, node_environment
from raas.tasks.math import MathTask
from raas.tasks.protocol import (
    PolicyError,
    RewardInfo,
    Submission,
    TaskContext,
    TaskInstance,
    TaskJob,
    parse_instance,
    prepare_instance,
)
from raas.tasks.services import TaskServices
from raas.tasks.swe import SweTask
from raas.wire import Trajectory

AGENTS_DIR = Path(__file__).resolve().parent.parent / "harness_agents"
AGENTS_INSIDE = "/.raas/agents"
AGENT_PY_INSIDE = "/.raas/agent-py"  # an agents environment's site-packages
AGENT_FILES_INSIDE = "/.raas/agent-files"  # the service's agent_files ($RAAS_AGENT_DIR)
IO_DIR = "/tmp/raas-harness"
MAX_ANSWER_BYTES = 1024 * 1024  # an answer.txt beyond it is no answer (and not read)
DEFAULT_AGENT_TIMEOUT_S = 600.0
LAST_LINE_CHARS = 200  # of a crashed agent's output, in its error message
AgentName = Literal[
    "reference", "mini-swe-agent", "qwen-code", "pi", "opencode", "claude-code", "gemini", "codex"
]
COMMANDS: dict[str, str] = {
    "reference": f"python3 -s {AGENTS_INSIDE}/reference.py",
    "mini-swe-agent": f"python3 -s {AGENTS_INSIDE}/mini_swe_agent.py",
    "qwen-code": f"python3 -s {AGENTS_INSIDE}/npm_agents.py qwen-code",
    "pi": f"python3 -s {AGENTS_INSIDE}/npm_agents.py pi",
    "opencode": f"python3 -s {AGENTS_INSIDE}/npm_agents.py opencode",
    "claude-code": f"python3 -s {AGENTS_INSIDE}/npm_agents.py claude-code",
    "gemini": f"python3 -s {AGENTS_INSIDE}/npm_agents.py gemini",
    "codex": f"python3 -s {AGENTS_INSIDE}/npm_agents.py codex",
}


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the models it refers to (``$defs``) written in place."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return walk({**defs[ref.removeprefix("#/$defs/")], **rest})
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


def _judged_too(schema: dict[str, Any]) -> None:
    """The instance is its judge's too (validate() parses it as the judged task's instance):
    one branch a judge, the judged task's instance schema with ``judge`` naming it."""
    branches = []
    for name, task in HarnessTask.judges.items():
        judged = _inlined(task.instance_model.model_json_schema())
        for key in ("title", "description"):
            judged.pop(key, None)
        properties = {k: v for k, v in judged.get("properties", {}).items() if k != "data_source"}
        judged["properties"] = {**properties, "judge": {"const": name}}
        branches.append(judged)
    schema["anyOf"] = branches


class HarnessInstance(TaskInstance):
    model_config = ConfigDict(json_schema_extra=_judged_too)

    judge: Literal["code", "swe", "math", "harbor"]
    agent: AgentName = Field(
        default="reference",
        description="A bundled agent: its packages are bound in, its command is the default.",
    )
    agent_command: str | None = Field(
        default=None, min_length=1, description="A shell command line; default: the agent's."
    )
    agent_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=24 * 3600,
        description="The agent program's time (default 600 s); a task that gives its agent a"
        " time of its own (Harbor's [agent] timeout_sec) is held to the shorter.",
    )


@dataclass
class HarnessContext(AgentContext):
    agent_output: str | None = None  # the end of what the agent program printed
    agent_exit_code: int | None = None  # None: it ran out of agent_timeout_s
    agent_site: Path | None = None  # the agents environment's site-packages (mini-swe-agent)
    agent_node: NodeEnvironment | None = None  # node and its node_modules (the npm agents)
    # What the gateway recorded (calls, segments with their tokens, drift), for the result.
    gateway_metrics: dict[str, Any] = field(default_factory=dict)


def _no_snapshots(keep: int) -> int:
    if keep:
        raise ValueError(
            "the harness task keeps no snapshots: the agent program runs its own loop, so there"
            " is no turn to branch from (leave keep_snapshots out, or 0)"
        )
    return keep


class HarnessParams(LoopParams):
    """The agent loop's sampling_params, but no snapshots: the document says so (a maximum of
    0), so a request the document allows is one the task takes."""

    keep_snapshots: Annotated[
        int,
        Field(strict=True, ge=0, json_schema_extra={"maximum": 0}),
        WHOLE,
        AfterValidator(_no_snapshots),
    ] = 0


class HarnessTask(AgentTask):
    name = "harness"
    instance_model = HarnessInstance
    params_model = HarnessParams
    tools = ()
    judges: ClassVar[dict[str, AgentTask]] = {
        "code": CodeTask(),
        "swe": SweTask(),
        "math": MathTask(),
        "harbor": HarborTask(),
    }
    default_max_turns = 20  # model calls the agent may make (RAAS_MAX_TURNS)
    can_branch = False  # the agent program runs its own loop: no turn to go on from
    # Nor to resume at: the program cannot be paused mid-call, and its own memory (what it
    # was doing) is not checkpointed. A job in flight at a crash runs again from the start.
    can_resume = False

    def wrapped(self, instance: dict[str, Any]) -> AgentTask:
        return self.judges[str(instance["judge"])]

    async def prepare(self, instance: dict[str, Any], submission: Submission) -> dict[str, Any]:
        """The judged task's own preparation (a Harbor task named by its path is read into its
        files); an unknown judge is left for ``validate`` to name."""
        judged = self.judges.get(str(instance.get("judge")))
        return instance if judged is None else await prepare_instance(judged, instance, submission)

    def validate(self, job: TaskJob) -> None:
        parse_instance(HarnessInstance, job.instance)
        wrapped = self.wrapped(job.instance)
        parse_instance(wrapped.instance_model, job.instance)
        if isinstance(wrapped, HarborTask):
            wrapped.check_network(job, agent=False)
        self.loop_config(job)  # sampling_params: HarnessParams says which

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        return self.wrapped(instance).messages(instance)

    async def init(self, job: TaskJob) -> HarnessContext:
        self.validate(job)
        services = self.services_of(job)
        instance = HarnessInstance.model_validate(job.instance)
        agent = instance.agent
        ctx = HarnessContext(job=job)
        if services.agents.agent_files is None and "RAAS_AGENT_DIR" in (
            instance.agent_command or ""
        ):
            raise SandboxError(
                "the agent_command runs a file in $RAAS_AGENT_DIR, but this service has no agent"
                " files: start raas serve with --agent-files DIR (raas run --agent-files DIR,"
                " RAAS_AGENT_FILES), the directory that holds your agent"
            )
        async with self.cleaned_up_on_error(ctx):
            if agent in NODE_AGENTS:
                ctx.agent_node = await asyncio.to_thread(
                    node_environment, services.agents.agents_node, agent
                )
            elif agent != "reference":
                ctx.agent_site = await asyncio.to_thread(agents_site_packages, services)
            binds = await asyncio.to_thread(_agent_binds, services, ctx.agent_site, ctx.agent_node)
            judged = self.wrapped(job.instance)
            ctx.sandbox = await judged.agent_sandbox(job, binds)
            ctx.closing.append(ctx.sandbox)
            await judged.setup(ctx)
        return ctx

    def forked(self, template: AgentContext, job: TaskJob, sandbox: Sandbox) -> HarnessContext:
        source = _harness(template)
        return HarnessContext(
            job=job, sandbox=sandbox, agent_site=source.agent_site, agent_node=source.agent_node
        )

    async def after_fork(self, ctx: AgentContext) -> None:
        await self.wrapped(ctx.job.instance).after_fork(ctx)

    async def run(self, context: TaskContext) -> Trajectory:
        ctx = _harness(context)
        job, sandbox = ctx.job, ctx.sandbox
        assert sandbox is not None
        services = self.services_of(job)
        gateway = services.gateway
        instance = HarnessInstance.model_validate(job.instance)
        command = instance.agent_command or COMMANDS[instance.agent]
        if ctx.agent_node is None and (
            instance.agent_command is None or instance.agent != "reference"
        ):
            await _check_python(sandbox, ctx.agent_site)
        config = self.loop_config(job)  # the job's sampling and its cap of tokens a call
        params = config.sampling.model_copy(update={"max_tokens": config.max_tokens})
        await services.tokenizer_async()  # the first job loads it off the loop; open() reuses it
        session = gateway.open(job.job_id, params, ctx.trajectory)
        ctx.segments = session.segments  # the list itself: complete whenever the job ends
        judged = self.wrapped(job.instance)
        timeout_s = agent_time_s(instance.agent_timeout_s, judged.agent_time_limit_s(job.instance))
        try:
            # The relay admits the job's token alone: any other request gets its 401 before
            # its body is read.
            port = await sandbox.expose(session.handle, timeout_s=timeout_s, token=session.token)
            messages = self.messages(job.instance)
            await sandbox.write_file(f"{IO_DIR}/messages.json", json.dumps(messages))
            await sandbox.write_file(f"{IO_DIR}/task.md", _as_text(messages))
            env = {
                "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                "OPENAI_API_KEY": str(session.token),
                # Anthropic's clients (the SDK, Claude Code) add /v1 themselves.
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
                "ANTHROPIC_API_KEY": str(session.token),
                # Gemini CLI (and @google/genai) add /v1beta themselves; a base URL on
                # 127.0.0.1 may be plain HTTP.
                "GOOGLE_GEMINI_BASE_URL": f"http://127.0.0.1:{port}",
                "GEMINI_API_KEY": str(session.token),
                "RAAS_MESSAGES_FILE": f"{IO_DIR}/messages.json",
                "RAAS_TASK_FILE": f"{IO_DIR}/task.md",
                # Their names before: an agent written for them keeps working.
                "RAAS_MESSAGES": f"{IO_DIR}/messages.json",
                "RAAS_TASK": f"{IO_DIR}/task.md",
                "RAAS_ANSWER_FILE": f"{IO_DIR}/answer.txt",
                "RAAS_MAX_TURNS": str(config.max_turns),
                "PYTHONPATH": _pythonpath(sandbox, ctx.agent_site),
            }
            if ctx.agent_node is not None:
                env |= ctx.agent_node.variables(_bound(sandbox))
            if services.agents.agent_files is not None:
                env["RAAS_AGENT_DIR"] = _agent_dir(sandbox, services.agents.agent_files)
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            workdir = shlex.quote(judged.agent_workdir(sandbox))
            # A subshell: the variables and the cd stay out of the sandbox's shell.
            line = f"(export {exports}; cd {workdir} && {command})"
            result = await sandbox.bash(line, timeout_s=timeout_s)
        finally:
            if sandbox.client is not None:  # a late request inside now gets a 502
                sandbox.client.set_relay(None)
            ctx.gateway_metrics = session.metrics()
            gateway.close(session.token)
            services.release(job.job_id)
        ctx.stop_reason = "agent_timeout" if result.timed_out else f"agent_exit_{result.exit_code}"
        ctx.agent_output = result.output[-4000:]
        ctx.agent_exit_code = None if result.timed_out else result.exit_code
        if (
            not result.timed_out
            and result.exit_code != 0
            and not ctx.gateway_metrics["gateway_calls"]
        ):
            ctx.trajectory.stop_reason = ctx.stop_reason
            raise crashed(result.exit_code, ctx.agent_output)
        try:
            answer = await sandbox.read_file(f"{IO_DIR}/answer.txt", max_bytes=MAX_ANSWER_BYTES)
            ctx.answer = answer.decode(errors="replace")
        except (ToolError, SandboxError):
            ctx.answer = None
        if ctx.trajectory.stop_reason is None:
            ctx.trajectory.stop_reason = ctx.stop_reason
        return ctx.trajectory

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        return await self.wrapped(ctx.job.instance).artifact(ctx, trajectory)

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        return await self.wrapped(instance).judge(instance, artifact, services)

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        # The judged task's own EVAL, on what the agent program left (Harbor's: its verifier
        # on a fork of the sandbox; the others': their judge on the artifact).
        info = await self.wrapped(_harness(context).job.instance).eval(context, trajectory)
        info.metrics["agent_output"] = _harness(context).agent_output
        info.metrics["agent_exit_code"] = _harness(context).agent_exit_code
        info.metrics.update(_harness(context).gateway_metrics)
        return info


def agent_time_s(given: float | None, task_limit: float | None) -> float:
    """The agent program's time: the instance's ``agent_timeout_s`` and the task's own limit
    (Harbor's), the shorter where both are set; DEFAULT_AGENT_TIMEOUT_S where neither is."""
    return min((t for t in (given, task_limit) if t is not None), default=DEFAULT_AGENT_TIMEOUT_S)


def crashed(exit_code: int | None, output: str) -> PolicyError:
    """An agent program that failed before it called the model: nothing to judge. Its last
    line (a traceback's, often) says why; the whole end of its output goes in the metrics."""
    lines = output.strip().splitlines()
    last = textwrap.shorten(lines[-1], LAST_LINE_CHARS) if lines else "no output"
    return PolicyError(
        f"the agent program exited with status {exit_code} without calling the model: {last}"
        " (its output: metrics.agent_output)",
        {"agent_output": output, "agent_exit_code": exit_code},
    )


def _harness(context: TaskContext) -> HarnessContext:
    if not isinstance(context, HarnessContext):
        raise TypeError(f"expected a HarnessContext, got {type(context).__name__}")
    return context


def _agent_binds(
    services: TaskServices, site: Path | None, node: NodeEnvironment | None
) -> dict[str, str]:
    """What the agent program's sandbox gets bound in (host path -> sandbox path): the
    launchers, the agent's packages (openai's closure, else the agents environment's ``site``;
    and ``node``'s, for an npm agent) and the service's agent files; none where the provider
    binds nothing in (local). Blocking: the first call copies the packages where the sandbox's
    uid can read; the agent files are looked at again each time (an edit reaches the next
    job)."""
    if not isinstance(services.sandbox_config, BwrapConfig | ApptainerConfig):
        return {}
    launchers = {str(AGENTS_DIR): AGENTS_INSIDE}
    if node is not None:
        staged = staged_binds("openai", {**launchers, **node.binds()})
    elif site is None:
        staged = staged_binds("openai", launchers)
    else:
        staged = staged_binds(None, {**launchers, str(site): AGENT_PY_INSIDE}, bytecode=True)
    if services.agents.agent_files is not None:
        own = {str(services.agents.agent_files.resolve()): AGENT_FILES_INSIDE}
        staged |= staged_binds(None, own, own_files=True)
    return staged


def _agent_dir(sandbox: Sandbox, agent_files: Path) -> str:
    """Where the agent files are for the program: bound in, else (the local provider, no
    isolation) where they are on the host."""
    if _bound(sandbox):
        return AGENT_FILES_INSIDE
    return str(agent_files.resolve())


def _bound(sandbox: Sandbox) -> bool:
    """Whether host files reach this sandbox bound in (not so with the local provider)."""
    return isinstance(sandbox.config, BwrapConfig | ApptainerConfig)


def agents_site_packages(services: TaskServices) -> Path:
    """The site-packages of the service's agents environment (where mini-swe-agent lives)."""
    venv = services.agents.agents_venv
    if venv is None:
        raise SandboxError(
            "the mini-swe-agent agent needs an agents environment: start raas serve with"
            " --agents-venv DIR (RAAS_AGENTS_VENV), a virtual environment holding"
            " mini-swe-agent (`make agents-venv` builds .venv-agents)"
        )
    found = sorted(Path(venv).glob("lib/python3.*/site-packages"))
    if len(found) != 1 or not (found[0] / "minisweagent").is_dir():
        raise SandboxError(
            f"agents_venv {venv} is not a virtual environment with mini-swe-agent installed"
            " (`make agents-venv` builds one)"
        )
    return found[0]


def _pythonpath(sandbox: Sandbox, site: Path | None) -> str:
    bound = _bound(sandbox)
    if site is not None:
        return AGENT_PY_INSIDE if bound else str(site)
    if bound:
        return DEST
    return ":".join(package_dirs("openai"))  # the local provider: host paths


async def _check_python(sandbox: Sandbox, site: Path | None) -> None:
    if site is None:
        want, where = python_version(), "raas's Python"
        remedy = "give the instance an agent_command with its own environment"
    else:  # .../lib/python3.11/site-packages
        want, where = site.parent.name.removeprefix("python"), "the agents environment's Python"
        remedy = "build the agents environment (--agents-venv) with the sandbox's Python"
    result = await sandbox.bash(
        "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", timeout_s=30
    )
    version = result.output.strip()
    if version != want:
        raise SandboxError(
            f"the sandbox's python3 is {version or 'missing'}, {where} is {want}: the packages"
            " bound in from there have compiled parts (pydantic_core, jiter) that load only"
            f" into the same minor version; {remedy}"
        )


def _as_text(messages: list[dict[str, Any]]) -> str:
    return "\n\n".join(str(m.get("content", "")) for m in messages if m.get("content"))
