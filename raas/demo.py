"""``raas demo`` (what ``make demo`` runs): the main job on the embedded default.

It starts the embedded engine with SmolLM2-135M-Instruct and the service, and runs a small mix
of bundled code, SWE-style and math tasks in real bubblewrap sandboxes. The small model rarely
solves one: the rewards are what the tests and answer checks say.

``raas demo --oracle`` runs the same mix, and two stem questions, with the oracle policy
(``raas.oracle``) in the engine's place: gold tool-call trajectories through the same path, so
every reward is 1.0 unless ``--sabotage`` makes some answers wrong on purpose (those must be 0.0).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from rich.console import Console

from raas.client.task_files import as_requests, markup, write_results
from raas.helpers import new_run_dir
from raas.oracle.sabotage import sabotage_of
from raas.run import CPU_SAMPLING, RunOptions, result_table, run_tasks, summary
from raas.tasks.datasets import bundled

DEMO_SAMPLING = {**CPU_SAMPLING, "temperature": 0.7, "top_p": 0.95, "seed": 0}
# The oracle's trajectories take the tasks' own turn limits (up to 6 turns for swe) and write a
# whole patch or function in a turn.
ORACLE_SAMPLING = {"max_tokens": 1024, "seed": 0}


def demo_tasks(model: str) -> list[dict[str, Any]]:
    tasks = bundled("demo")
    if model == "oracle":
        tasks += random.Random(0).sample(bundled("stem"), 2)
    return tasks


def run_demo(
    model: str = "smollm2", workdir: Path | None = None, engine_args: list[str] | None = None
) -> int:
    """The demo on ``model``; its results, database and engine log go to ``workdir`` (default:
    a new directory under out/demo for each run, named for its time and model)."""
    workdir = workdir or new_run_dir(Path("out/demo"), model)
    console = Console(width=max(Console().width, 120))
    sampling = ORACLE_SAMPLING if model == "oracle" else DEMO_SAMPLING
    tasks = [(f"demo:{i}", t) for i, t in enumerate(demo_tasks(model), 1)]
    requests = as_requests(tasks, sampling, timeout_s=300)
    options = RunOptions(model=model, workdir=workdir, engine_args=list(engine_args or []))
    results, wall = asyncio.run(run_tasks(requests, options, console))
    kinds = "code, swe, math and stem" if model == "oracle" else "code, swe and math"
    console.print(result_table(results, f"raas demo: {model} on bundled {kinds} tasks"))
    console.print(summary(results, wall))
    if model == "oracle":
        console.print(sabotaged_line(results, options.engine_args))
    out = workdir / "results.jsonl"
    write_results(results, out)
    console.print(f"results (trajectories with token ids, masks, logprobs) in {out}")
    return 0 if all(r.state in {"done", "failed", "timeout"} for r in results) else 1


def sabotaged_line(results: list[Any], engine_args: list[str]) -> str:
    """Which rollouts the oracle answered wrong on purpose (they must score 0.0)."""
    fraction = float(engine_args[engine_args.index("--sabotage") + 1]) if engine_args else 0.0
    wrong = [
        f"{markup(r.instance_id)} ({way}: reward {r.reward})"
        for r in results
        if (way := sabotage_of(r.data_source, str(r.instance_id), fraction, 0)) is not None
    ]
    if not wrong:
        return "the oracle answered every task with its gold trajectory (each should score 1.0)"
    return "answered wrong on purpose (each should score 0.0): " + ", ".join(wrong)
