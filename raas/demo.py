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
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from raas.cli.progress import markup
from raas.client.task_files import RESULTS_NAME, as_requests, write_results
from raas.helpers.files import new_run_dir
from raas.oracle.sabotage import sabotage_of
from raas.run import CPU_SAMPLING, RunOptions, result_table, run_tasks, summary
from raas.tasks.datasets import bundled
from raas.wire import RolloutResult

DEMO_SAMPLING = {**CPU_SAMPLING, "temperature": 0.7, "top_p": 0.95, "seed": 0}
# The oracle's trajectories take the tasks' own turn limits (up to 6 turns for swe) and write a
# whole patch or function in a turn.
ORACLE_SAMPLING = {"max_tokens": 1024, "seed": 0}


def demo_tasks(model: str) -> list[dict[str, Any]]:
    tasks = bundled("demo")
    if model == "oracle":
        tasks += random.Random(0).sample(bundled("stem"), 2)
    return tasks


@dataclass
class Demo:
    """One demo run: its tasks, where its results go, and what it prints at the end. ``raas
    demo`` runs it as ``raas run`` runs a file (a Ctrl-C keeps what finished)."""

    model: str
    workdir: Path
    engine_args: list[str] = field(default_factory=list)
    console: Console = field(default_factory=lambda: Console(width=max(Console().width, 120)))

    @classmethod
    def of(
        cls,
        model: str = "smollm2",
        workdir: Path | None = None,
        engine_args: list[str] | None = None,
    ) -> Demo:
        """The demo on ``model``; its results, database and engine log go to ``workdir``
        (default: a new directory under out/demo for each run, named for its time and model)."""
        return cls(model, workdir or new_run_dir(Path("out/demo"), model), list(engine_args or []))

    @property
    def out(self) -> Path:
        return self.workdir / RESULTS_NAME

    def run(
        self, finished: list[RolloutResult] | None = None
    ) -> Coroutine[Any, Any, tuple[list[RolloutResult], float]]:
        """The run (results in order, wall time); ``finished`` gets each result as it comes."""
        sampling = ORACLE_SAMPLING if self.model == "oracle" else DEMO_SAMPLING
        tasks = [(f"demo:{i}", t) for i, t in enumerate(demo_tasks(self.model), 1)]
        requests = as_requests(tasks, sampling, timeout_s=300)
        options = RunOptions(model=self.model, workdir=self.workdir, engine_args=self.engine_args)
        return run_tasks(requests, options, self.console, finished)

    def report(self, results: list[RolloutResult], wall_s: float) -> int:
        """Print the table and the summary, write the results; the exit status."""
        oracle = self.model == "oracle"
        kinds = "code, swe, math and stem" if oracle else "code, swe and math"
        self.console.print(
            result_table(results, f"raas demo: {self.model} on bundled {kinds} tasks")
        )
        self.console.print(summary(results, wall_s))
        if oracle:
            self.console.print(sabotaged_line(results, self.engine_args))
        write_results(results, self.out)
        self.console.print(f"results (trajectories with token ids, masks, logprobs) in {self.out}")
        return 0 if all(r.state in {"done", "failed", "timeout"} for r in results) else 1


def run_demo(
    model: str = "smollm2", workdir: Path | None = None, engine_args: list[str] | None = None
) -> int:
    """The demo on ``model`` start to end (``Demo.of``); its exit status."""
    demo = Demo.of(model, workdir, engine_args)
    results, wall = asyncio.run(demo.run())
    return demo.report(results, wall)


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
