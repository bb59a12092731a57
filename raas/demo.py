"""``raas demo`` (what ``make demo`` runs): the main job on the embedded default.

It starts the embedded engine with SmolLM2-135M-Instruct and the service, and runs a small mix
of bundled code, SWE-style and math tasks in real bubblewrap sandboxes. The small model rarely
solves one: the rewards are what the tests and answer checks say.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from raas.client.task_files import write_results
from raas.run import CPU_SAMPLING, RunOptions, requests_for, result_table, run_tasks, summary
from raas.tasks.datasets import bundled

DEMO_SAMPLING = {**CPU_SAMPLING, "temperature": 0.7, "top_p": 0.95, "seed": 0}


def run_demo(model: str = "smollm2", workdir: Path = Path("out/demo")) -> int:
    console = Console(width=max(Console().width, 120))
    requests = requests_for(bundled("demo"), DEMO_SAMPLING, timeout_s=300)
    options = RunOptions(model=model, workdir=workdir)
    results, wall = asyncio.run(run_tasks(requests, options, console))
    console.print(result_table(results, f"raas demo: {model} on bundled code, swe and math tasks"))
    console.print(summary(results, wall))
    out = workdir / "results.jsonl"
    write_results(results, out)
    console.print(f"results (trajectories with token ids, masks, logprobs) in {out}")
    return 0 if all(r.state in {"done", "failed", "timeout"} for r in results) else 1
