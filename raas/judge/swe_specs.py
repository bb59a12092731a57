"""How an image row's tests are run and read: the pytest command, the log parser, the grading.

swebench 5 keeps no table of commands by repository and version: each row of its datasets
carries its own ``eval_script`` (the bash script its harness runs in the image: set-up, the test
patch, the test command between its ``>>>>> Start Test Output`` and ``>>>>> End Test Output``
markers), ``log_parser`` (a name in ``PARSER_REGISTRY``) and ``eval_type``. A row that carries
them is run with its own pytest command; a row that does not (SWE-bench's earlier datasets,
SWE-Gym) is run as ``python3 -m pytest -rA`` on the files of its FAIL_TO_PASS and PASS_TO_PASS
tests and read with ``parse_log_pytest``. A command that is not pytest (Django's
``tests/runtests.py``, SymPy's ``bin/test``, tox) cannot carry the judge's recording plugin, so
such a row is not judged here (``UnsupportedTests``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

DEFAULT_PARSER = "parse_log_pytest"
PASS_AND_FAIL = "pass_and_fail"
# The markers as swebench.harness.constants has them; an eval script writes each on a line of
# its own (``: '>>>>> Start Test Output'`` or ``echo '...'``).
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PYTEST = {"pytest", "py.test"}
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Where a SWE-bench image keeps its environment (``conda activate testbed``); a directory that is
# not there costs nothing. Never a directory under the repository: the patch could put a
# ``python3`` there.
PATH = "/opt/miniconda3/envs/testbed/bin:/usr/local/bin:/usr/bin:/bin"


class UnsupportedTests(ValueError):
    """The row's tests are not run with pytest: this judge cannot record them."""


@dataclass(frozen=True)
class RunPlan:
    """pytest's arguments and how its log is read and graded (swebench's names)."""

    args: list[str]
    path0: bool = True  # the working directory first on sys.path, as ``python -m pytest``
    env: dict[str, str] = field(default_factory=lambda: {"PATH": PATH})
    log_parser: str = DEFAULT_PARSER
    eval_type: str = PASS_AND_FAIL


def files_of(test_ids: list[str]) -> list[str]:
    """The files of pytest node ids (``tests/test_x.py::T::test_y[1]``), in order, once."""
    return list(dict.fromkeys(test_id.split("::", 1)[0] for test_id in test_ids))


def plan(
    test_ids: list[str],
    eval_script: str | None = None,
    log_parser: str | None = None,
    eval_type: str | None = None,
) -> RunPlan:
    """How to run ``test_ids``: the eval script's pytest command where the row has one, else
    ``python3 -m pytest -rA`` on their files."""
    parser, grading = log_parser or DEFAULT_PARSER, eval_type or PASS_AND_FAIL
    if not eval_script:
        return RunPlan(["-rA", *files_of(test_ids)], log_parser=parser, eval_type=grading)
    argv = _test_command(eval_script)
    env = {"PATH": PATH}
    while argv and ASSIGNMENT.match(argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    if argv[:1] and argv[0].rsplit("/", 1)[-1] in PYTEST:
        args, path0 = argv[1:], False
    elif (
        len(argv) >= 3
        and PYTHON.match(argv[0].rsplit("/", 1)[-1])
        and argv[1:3] == ["-m", "pytest"]
    ):
        args, path0 = argv[3:], True
    else:
        raise UnsupportedTests(f"the row's tests run with {shlex.join(argv)!r}, not pytest")
    if not any(a.startswith("-r") for a in args):
        args = ["-rA", *args]  # the summary lines SWE-bench's parsers read
    return RunPlan(args, path0, env, parser, grading)


def _test_command(eval_script: str) -> list[str]:
    lines = eval_script.splitlines()
    start = next((i for i, line in enumerate(lines) if START in line), None)
    end = next((i for i, line in enumerate(lines) if END in line and i > (start or 0)), None)
    if start is None or end is None:
        raise UnsupportedTests("the row's eval_script has no test output markers")
    commands = [line.strip() for line in lines[start + 1 : end] if line.strip()]
    if len(commands) != 1:
        raise UnsupportedTests(f"the row's eval_script runs {len(commands)} test commands")
    try:
        return shlex.split(commands[0])
    except ValueError as e:
        raise UnsupportedTests(f"the row's test command cannot be read: {e}") from e
