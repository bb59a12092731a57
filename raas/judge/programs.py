"""The judges' programs that run in a sandbox (``inside/``), put there before anything runs."""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

from raas.judge.reasons import REASON, clip
from raas.sandbox import ExecResult, Sandbox, SandboxError

# Where the programs go: the judge's sandbox is fresh, so nothing of the candidate has run when
# they are written, and every program imports its siblings before it starts the candidate.
JUDGE_DIR = "/tmp/.raas-judge"
PROGRAMS = (
    "probe.py",
    "values.py",
    "results.py",
    "candidate.py",
    "humaneval.py",
    "swe_tests.py",
    "swe_pytest.py",
    "swe_django.py",
    "swe_sympy.py",
)


@functools.cache
def _source(name: str) -> str:
    # inside/values.py links to the host's module (raas.judge.values): one encoding for both.
    return (importlib.resources.files("raas.judge") / "inside" / name).read_text()


async def install(sandbox: Sandbox) -> None:
    """Write the judges' programs into ``sandbox``."""
    for name in PROGRAMS:
        await sandbox.write_file(f"{JUDGE_DIR}/{name}", _source(name))


def python(program: str, *args: str) -> list[str]:
    """argv that runs one of the programs on the image's python3, isolated (-I: no user site,
    no current directory on the path)."""
    return ["python3", "-I", f"{JUDGE_DIR}/{program}", *args]


class CandidateEnded(Exception):
    """The sandbox died (its action server killed, its processes gone) while the candidate's
    code ran in it: the candidate did that, a policy outcome (reward 0), not an infra failure
    to retry with a fresh sandbox."""


async def run_candidate(
    sandbox: Sandbox, argv: list[str], stdin: str = "", **how: Any
) -> ExecResult:
    """``sandbox.exec`` of a command in which the candidate's code runs (``how``: exec's
    keywords); ``CandidateEnded`` where the sandbox ends under it."""
    try:
        return await sandbox.exec(argv, stdin, **how)
    except SandboxError as e:
        raise CandidateEnded(f"the sandbox ended while the candidate's code ran: {e}") from e


def ended(error: CandidateEnded) -> dict[str, Any]:
    """A judge's metrics for ``error``: not resolved, and why."""
    why = str(error)[:2000]
    return {"passed": False, "resolved": False, "policy_failure": why, REASON: clip(why)}
