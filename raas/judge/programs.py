"""The judges' programs that run in a sandbox (``inside/``), put there before anything runs."""

from __future__ import annotations

import functools
import importlib.resources

from raas.sandbox import Sandbox

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
