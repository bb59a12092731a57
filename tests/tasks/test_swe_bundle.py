"""The bundled SWE-style instances (raas/tasks/data/swe_bundle.jsonl, from
scripts/make_swe_bundle.py) hold real bugs: the FAIL_TO_PASS tests fail on the snapshot, the
PASS_TO_PASS tests pass, and the gold patch applies with git and makes all of them pass."""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = importlib.resources.files("raas.tasks") / "data" / "swe_bundle.jsonl"
FIELDS = {
    "data_source",
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "snapshot",
    "test_command",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "mutation",
    "gold_patch",
}
MUTATION = re.compile(
    r"^(?P<kind>[a-z/ -]+): (?P<path>humaneval_\d{4}/solution\.py) line (?P<line>\d+): "
    r"`(?P<before>.+)` -> `(?P<after>.+)`$"
)
# unittest -v: "test_x (pkg.mod.Class.test_x) ... ok" (3.11+) or "test_x (pkg.mod.Class) ... ok"
VERBOSE_LINE = re.compile(r"^(\w+) \(([\w.]+)\) \.\.\. (ok|FAIL|ERROR)", re.MULTILINE)

ROWS: list[dict[str, Any]] = [json.loads(line) for line in BUNDLE.read_text().splitlines()]


def test_bundle_shape() -> None:
    ids = [row["instance_id"] for row in ROWS]
    assert len(ROWS) >= 20
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    kinds = {m["kind"] for row in ROWS if (m := MUTATION.match(row["mutation"]))}
    assert len(kinds) >= 6


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["instance_id"])
def test_instance_fields(row: dict[str, Any]) -> None:
    assert set(row) == FIELDS
    number = row["instance_id"].removeprefix("humaneval-swe-")
    assert re.fullmatch(r"\d{4}", number)
    pkg = f"humaneval_{number}"
    assert row["data_source"] == "swe"
    assert row["repo"] == f"bundled/{pkg}"
    assert row["base_commit"] is None
    assert row["test_command"] == "python3 -m unittest -v"

    files: dict[str, str] = row["snapshot"]["files"]
    assert set(files) == {
        "README.md",
        f"{pkg}/__init__.py",
        f"{pkg}/solution.py",
        "tests/__init__.py",
        "tests/test_solution.py",
    }
    assert "python3 -m unittest" in files["README.md"]
    assert sum(len(text.encode()) for text in files.values()) < 8192

    methods = re.findall(r"^    def (test_\w+)\(self\):", files["tests/test_solution.py"], re.M)
    all_ids = {f"tests.test_solution.TestSolution.{m}" for m in methods}
    f2p, p2p = row["FAIL_TO_PASS"], row["PASS_TO_PASS"]
    assert f2p and p2p and f2p == sorted(f2p) and p2p == sorted(p2p)
    assert set(f2p).isdisjoint(p2p) and set(f2p) | set(p2p) == all_ids

    m = MUTATION.match(row["mutation"])
    assert m, row["mutation"]
    assert m["path"] == f"{pkg}/solution.py" and m["before"] != m["after"]
    buggy_line = files[m["path"]].splitlines()[int(m["line"]) - 1]
    assert buggy_line.strip() == m["after"]
    # The issue describes the symptom, never the mutated code.
    assert m["after"] not in row["problem_statement"]
    assert row["problem_statement"].count(pkg) >= 1

    patch: str = row["gold_patch"]
    assert patch.startswith(f"diff --git a/{m['path']} b/{m['path']}\n")
    assert f"\n-{buggy_line}\n" in patch
    assert f"\n+{buggy_line.replace(m['after'], m['before'])}\n" in patch


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PYTHON"))}
    env.update(
        PYTHONDONTWRITEBYTECODE="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    return env


def _run(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=_env(), input=stdin, capture_output=True, text=True, timeout=60
    )


def _unittest(repo: Path, ids: list[str]) -> dict[str, str]:
    """test id -> ok / FAIL / ERROR, from ``python3 -m unittest -v <ids>``."""
    proc = _run(repo, sys.executable, "-m", "unittest", "-v", *ids)
    outcomes = {}
    for name, where, status in VERBOSE_LINE.findall(proc.stderr):
        outcomes[where if where.endswith("." + name) else f"{where}.{name}"] = status
    assert set(outcomes) == set(ids), proc.stderr[-2000:]
    assert (proc.returncode == 0) == all(s == "ok" for s in outcomes.values())
    return outcomes


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["instance_id"])
def test_instance_bug_and_fix(row: dict[str, Any], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for rel, text in row["snapshot"]["files"].items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        assert _run(repo, "git", *args).returncode == 0

    f2p, p2p = row["FAIL_TO_PASS"], row["PASS_TO_PASS"]
    before = _unittest(repo, f2p + p2p)
    assert all(before[t] in ("FAIL", "ERROR") for t in f2p), before
    assert all(before[t] == "ok" for t in p2p), before

    applied = _run(repo, "git", "apply", "-", stdin=row["gold_patch"])
    assert applied.returncode == 0, applied.stderr
    after = _unittest(repo, f2p + p2p)
    assert all(status == "ok" for status in after.values()), after


def test_generator_reproduces_bundle(tmp_path: Path) -> None:
    """The JSONL is what the generator makes now (it re-runs every check it relies on)."""
    spec = importlib.util.spec_from_file_location(
        "make_swe_bundle", ROOT / "scripts" / "make_swe_bundle.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_swe_bundle"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        out = tmp_path / "bundle.jsonl"
        assert module.main(["--out", str(out)]) == 0
    finally:
        sys.modules.pop("make_swe_bundle", None)
    assert out.read_text() == BUNDLE.read_text()
