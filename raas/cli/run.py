"""The main job: `raas run` (tasks through a service, with progress and a table) and `raas demo`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from raas.cli.output import api_key_option, exit_for_infra, run_keeping
from raas.cli.serve import check_backends, setting_option
from raas.settings import RUN_SETTINGS, defaults

F = Callable[..., Any]
SABOTAGE = click.option(
    "--sabotage",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="With the oracle: the fraction of tasks it answers wrong on purpose (they must score 0).",
)


def check_model(model: str) -> None:
    """A --model the engine cannot start is a usage error, before anything starts."""
    from raas.llm.models import is_model

    if not is_model(model):
        raise click.BadParameter(
            f"{model!r} is not a model: smollm2, tiny, oracle, or a directory with config.json",
            param_hint="--model",
        )


def in_process_settings(f: F) -> F:
    """The settings of ``raas serve`` that the run's own service takes, as flags (raas serve's
    own: the same names, types and help)."""
    for name in reversed(RUN_SETTINGS):
        f = setting_option(name)(f)
    return f


def engine_args(model: str, sabotage: float | None) -> list[str]:
    if sabotage is None:
        return []
    if model != "oracle":
        raise click.UsageError("--sabotage is for the oracle (--model oracle)")
    return ["--sabotage", str(sabotage)]


@click.command(short_help="A mix of bundled tasks end to end on the embedded engine.")
@click.option(
    "--model",
    default=defaults().inference.tokenizer,
    show_default=True,
    help="Model of the engine.",
)
@click.option(
    "--oracle",
    is_flag=True,
    help="Answer with the oracle policy (--model oracle): gold tool-call trajectories, so that"
    " the rewards show the whole path works.",
)
@SABOTAGE
def demo(model: str, oracle: bool, sabotage: float | None) -> None:
    """Start the embedded engine and the service, run a mix of bundled code, SWE-style and math
    tasks in bubblewrap sandboxes, and print the results."""
    from raas.demo import Demo
    from raas.wire import RolloutResult

    model = "oracle" if oracle else model
    check_model(model)
    plan = Demo.of(model, engine_args=engine_args(model, sabotage))
    finished: list[RolloutResult] = []
    results, wall = run_keeping(plan.run(finished), finished, plan.out)
    sys.exit(plan.report(results, wall))


@click.command(
    short_help="Run a task file or a bundled set, with progress and a table.",
    epilog="Without --url, the service started here takes raas serve's options of its"
    " sandboxes, agents and paths (--sandbox ... --sandbox-dir above), and the same variables"
    " for its paths (RAAS_CACHE_DIR, ...); it reads no other RAAS_* setting.",
)
@click.argument("tasks", required=False, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--bundled", "bundled_name", help="A bundled set instead of a file (raas datasets list)."
)
@click.option("--limit", type=int, help="Only the first N tasks.")
@click.option("--url", help="A running raas server; default: start one here.")
@click.option(
    "--task",
    "task_name",
    help="The task (data_source) of rows that name none, e.g. swe for SWE-Gym's and SWE-bench's"
    " own rows; a row's own data_source wins.",
)
@click.option("--llm", multiple=True, help="Inference servers for the in-process service.")
@api_key_option("The --url server's API key")
@click.option(
    "--model",
    default=defaults().inference.tokenizer,
    show_default=True,
    help="Model (and tokenizer) of the embedded engine started when no --llm is given:"
    " smollm2, tiny, oracle (the oracle policy), or a model directory.",
)
@SABOTAGE
@click.option(
    "--sampling-params",
    default=None,
    help="JSON object merged under each task's own. Without --url or --llm (the embedded CPU"
    ' engine) it starts from {"max_tokens": 256, "max_turns": 4}.',
)
@click.option("--timeout-s", type=float, default=600.0, show_default=True, help="Per-job budget.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the results as JSONL (the run's database and engine log go beside it)."
    "  [default: out/run/YYYYmmdd-HHMMSS/results.jsonl, a new directory each run]",
)
@click.option(
    "--replay",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Re-score the results in this file (no model) instead of running.",
)
@in_process_settings
def run(
    tasks: Path | None,
    bundled_name: str | None,
    limit: int | None,
    url: str | None,
    task_name: str | None,
    llm: tuple[str, ...],
    api_key: str | None,
    model: str,
    sabotage: float | None,
    sampling_params: str | None,
    timeout_s: float,
    out: Path | None,
    replay: Path | None,
    **serve: Any,
) -> None:
    """Run TASKS (JSONL or Parquet, raas's or verl's format; or a Harbor task directory, or a
    directory of them) or a bundled set through a service, with a progress bar, a result table
    and a summary; results go to --out as JSONL."""
    from rich.console import Console

    from raas.cli.progress import markup
    from raas.client.task_files import (
        RESULTS_NAME,
        ResultFileError,
        as_requests,
        read_tasks,
        write_results,
    )
    from raas.helpers.files import new_run_dir
    from raas.helpers.terminal import counted
    from raas.paths import host_paths, image_caps, installed
    from raas.run import (
        CPU_SAMPLING,
        RunOptions,
        first_refusal,
        result_table,
        run_tasks,
        summary,
        under_cpu_sampling,
    )
    from raas.run import replay as do_replay
    from raas.settings import SettingsError, flag, validate
    from raas.tasks.datasets import DatasetError, bundled
    from raas.wire import RolloutResult

    if url is None and not llm:
        check_model(model)
    if sabotage is not None and (url or llm):
        raise click.UsageError("--sabotage is for the oracle started here (not with --url/--llm)")
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in serve.items()}
    given = {k: v for k, v in given.items() if v not in (None, [])}
    if url is not None and given:
        flags = ", ".join(flag(name) for name in given)
        raise click.UsageError(f"{flags}: settings of the service started here, not with --url")
    try:  # a bad setting is said before anything starts
        host = {**host_paths().model_dump(exclude_unset=True)}
        host |= image_caps().model_dump(exclude_unset=True)
        settings = validate({**host, **given})
    except SettingsError as e:
        raise click.UsageError(str(e)) from e
    if (tasks is None) == (bundled_name is None):
        why = (
            " (--replay re-scores stored results against the tasks they came from: give those"
            " tasks too)"
            if replay is not None and tasks is None and bundled_name is None
            else ""
        )
        raise click.UsageError(f"give a task file or --bundled NAME (one of them){why}")
    try:
        items = (
            read_tasks(tasks, task_name)
            if tasks is not None
            else [(f"{bundled_name}:{i}", t) for i, t in enumerate(bundled(str(bundled_name)), 1)]
        )
        params = json.loads(sampling_params) if sampling_params else {}
        if not isinstance(params, dict):
            raise json.JSONDecodeError("not an object", str(sampling_params), 0)
        # The oracle is no CPU model: its trajectories take the tasks' own limits.
        on_cpu = url is None and not llm and replay is None and model != "oracle"
        items = items[:limit] if limit else items
        requests = as_requests(items, params, timeout_s)
        if on_cpu:  # under the user's params, each task's own keys only
            requests = under_cpu_sampling(requests)
            params = {**CPU_SAMPLING, **params}  # what the line below says
        if url is None and replay is None:  # refused here, before the engine starts
            refusal = first_refusal(requests, [where for where, _ in items])
            if refusal is not None:
                raise click.UsageError(refusal)
    except json.JSONDecodeError as e:
        raise click.BadParameter(
            f"give a JSON object, as '{{\"temperature\": 0.3}}' ({e})",
            param_hint="--sampling-params",
        ) from e
    except (DatasetError, ValueError) as e:
        raise click.UsageError(str(e)) from e
    if llm and replay is None:  # another raas server, say, would fail every job
        check_backends(list(llm), settings.inference.llm_protocol)
    console = Console()
    if on_cpu:
        console.print(
            f"sampling sized for the CPU engine: {params['max_tokens']} tokens a turn,"
            f" {params['max_turns']} turns, to the tasks that take them (--sampling-params sets"
            " others)"
        )
    if replay is not None:
        with installed(settings.paths, settings.images):
            try:
                rows = asyncio.run(do_replay([task for _, task in items], replay, console))
            except ResultFileError as e:
                raise click.ClickException(str(e)) from e
        for instance_id, old, new in rows:
            console.print(f"{markup(instance_id)}: stored reward {old}, re-scored {new}")
        return
    out = out or new_run_dir(Path("out/run")) / RESULTS_NAME
    options = RunOptions(
        url=url,
        api_key=api_key,
        llm=list(llm),
        model=model,
        workdir=out.parent,
        serve=given,
        engine_args=engine_args(model, sabotage),
    )
    finished: list[RolloutResult] = []
    names = [where for where, _ in items]
    with installed(settings.paths, settings.images):  # the libraries of this process read them
        results, wall = run_keeping(
            run_tasks(requests, options, console, finished, names), finished, out
        )
    console.print(result_table(results, counted(len(results), "rollout")))
    console.print(summary(results, wall))
    write_results(results, out)
    console.print(f"results in {out}")
    exit_for_infra(results)
