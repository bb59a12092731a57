"""HumanEval's judge, in the sandbox: the tests run here, the solution in a process of its own.

``python3 -I humaneval.py`` reads one JSON object on stdin: the task's own ``prompt`` (whose
helpers the tests may call), its ``test`` (``def check(candidate)``), the ``entry_point``, the
solution's path and a ``mark``. It makes itself non-dumpable (its child cannot read its memory
under /proc nor ptrace it), starts candidate.py on the solution, and runs ``check`` on a proxy
whose calls go to that process and whose results come back as plain values (values.py). It
prints ``{"mark", "passed", "error"?}``; only this process writes to its stdout.

So the solution never shares a process with the tests: it cannot read the tests or the mark,
patch a builtin the tests use, return an object that equals anything, or redefine a helper of
the prompt (the helpers are the task's, defined here). Nor can it hand this process code: the
directory it shares with the candidate leaves ``sys.path`` before the candidate starts, so a
module planted there is never what the tests import.

Standard library only, Python 3.8 or newer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from typing import Any

# This directory is on the path only for the sibling's import: the candidate runs as the same
# uid and can write here, and a module it plants must never be what a later import of the tests
# (``import statistics`` after a first call) finds.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from values import decode, encode

HERE = sys.path.pop(0)

PR_SET_DUMPABLE = 4


def protect_self() -> None:
    import ctypes

    if ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


class CandidateFailed(Exception):
    """The solution raised, returned what does not cross, or its process died."""


class Candidate:
    """The solution's function, called in its own process."""

    def __init__(self, solution: str, name: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", os.path.join(HERE, "candidate.py"), solution, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=os.path.dirname(solution),
            universal_newlines=True,
        )
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        request = {"id": self.calls, "args": encode(list(args))}
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it has ended: what it said first (why the solution did not load) is read next
        line = self.process.stdout.readline()
        if not line:
            raise CandidateFailed("the solution's process ended")
        reply = json.loads(line)
        if reply.get("id") is None and "error" in reply:  # the solution did not load
            raise CandidateFailed(str(reply["error"]))
        if reply.get("id") != self.calls:
            raise CandidateFailed(
                "the solution answered out of turn: {}".format(reply.get("error"))
            )
        if "error" in reply:
            raise CandidateFailed(str(reply["error"]))
        return decode(reply["value"])

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def failure(error: Exception, test: str) -> str:
    """What failed, and the test's line where it did."""
    what = "the solution failed" if isinstance(error, CandidateFailed) else type(error).__name__
    # No source lines are looked up: "test" would be read from a file of that name, the
    # candidate's to write.
    frames = traceback.StackSummary.extract(
        traceback.walk_tb(error.__traceback__), lookup_lines=False
    )
    lines = [f.lineno for f in frames if f.filename == "test"]
    where = ""
    if lines and lines[-1] and 0 < lines[-1] <= len(test.splitlines()):
        where = f" (test line {lines[-1]}: {test.splitlines()[lines[-1] - 1].strip()})"
    return f"{what}: {error}{where}"


def run(task: dict[str, Any]) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "humaneval_check"}
    exec(compile(task["prompt"], "prompt", "exec"), namespace)
    exec(compile(task["test"], "test", "exec"), namespace)
    candidate = Candidate(task["solution"], task["entry_point"])
    namespace[task["entry_point"]] = candidate  # a test may call it by name
    try:
        namespace["check"](candidate)
    except Exception as e:
        return {"passed": False, "error": failure(e, task["test"])}
    finally:
        candidate.close()
    return {"passed": True}


def main() -> None:
    protect_self()
    task = json.loads(sys.stdin.read())
    verdict = run(task)
    print(json.dumps({"mark": task["mark"], **verdict}))


if __name__ == "__main__":
    main()
