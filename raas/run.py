"""``raas run``: the main job. Tasks through a service (in-process unless a URL is given), with
a progress bar, a result table and a summary; or ``--replay``: re-score stored results.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from raas.api.app import create_app
from raas.cli.progress import Counting, markup, say_cancelling
from raas.client import RolloutClient
from raas.client.single_server import RaasHTTPError, with_job_id
from raas.client.task_files import infra_errors, keeping, read_results, run_requests
from raas.helpers.ports import free_port
from raas.helpers.readiness import wait_until_answers
from raas.helpers.terminal import counted
from raas.launch import EngineProcess
from raas.llm.pool import BackendPool
from raas.paths import host_paths, image_caps
from raas.sandbox import BwrapConfig
from raas.settings import defaults, validate
from raas.tasks import TaskRegistry
from raas.tasks.agentic import AgentTask
from raas.tasks.protocol import InvalidInstance, TaskJob, validate_request
from raas.tasks.services import TaskServices
from raas.wire import PASS_REWARD, RolloutRequest, RolloutResult, RunningJob

# Sampling for a run on the embedded CPU engine, under the tasks' own: SmolLM2-135M generates about
# 15 tokens/s on 2 cores, so a turn stays under 20 s and a job of 4 turns near a minute (the
# tasks' defaults, 512 tokens a turn and 8 turns, kept a first run silent for minutes).
CPU_SAMPLING: dict[str, Any] = {"max_tokens": 256, "max_turns": 4}


def under_cpu_sampling(
    requests: Sequence[RolloutRequest], registry: TaskRegistry | None = None
) -> list[RolloutRequest]:
    """Each request with CPU_SAMPLING under its own sampling_params, but only the keys its task
    takes (its ``params_model``'s fields): countdown's scripted policy has no ``max_tokens``,
    and a key a task does not know is refused. A task raas does not know gets none (its
    validation names it)."""
    registry = registry or TaskRegistry.from_entry_points()
    out = []
    for request in requests:
        source = request.instance["data_source"]
        handler = registry.get(source) if source in registry else None
        model = getattr(handler, "params_model", None)
        fields = getattr(model, "model_fields", {})
        cpu = {k: v for k, v in CPU_SAMPLING.items() if k in fields}
        params = {**cpu, **request.sampling_params}
        out.append(request.model_copy(update={"sampling_params": params}))
    return out


def first_refusal(
    requests: Sequence[RolloutRequest], names: Sequence[str], registry: TaskRegistry | None = None
) -> str | None:
    """``where: field: why`` for the first request that its task's own validation refuses (as
    the service started here would, after its engine has started), or None. A task raas does
    not know, or a branch (the service's snapshots decide), is left to the service."""
    registry = registry or TaskRegistry.from_entry_points()
    for where, request in zip(names, requests, strict=True):
        source = request.instance["data_source"]
        if request.branch is not None or source not in registry:
            continue
        job = TaskJob("", request.instance, request.sampling_params)
        try:
            validate_request(registry.get(source), job)
        except InvalidInstance as e:
            return f"{where}: {e}"
    return None


# The engine stops within a decode step or one prefill of SIGTERM; SIGKILL after this.
ENGINE_STOP_S = 15.0


@dataclass
class RunOptions:
    url: str | None = None
    api_key: str | None = None  # the --url server's
    llm: list[str] = field(default_factory=list)
    model: str = field(default_factory=lambda: defaults().inference.tokenizer)
    workdir: Path = Path("out/run")
    quiet_server: bool = True
    # More settings of the in-process service, by name (raas.settings: RUN_SETTINGS' flags).
    serve: dict[str, Any] = field(default_factory=dict)
    engine_args: list[str] = field(default_factory=list)  # for the engine started here


class InProcessServer(uvicorn.Server):
    """The run's own service. It leaves SIGINT and SIGTERM to asyncio.run (uvicorn would take
    them and shut down at once): a Ctrl-C cancels the run, which cancels its jobs on this server
    first and then stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def embedded_engine(options: RunOptions, console: Console) -> AsyncIterator[str]:
    """The URL of an engine started here, stopped on the way out, even when interrupted while
    it loads (stopping it also ends the thread that waits for it)."""
    console.print(f"starting the embedded engine with {options.model} ...")
    # Tied: started on the event loop's thread, which lives as long as the run.
    engine = EngineProcess(
        options.model, options.workdir / "engine.log", extra_args=options.engine_args, tied=True
    )
    try:
        await asyncio.to_thread(engine.wait_ready, 600.0)
        yield engine.url
    finally:
        await asyncio.to_thread(engine.stop, ENGINE_STOP_S)


@contextlib.asynccontextmanager
async def service(options: RunOptions, console: Console) -> AsyncIterator[str]:
    """The URL of a service to run on: the given one, or one started here (with an engine)."""
    if options.url:
        yield options.url
        return
    options.workdir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        llm = list(options.llm) or [
            await stack.enter_async_context(embedded_engine(options, console))
        ]
        yield await stack.enter_async_context(served(options, llm, console))


@contextlib.asynccontextmanager
async def served(options: RunOptions, llm: list[str], console: Console) -> AsyncIterator[str]:
    """``raas serve`` in this process on ``llm``, until the way out."""
    port = free_port()
    # The run's own service: configured here and by its flags, not by RAAS_* variables meant
    # for `raas serve`; but the paths are the process's (the libraries read them too).
    settings = validate(
        {
            "paths": host_paths(),
            "images": image_caps(),
            **options.serve,
            "port": port,
            # Not raas.db, `raas serve`'s default: a run beside a server keeps to its own.
            "db": options.workdir / "run.db",
            "llm": llm,
            "tokenizer": options.model,
            "log_level": "warning" if options.quiet_server else "info",
        }
    )
    server = InProcessServer(
        uvicorn.Config(create_app(settings), port=port, log_level=settings.server.log_level)
    )
    task = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{port}"
    try:

        def gone() -> str | None:
            if not task.done():
                return None
            error = None if task.cancelled() else task.exception()
            return f"the in-process raas serve stopped while starting: {error!r}"

        await asyncio.to_thread(wait_until_answers, url + "/healthz", 60.0, gone)
        console.print(f"raas serving on {url}, LLM at {', '.join(llm)}")
        yield url
    finally:
        server.should_exit = True
        await task


class RunProgress(Counting):
    """Counting that says what a person watches a run for: how many finished, how many are still
    running, and the mean reward so far, on the bar (with the time elapsed, not an ETA that
    cannot be guessed before the first job ends) and on each line off a terminal."""

    def __init__(self, console: Console, total: int, label: str, every_s: float = 15.0) -> None:
        super().__init__(console, total, label, every_s)
        self.rewards: list[float] = []
        self.generating = 0  # response tokens of the run's jobs in flight (watch() counts them)
        if self._bar is not None:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=console,
            )
            self._task = self._bar.add_task(self.line(), total=total)

    def line(self) -> str:
        """``LABEL: 3/8 finished, 5 running (412 tokens so far), mean reward 0.667 (2
        passed)``: the tokens of the running jobs' turns grow as they are generated, so a run
        whose model is stalled stands still where a slow one moves."""
        rewards = self.rewards
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        passed = sum(r >= PASS_REWARD for r in rewards)
        running = self.total - self.done
        tokens = f" ({self.generating} tokens so far)" if running else ""
        return (
            f"{markup(self.label)}: {self.done}/{self.total} finished,"
            f" {running} running{tokens}, mean reward {mean} ({passed} passed)"
        )

    async def watch(
        self,
        running: Callable[[], Awaitable[list[RunningJob]]],
        ids: set[str],
        every_s: float = 2.0,
    ) -> None:
        """Count the response tokens of the jobs ``ids`` in flight (``running()`` lists the
        server's), every ``every_s``."""
        while True:
            await asyncio.sleep(every_s)
            try:
                jobs = await running()
            except (RaasHTTPError, httpx.HTTPError):
                continue  # a server busy or going away: the next look, or the run's end, says
            self.generating = sum(j.response_tokens for j in jobs if j.job_id in ids)
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, description=self.line())

    def advance(self, result: Any = None) -> None:
        if result is not None and result.reward is not None:
            self.rewards.append(result.reward)
        super().advance(result)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=self.line())

    def _say(self) -> None:
        self._said = time.monotonic()
        failed = f", {self.failed} not done" if self.failed else ""
        self.console.print(f"{self.line()}{failed}, {self._said - self._started:.0f} s")


