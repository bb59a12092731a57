"""The base of every task whose RUN stage is the agent loop (code, swe, math, stem).

A subclass says what an instance holds (``instance_model``, a pydantic model that submission
validates against), what the model is told (``messages``), which tools it gets, how the
sandbox is set up (``setup``), what of the rollout is judged (``artifact``: the answer, the
solution file, the patch) and how (``judge``). EVAL is ``judge(instance, artifact)``, and the
artifact is kept in the result's metrics, so a stored result can be re-scored without the
model (``raas run --replay``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from raas.agent.checkpoints import Checkpointer, ResumePoint, fingerprint, resume_point
from raas.agent.loop import AfterTurn, AgentLoop, LoopConfig, LoopParams
from raas.agent.snapshots import Snapshot, SnapshotMissing
from raas.agent.tools import Tool, schema, select_tools
from raas.sandbox import Sandbox, SandboxError
from raas.tasks.protocol import (
    InvalidInstance,
    PolicyError,
    RewardInfo,
    TaskContext,
    TaskInstance,
    TaskJob,
    parse_instance,
    parse_params,
)
from raas.tasks.services import TaskServices
from raas.wire import Resume, Trajectory

log = logging.getLogger(__name__)


@dataclass
class AgentContext(TaskContext):
    sandbox: Sandbox | None = None
    answer: str | None = None
    stop_reason: str | None = None
    closing: list[Sandbox] = field(default_factory=list)  # every sandbox to close at cleanup


class AgentTask:
    name: str  # an instance attribute for the TaskHandler protocol; subclasses set it
    # What validate() checks a job against: the instance's fields, and the sampling_params
    # keys (the sampling keys and the loop's limits). Any other sampling key is an error.
    instance_model: ClassVar[type[TaskInstance]] = TaskInstance
    params_model: ClassVar[type[LoopParams]] = LoopParams
    # The tools the model gets: built-in tools by name, or Tool objects (see raas.agent.tools).
    tools: ClassVar[tuple[str | Tool, ...]] = ("bash", "editor", "finish", "think")
    needs_sandbox: ClassVar[bool] = True
    system_prompt: ClassVar[str] = "You are a capable agent. Use the tools to solve the task."
    default_max_turns: ClassVar[int] = 8
    # Whether a job may start from another's snapshot after a turn (RolloutRequest.branch):
    # the loop goes on from a copied trajectory; a task whose RUN is not this loop cannot.
    can_branch: ClassVar[bool] = True
    # Whether a job in flight at a crash resumes at its last durable turn (the --checkpoint
    # setting; raas.agent.checkpoints): the loop goes on from the rebuilt trajectory in a fresh
    # sandbox of the task with the workspace and shell put back. A task whose RUN is not this
    # loop, or whose state lies where a checkpoint does not reach, says False: it runs again
    # from the start.
    can_resume: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        select_tools(cls.tools)  # a misnamed or malformed tool fails where the task is defined

    # -- what subclasses provide ---------------------------------------------------------------

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def setup(self, ctx: AgentContext) -> None:
        """Prepare the sandbox (upload a repository, write files)."""

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        """What of the rollout is judged, taken from the RUN sandbox or the trajectory."""
        raise NotImplementedError

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        """The reward for ``artifact`` (in a fresh sandbox where tests are run)."""
        raise NotImplementedError

    async def after_fork(self, ctx: AgentContext) -> None:
        """``ctx.sandbox`` is a fork (of a group's template, or of a snapshot): start again what
        INIT started in the sandbox it came from, since a fork carries files, not processes."""

    # -- what a harness job that wraps this task asks of it (raas.tasks.harness) ---------------

    async def agent_sandbox(self, job: TaskJob, binds: Mapping[str, str]) -> Sandbox:
        """A started sandbox for an agent program raas did not write, with ``binds`` (host path
        -> sandbox path: the program and its packages) bound read-only in; ``setup`` runs in
        it next. One of its own: the warm pool's have none of those binds."""
        return await self.services_of(job).sandbox(binds=binds)

    def agent_workdir(self, sandbox: Sandbox) -> str:
        """The directory an agent works in, in this task's ``sandbox``."""
        return sandbox.config.workdir

    def agent_time_limit_s(self, instance: dict[str, Any]) -> float | None:
        """The time the task itself gives an agent (None: it says none)."""
        return None

    # -- the TaskHandler protocol --------------------------------------------------------------

    def validate(self, job: TaskJob) -> None:
        """Raises InvalidInstance locating the first bad field of the instance or params."""
        parse_instance(self.instance_model, job.instance)
        self.loop_config(job)
        if job.branch is not None:
            self.branch_source(job)

    def branch_source(self, job: TaskJob) -> Snapshot:
        """The snapshot ``job`` branches from; InvalidInstance naming what is missing (the
        job's snapshots, the turn, or an instance other than the snapshot's job's)."""
        assert job.branch is not None
        if not isinstance(job.services, TaskServices):
            raise InvalidInstance(("branch",), "this service keeps no snapshots")
        try:
            snapshot = job.services.snapshots.get(job.branch.job_id, job.branch.turn)
        except SnapshotMissing as e:
            raise InvalidInstance(("branch", e.field), e.message, "not_found") from None
        if snapshot.instance != job.instance:
            raise InvalidInstance(
                ("instance",), f"a branch's instance must be job {snapshot.job_id}'s own"
            )
        return snapshot

    def loop_config(self, job: TaskJob) -> LoopConfig:
        params = parse_params(
            self.params_model,
            job.sampling_params,
            f"the {self.name} task",
            max_turns=self.default_max_turns,
        )
        return LoopConfig.of(params)

    @staticmethod
    def services_of(job: TaskJob) -> TaskServices:
        if not isinstance(job.services, TaskServices):
            raise RuntimeError("this task needs the service's LLM backends and sandboxes")
        return job.services

    async def init(self, job: TaskJob) -> AgentContext:
        self.validate(job)  # a malformed instance fails here, naming the field
        if job.branch is not None:
            return await self.branch_context(job)
        return await self.resumed(await self.fresh_context(job))

    async def fresh_context(self, job: TaskJob) -> AgentContext:
        """INIT from the task alone: a sandbox, set up."""
        ctx = AgentContext(job=job)
        async with self.cleaned_up_on_error(ctx):
            if self.needs_sandbox:
                ctx.sandbox = await self.services_of(job).sandbox()
                ctx.closing.append(ctx.sandbox)
            await self.setup(ctx)
        return ctx

    # -- durable turns (raas.agent.checkpoints) ------------------------------------------------

    def fingerprint_parts(self, job: TaskJob) -> dict[str, Any]:
        """What shapes ``job``'s rollout: a checkpoint made under other parts is not resumed."""
        services = self.services_of(job)
        return {
            "task": self.name,
            "instance": job.instance,
            "sampling_params": job.sampling_params,
            "messages": self.messages(job.instance),
            "tools": [schema(tool) for tool in select_tools(self.tools).values()],
            # The served model is named by its tokenizer: the weights behind it change between
            # turns in asynchronous RL by design (each token's policy version is recorded).
            "tokenizer": services.tokenizer_name,
        }

    async def resumed(self, ctx: AgentContext) -> AgentContext:
        """``ctx`` (a fresh INIT) gone on to the job's last durable turn where it was in flight
        at a crash and has one: its workspace and shell put back, its trajectory rebuilt. Where
        it cannot be (settings changed, a checkpoint that does not read back, a restore that
        fails), the job runs from the start and ``ctx.resume`` says why."""
        job = ctx.job
        services = self.services_of(job) if isinstance(job.services, TaskServices) else None
        book = services.checkpoints if services is not None else None
        if not job.recovered or book is None or not self.can_resume:
            return ctx
        rows = await book.checkpoints(job.job_id)
        if not rows:
            return ctx
        files = ctx.sandbox is not None and ctx.sandbox.can_checkpoint
        job_dir = await asyncio.to_thread(book.job_dir, job.job_id)
        now = fingerprint(self.fingerprint_parts(job))
        point, refused = await asyncio.to_thread(resume_point, rows, now, job_dir, files)
        if point is None:
            ctx.resume = Resume(refused=refused) if refused else None
            return ctx
        try:
            lost = await self.put_back(ctx, point)
        except SandboxError as e:
            log.warning("job %s: resuming at turn %d failed: %s", job.job_id, point.turn, e)
            await self.cleanup(ctx)
            ctx = await self.fresh_context(job)
            why = f"restoring turn {point.turn} failed ({e}): it ran from the start"
            ctx.resume = Resume(refused=why)
            return ctx
        ctx.trajectory = point.trajectory
        ctx.resume = Resume(resumed_at_turn=point.turn, lost=[*point.lost, *lost])
        return ctx

    async def put_back(self, ctx: AgentContext, point: ResumePoint) -> list[str]:
        """Put ``point``'s workspace and shell into ``ctx``'s fresh sandbox; what could not be."""
        if ctx.sandbox is None or (not point.archives and point.shell is None):
            return []
        restored = await ctx.sandbox.restore(point.archives, point.shell)
        return list(restored.lost)

    def checkpointer(self, ctx: AgentContext) -> Checkpointer | None:
        """The job's checkpoints through this RUN, where the server keeps them."""
        services = self.services_of(ctx.job)
        every = services.tasks.checkpoint_every
        if services.checkpoints is None or not every or not self.can_resume:
            return None
        sandbox = ctx.sandbox
        if sandbox is not None and not sandbox.can_checkpoint:
            return None  # its state lies where a checkpoint does not reach: it runs again
        return Checkpointer(
            services.checkpoints,
            ctx.job.job_id,
            fingerprint(self.fingerprint_parts(ctx.job)),
            sandbox,
            ctx.trajectory,
            every=every,
            max_bytes=int(services.tasks.checkpoint_max_mb * 2**20),
        )

    async def fork_context(self, template: TaskContext, job: TaskJob) -> AgentContext:
        """``job``'s context from a group's template (another job's INIT of the same instance):
        a fork of its sandbox as the set-up left it. Where there is no sandbox, or it cannot
        fork (apptainer, local), ``job`` runs INIT of its own."""
        source = _agent(template)
        if source.sandbox is None or not source.sandbox.can_fork:
            return await self.init(job)
        # The template runs nothing after INIT: sealed (once, by the first member), no process
        # of it can change what a member sees, and members fork copy-on-write, not by a copy.
        await source.sandbox.seal()
        sandbox = await source.sandbox.fork()
        ctx = self.forked(source, job, sandbox)
        ctx.closing.append(sandbox)
        async with self.cleaned_up_on_error(ctx):
            await self.after_fork(ctx)
        return await self.resumed(ctx)

    async def branch_context(self, job: TaskJob) -> AgentContext:
        """``job``'s context from the snapshot it branches from: a fork of the snapshot's
        sandbox and a copy of its trajectory (RUN goes on from there). A snapshot evicted since
        the job was submitted fails it as the job's own doing (validate raises), not a retry."""
        try:
            snapshot = self.branch_source(job)
        except InvalidInstance as e:
            raise PolicyError(str(e)) from None
        parent = _agent(snapshot.context)
        sandbox = await snapshot.sandbox.fork() if snapshot.sandbox is not None else None
        ctx = self.forked(parent, job, sandbox) if sandbox is not None else AgentContext(job=job)
        if sandbox is not None:
            ctx.closing.append(sandbox)
            async with self.cleaned_up_on_error(ctx):
                await self.after_fork(ctx)
        ctx.trajectory = snapshot.trajectory.model_copy(deep=True)
        return ctx

    async def keep_snapshot(self, ctx: AgentContext, turns: int, trajectory: Trajectory) -> None:
        """After turn ``turns``: keep a copy of the trajectory and an idle fork of the sandbox,
        sealed (``Sandbox.seal``: its branches fork copy-on-write where the provider can); a
        sandbox that cannot fork keeps none, so a branch from it is refused."""
        services = self.services_of(ctx.job)
        sandbox = ctx.sandbox
        if sandbox is not None and not sandbox.can_fork:
            return
        fork = await sandbox.fork() if sandbox is not None else None
        if fork is not None:  # idle for good: its branches fork copy-on-write
            try:
                await fork.seal()
            except BaseException:
                await fork.close()
                raise
        snapshot = Snapshot(
            ctx.job.job_id,
            turns,
            trajectory.model_copy(deep=True),
            ctx.job.instance,
            fork,
            ctx,
        )
        services.snapshots.add(snapshot, self.loop_config(ctx.job).keep_snapshots)

    def forked(self, template: AgentContext, job: TaskJob, sandbox: Sandbox) -> AgentContext:
        """The context of a fork of ``template``'s sandbox: what INIT set besides the sandbox
        (a subclass's own fields) carried over."""
        return AgentContext(job=job, sandbox=sandbox)

    @asynccontextmanager
    async def cleaned_up_on_error(self, ctx: AgentContext) -> AsyncIterator[None]:
        """INIT's set-up: if it fails (or is cancelled), what it opened is closed before the error
        goes on, since a context that INIT never returns is never cleaned up."""
        try:
            yield
        except BaseException:
            await self.cleanup(ctx)
            raise

    async def run(self, context: TaskContext) -> Trajectory:
        ctx = _agent(context)
        services = self.services_of(ctx.job)
        tokenizer = await services.tokenizer_async()
        config = self.loop_config(ctx.job)
        if config.keep_snapshots:
            services.snapshots.drop(ctx.job.job_id)
        checkpoints = self.checkpointer(ctx)
        loop = AgentLoop(
            services.llm,
            tokenizer,
            select_tools(self.tools),
            ctx.sandbox,
            config,
            after_turn=_both(
                partial(self.keep_snapshot, ctx) if config.keep_snapshots else None,
                checkpoints.after_turn if checkpoints is not None else None,
            ),
            before_tools=checkpoints.before_tools if checkpoints is not None else None,
        )
        try:
            result = await loop.run(ctx.job.job_id, self.messages(ctx.job.instance), ctx.trajectory)
        finally:
            services.release(ctx.job.job_id)
            if checkpoints is not None:
                task = asyncio.current_task()
                await checkpoints.close(abandon=task is not None and task.cancelling() > 0)
                ctx.checkpoints = checkpoints.stats.data()
        ctx.answer, ctx.stop_reason = result.answer, result.stop_reason
        return ctx.trajectory

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        ctx = _agent(context)
        artifact = await self.artifact(ctx, trajectory)
        info = await self.judge(ctx.job.instance, artifact, self.services_of(ctx.job))
        info.metrics["artifact"] = artifact
        info.metrics.setdefault("stop_reason", ctx.stop_reason)
        return info

    async def cleanup(self, context: TaskContext) -> None:
        ctx = _agent(context)
        for sandbox in ctx.closing:
            await sandbox.close()


@asynccontextmanager
async def fresh_sandbox(services: TaskServices, image: str | None = None) -> AsyncIterator[Sandbox]:
    """A sandbox the agent never touched, for judging (with ``image``, from that image of the
    image store); closed afterwards."""
    sandbox = await services.sandbox(image)
    try:
        yield sandbox
    finally:
        await sandbox.close()


def last_assistant_text(trajectory: Trajectory) -> str:
    for message in reversed(trajectory.messages):
        if message.get("role") == "assistant":
            return str(message.get("content", ""))
    return ""


def _both(first: AfterTurn | None, second: AfterTurn | None) -> AfterTurn | None:
    """One after-turn hook that runs ``first`` then ``second`` (either may be None)."""
    if first is None or second is None:
        return first or second
    a, b = first, second

    async def both(turns: int, trajectory: Trajectory) -> None:
        await a(turns, trajectory)
        await b(turns, trajectory)

    return both


def _agent(context: TaskContext) -> AgentContext:
    if not isinstance(context, AgentContext):
        raise TypeError(f"expected an AgentContext, got {type(context).__name__}")
    return context
