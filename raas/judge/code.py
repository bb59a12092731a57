"""Code judges: HumanEval's tests, and contest cases (stdin programs and functions).

Both run in a sandbox the agent never touched, and only through ``Sandbox.exec``. HumanEval's
tests run in a process of their own (inside/humaneval.py) that calls the solution in another
(inside/candidate.py). A contest's expected outputs never enter the sandbox: each case is a fresh
process given its input, and the comparison is made here, on the host.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from raas.judge.programs import CandidateEnded, ended, install, python, run_candidate
from raas.judge.reasons import REASON, clip
from raas.judge.values import Unsupported, decode, encode
from raas.sandbox import ExecResult, Sandbox

OUTPUT_FLOOR = 64 * 1024  # bytes a case's program may print beyond twice what is expected


@dataclass(frozen=True)
class Verdict:
    passed: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    # Of a test-running judge: the deciding tests the run says passed (trusted or not: a twin
    # that passed in a forged record passed), and their files as the run had them (twins are
    # made from these).
    passing: frozenset[str] = frozenset()
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One contest test: a program's ``stdin`` or a function's ``args``, and what it must give."""

    expected: Any
    stdin: str | None = None
    args: list[Any] | None = None


def last_json_line(output: str) -> dict[str, Any]:
    """The last line of ``output`` that is a JSON object ({} if none)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return {}


@dataclass(frozen=True)
class HumanEvalCheck:
    """HumanEval's tests: the task's ``prompt`` (its helpers), ``test`` (``def
    check(candidate)``) and ``entry_point``."""

    prompt: str
    test: str
    entry_point: str
    timeout_s: float


@dataclass(frozen=True)
class ContestCases:
    """A contest's cases, for a program (``fn_name`` None) or a function."""

    cases: list[Case]
    fn_name: str | None
    case_timeout_s: float  # one case
    timeout_s: float  # all of them


async def judge_code(
    sandbox: Sandbox, solution: str, path: str, tests: HumanEvalCheck | ContestCases
) -> Verdict:
    """``solution``, written at ``path`` in ``sandbox`` (fresh), against ``tests``."""
    await install(sandbox)
    await sandbox.write_file(path, solution)
    try:
        if isinstance(tests, HumanEvalCheck):
            return await _humaneval(sandbox, path, tests)
        return await _contest(sandbox, path, tests)
    except CandidateEnded as e:
        return Verdict(False, ended(e))


async def _humaneval(sandbox: Sandbox, path: str, check: HumanEvalCheck) -> Verdict:
    """``check(candidate)`` in a process of its own, the solution called in another."""
    mark = secrets.token_hex(16)
    task = {"prompt": check.prompt, "test": check.test, "entry_point": check.entry_point}
    task.update(solution=path, mark=mark)
    run = await run_candidate(
        sandbox, python("humaneval.py"), json.dumps(task), timeout_s=check.timeout_s
    )
    said = last_json_line(run.stdout)
    genuine = run.exit_code == 0 and not run.timed_out and said.get("mark") == mark
    passed = genuine and said.get("passed") is True
    metrics: dict[str, Any] = {"passed": passed, "timed_out": run.timed_out}
    if not passed:
        why = said.get("error") if said.get("mark") == mark else None
        metrics["test_output"] = str(why or _tail(run))[-2000:]
        if run.timed_out:
            metrics[REASON] = f"timed out after {check.timeout_s:g}s"
        elif why:
            metrics[REASON] = clip(f"tests failed: {why}")
        else:  # no verdict line of this run's: the tests' process died, or was made to exit
            metrics[REASON] = f"the tests gave no verdict (exit {run.exit_code})"
    return Verdict(passed, metrics)


async def _contest(sandbox: Sandbox, path: str, contest: ContestCases) -> Verdict:
    """Every case in order, each a fresh process with a time limit; the first failure ends it."""
    cases = contest.cases
    deadline = time.monotonic() + contest.timeout_s
    for i, case in enumerate(cases):
        left = deadline - time.monotonic()
        failure: str | None
        if left <= 0:
            failure = f"the cases took more than {contest.timeout_s:g}s in all"
        else:
            limit = min(contest.case_timeout_s, left)
            if contest.fn_name:
                failure = await _function_case(sandbox, case, contest.fn_name, path, limit)
            else:
                failure = await _program_case(sandbox, case, path, limit)
        if failure is not None:
            metrics: dict[str, Any] = {"passed": False, "tests_passed": i}
            metrics |= {"tests_total": len(cases), "failure": {"case": i, "why": failure}}
            # The first failure ends the run: the cases after it were not run.
            metrics[REASON] = clip(f"case {i + 1} of {len(cases)} failed: {failure}")
            return Verdict(False, metrics)
    return Verdict(True, {"passed": True, "tests_passed": len(cases), "tests_total": len(cases)})


async def _program_case(sandbox: Sandbox, case: Case, path: str, limit: float) -> str | None:
    want = str(case.expected)
    run = await run_candidate(
        sandbox,
        ["python3", path],
        case.stdin or "",
        timeout_s=limit,
        max_output=2 * len(want.encode()) + OUTPUT_FLOOR,
    )
    if run.timed_out:
        return f"timed out after {limit:g}s"
    if run.exit_code != 0:
        return f"exit {run.exit_code}: {run.stderr[-1000:]}"
    if run.stdout_cut_bytes:
        return f"printed {run.stdout_cut_bytes} bytes more than could be expected"
    if not same_output(run.stdout, want):
        return f"printed {run.stdout[:500]!r}, expected {want[:500]!r}"
    return None


async def _function_case(
    sandbox: Sandbox, case: Case, name: str, path: str, limit: float
) -> str | None:
    request = json.dumps({"id": 1, "args": encode(list(case.args or []))})
    argv = python("candidate.py", path, name)
    run = await run_candidate(sandbox, argv, request + "\n", timeout_s=limit)
    if run.timed_out:
        return f"timed out after {limit:g}s"
    reply = last_json_line(run.stdout)
    if reply.get("id") != 1 or "value" not in reply:
        return str(reply.get("error") or f"no answer (exit {run.exit_code})")[:1000]
    try:
        got = _as_json(decode(reply["value"]))
    except Unsupported as e:
        return f"returned a value that does not cross: {e}"
    want = case.expected
    if not (got == want or [got] == want):
        shown = json.dumps(got, default=repr)[:500]
        return f"returned {shown}, expected {json.dumps(want, default=repr)[:500]}"
    return None


def _as_json(value: Any) -> Any:
    """A returned value as the tests' JSON holds it: tuples as lists (as the datasets do)."""
    if isinstance(value, tuple | list):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    return value


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def same_output(got: str, want: str) -> bool:
    """A program's output matches when its lines do (trailing spaces aside), or its tokens."""
    return _lines(got) == _lines(want) or got.split() == want.split()


def _tail(run: ExecResult) -> str:
    if run.timed_out:
        return "timed out"
    return f"exit {run.exit_code}: {(run.stdout + run.stderr)[-2000:]}"