async def run_tasks(
    requests: list[RolloutRequest],
    options: RunOptions,
    console: Console,
    finished: list[RolloutResult] | None = None,
    names: Sequence[str] | None = None,
) -> tuple[list[RolloutResult], float]:
    """The results in submission order and the wall time; ``finished`` gets each result as it
    comes, so that a Ctrl-C still has the ones already done; ``names`` says where each request
    came from (``FILE:LINE``), for the server's refusals."""
    async with service(options, console) as url:
        with RunProgress(console, len(requests), "rollouts") as progress:
            arrived = keeping([] if finished is None else finished, progress.advance)
            start = time.perf_counter()
            requests = [with_job_id(r) for r in requests]  # known here, for the watch
            async with RolloutClient(url, api_key=options.api_key) as client:
                server = client.servers[0].client  # the run's one server
                watch = asyncio.create_task(
                    progress.watch(server.running, {str(r.job_id) for r in requests})
                )
                try:
                    results = await run_requests(
                        client,
                        requests,
                        on_result=arrived,
                        on_interrupt=say_cancelling,
                        names=names,
                    )
                finally:
                    watch.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watch  # (an error of its own is raised here, not lost)
            return results, time.perf_counter() - start


def generated_tokens(result: RolloutResult) -> int:
    return sum(result.trajectory.loss_mask)


