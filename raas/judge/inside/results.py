"""What the judges' test runners (swe_tests.py, swe_pytest.py, swe_django.py) share: their
results channel.

``serve(run)`` reads the runner's JSON request on stdin, keeps stdout as the results channel (not
inherited by any child: ``os.dup`` makes it non-inheritable) and sends fd 1 to stderr, so nothing
the tests print reaches the channel; ``run(request, channel)`` ends with ``send``; then the
process ends at once, no atexit handler of the tests running after it. A runner that fails itself
sends no record and exits 3. The image judge's runners print SWE-bench's markers around the
tests' output (``between_markers``) and send one record of their outcomes (``send_outcomes``).

Standard library only, Python 3.5 or newer (swe_django.py runs on the Python of SWE-bench's
Django images): no f-strings, no variable annotations.
"""

import io
import json
import os
import runpy
import sys
import traceback
import warnings
from typing import Any, Callable, Dict, List

# Bound when the runner starts, before anything of the repository is imported: the patched code
# may replace them in their modules later.
_write, _exit, _dumps = os.write, os._exit, json.dumps
START = ">>>>> Start Test Output"  # swebench.harness.constants' markers
END = ">>>>> End Test Output"


def send(channel: int, record: Dict[str, Any]) -> None:
    """Write ``record`` as one JSON line on the channel."""
    data = (_dumps(record) + "\n").encode()
    while data:
        data = data[_write(channel, data) :]


def between_markers(run_tests: Callable[[], int]) -> int:
    """``run_tests()``'s exit status; what it printed lies between SWE-bench's markers."""
    print(START, flush=True)
    try:
        return run_tests()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        print(END, flush=True)


def run_test_script(
    request: Dict[str, Any], channel: int, script: str, path: List[str], recorder: Any
) -> None:
    """A project's own test runner (Django's runtests.py, SymPy's bin/test) as ``__main__``
    with the request's arguments, ``path`` (and the row's PYTHONPATH, which -I leaves out)
    first on sys.path, between SWE-bench's markers; then the record of ``recorder``'s
    ``outcomes`` and ``canaries``."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = path + extra
    python_environment()
    sys.argv = [script] + [str(arg) for arg in request["args"]]
    exit_code = between_markers(lambda: run_script(script))
    send_outcomes(channel, request["mark"], exit_code, recorder.outcomes, recorder.canaries)


def run_script(path: str) -> int:
    """The script at ``path`` run as ``__main__`` (a test runner: Django's runtests.py, SymPy's
    bin/test); the status its ``sys.exit`` gives, 0 if it returns."""
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code
        # sys.exit(bool(failures)) in Django's older runtests.py: True is status 1
        return int(code) if isinstance(code, int) else (0 if code is None else 1)
    return 0


def python_environment() -> None:
    """What -I makes Python ignore of the row's environment, applied by hand: the encoding of
    its streams (PYTHONIOENCODING, which SWE-bench's Django images export) and its warnings
    filters (PYTHONWARNINGS, which SWE-bench's SymPy command sets)."""
    wanted = os.environ.get("PYTHONIOENCODING")
    if wanted:
        encoding, _, errors = wanted.partition(":")
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            stream.flush()
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(encoding=encoding or None, errors=errors or None)
            else:  # before Python 3.7: a new wrapper over the same buffer
                wrapped = io.TextIOWrapper(
                    stream.buffer, encoding or stream.encoding, errors or None, line_buffering=True
                )
                setattr(sys, name, wrapped)
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    if filters:
        process = getattr(warnings, "_processoptions", None)  # how -W is read
        if process is not None:
            process(filters)


def send_outcomes(
    channel: int, mark: str, exit_code: int, outcomes: List[Any], canaries: Dict[str, str]
) -> None:
    """The image judge's record: the runner's exit status, each outcome, where the canaries
    ran."""
    record = {"mark": mark, "exit_code": exit_code, "outcomes": outcomes, "canaries": canaries}
    send(channel, record)


def serve(run: Callable[[Dict[str, Any], int], None]) -> None:
    request = json.loads(sys.stdin.read())
    channel = os.dup(1)
    os.dup2(2, 1)
    try:
        run(request, channel)
    except BaseException:  # the runner itself failed: no record, and a status that says so
        traceback.print_exc()
        sys.stderr.flush()
        _exit(3)
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(0)