def why(result: RolloutResult, width: int = 60) -> str:
    """Why a rollout ended: its error (type, kind and message) or the loop's stop reason."""
    if result.error is not None:
        text = f"{result.error.type} ({result.error.kind}): {result.error.message}"
        return text if len(text) <= width else text[: width - 1] + "…"
    return result.trajectory.stop_reason or ""


def result_table(results: list[RolloutResult], title: str) -> Table:
    """One row a rollout; long cells wrap (fold) rather than being cut, so 80 columns or a log
    file still show the task and why it ended (the task column says its data_source when the
    rows have several)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("task", "state", "reward", "turns", "tokens", "why", "s"):
        numeric = col in ("reward", "turns", "tokens", "s")
        table.add_column(
            col,
            justify="right" if numeric else "left",
            overflow="fold",
            no_wrap=numeric,  # short: they keep their width, why takes the rest
            ratio=1 if col == "why" else None,
        )
    mixed = len({r.data_source for r in results}) > 1
    for r in results:  # what a job says is its submitter's or its policy's: shown, not acted on
        name = str(r.instance_id or r.job_id[:10])
        table.add_row(
            markup(f"{r.data_source}:{name}" if mixed and r.data_source not in name else name),
            markup(r.state),
            "-" if r.reward is None else f"{r.reward:.1f}",
            str(len(r.trajectory.turns)),
            str(generated_tokens(r)),
            markup(why(r)),
            f"{r.timing.total_s:.1f}",
        )
    return table


def summary(results: list[RolloutResult], wall_s: float) -> str:
    states = Counter(r.state for r in results)
    rewards = [r.reward for r in results if r.reward is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"  # none scored: no mean
    passed = sum(1 for r in rewards if r >= PASS_REWARD)
    tokens = sum(generated_tokens(r) for r in results)
    wall_s = max(wall_s, 1e-9)  # an empty task file finishes at once
    return (
        f"{counted(len(results), 'rollout')} in {wall_s:.1f} s"
        f" ({60 * len(results) / wall_s:.1f} per minute,"
        f" {tokens / wall_s:.1f} generated tokens/s):\n"  # two lines, each within 80 columns
        f"mean reward {mean}, pass rate {passed}/{len(rewards)}; "
        + ", ".join(f"{markup(k)} {v}" for k, v in sorted(states.items()))
        + (f" ({infra} of them for infra reasons)" if (infra := len(infra_errors(results))) else "")
    )


def tasks_of(
    results: Sequence[RolloutResult], tasks: Sequence[dict[str, Any]]
) -> list[dict[str, Any] | None]:
    """The task instance each stored result came from: the one with the result's instance_id;
    for a result without one, the task at its place when the file holds one result a task, in
    order (as ``raas run`` writes them), and of the same data_source; else None."""
    instances = [t["instance"] if isinstance(t.get("instance"), dict) else t for t in tasks]
    by_id: dict[str, dict[str, Any]] = {}
    for instance in instances:
        if instance.get("instance_id") is not None:
            by_id.setdefault(str(instance["instance_id"]), instance)
    in_order = len(results) == len(instances)
    found: list[dict[str, Any] | None] = []
    for i, result in enumerate(results):
        if result.instance_id is not None:
            found.append(by_id.get(result.instance_id))
        elif in_order and instances[i].get("data_source") == result.data_source:
            found.append(instances[i])
        else:
            found.append(None)
    return found


def unscorable(result: RolloutResult, instance: dict[str, Any] | None, handler: object) -> str:
    """Why replay cannot re-score a stored result."""
    if instance is None and result.instance_id is not None:
        return "no task with its instance_id"
    if instance is None:
        return (
            "no task at its place (without an instance_id, results are matched to the tasks"
            " one for one, in order)"
        )
    if not isinstance(handler, AgentTask):
        return "no judge for its data_source"
    return "no artifact stored"


async def replay(
    tasks: Sequence[dict[str, Any]], results_file: Path, console: Console
) -> list[tuple[str, float | None, float]]:
    """Re-score stored results with each task's judge (no model): (id, old reward, new)."""
    registry = TaskRegistry.from_entry_points()
    services = TaskServices(llm=BackendPool(), sandbox_config=BwrapConfig())
    rows: list[tuple[str, float | None, float]] = []
    # ResultFileError (a line that is not a result, no such file) names the file and line.
    stored = await asyncio.to_thread(read_results, results_file)
    try:
        for result, instance in zip(stored, tasks_of(stored, tasks), strict=True):
            name = result.instance_id or result.job_id[:10]
            handler = registry.get(result.data_source) if result.data_source in registry else None
            artifact = result.metrics.get("artifact")
            if instance is None or not isinstance(handler, AgentTask) or artifact is None:
                console.print(f"skipping {markup(name)}: {unscorable(result, instance, handler)}")
                continue
            info = await handler.judge(instance, artifact, services)
            rows.append((name, result.reward, info.reward))
    finally:
        await services.close()
    return rows
