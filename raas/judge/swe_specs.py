"""How an image row's tests are run and read: the test command, the log parser, the grading.

swebench 5 keeps no table of commands by repository and version: each row of its datasets
carries its own ``eval_script`` (the bash script its harness runs in the image: set-up, the test
patch, the test command between its ``>>>>> Start Test Output`` and ``>>>>> End Test Output``
markers), ``log_parser`` (a name in ``PARSER_REGISTRY``) and ``eval_type``. A row that carries
them is run with its own test command (and the ``export``s its script makes before it); a row
that does not (SWE-bench's earlier datasets, SWE-Gym) is run as those datasets were: a Django
row with the command swebench 4's ``MAP_REPO_VERSION_TO_SPECS`` gave its version and the test
directives its ``get_test_directives`` took from the row's test patch, read with
``parse_log_django``; a SymPy row with swebench 4's ``bin/test -C --verbose`` on its test
patch's files, read with ``parse_log_sympy``; any other row as ``python3 -m pytest -rA`` on the
files of its FAIL_TO_PASS and PASS_TO_PASS tests, read with ``parse_log_pytest``.

Three runners record the tests' outcomes: pytest (inside/swe_pytest.py), Django's own
``tests/runtests.py`` (inside/swe_django.py) and SymPy's ``bin/test`` (inside/swe_sympy.py),
each in-process with the judge's hooks. A command that is none of them cannot carry them, so
such a row is not judged here (``UnsupportedTests``): tox, shell pipelines.
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
DJANGO, DJANGO_PARSER = "django", "parse_log_django"
RUNTESTS = "tests/runtests.py"  # Django's own runner, from the repository's root
SYMPY, SYMPY_PARSER = "sympy", "parse_log_sympy"
BIN_TEST = "bin/test"  # SymPy's own runner
# swebench 4's SPECS_SYMPY: every version's command (TEST_SYMPY).
SYMPY_TEST = "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose"
EXPORT = re.compile(r"^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# swebench 4's MAP_REPO_VERSION_TO_SPECS["django/django"] (swebench 5 dropped the table for the
# rows' own eval scripts): the test command by version, and the variables its eval_commands
# export before it (the versions whose images generate a locale for them).
DJANGO_TEST = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
_LOCALE = {"LANG": "en_US.UTF-8", "LC_ALL": "en_US.UTF-8", "LANGUAGE": "en_US:en"}
_OLD = ("1.7", "1.8", "1.9", "1.10", "1.11", "2.0", "2.1", "2.2")
_NEW = ("3.0", "3.1", "3.2", "4.0", "4.1", "4.2", "5.0", "5.1", "5.2")
DJANGO_TEST_CMD = {v: DJANGO_TEST for v in ("1.4", "1.5", "1.6", *_OLD, *_NEW)}
DJANGO_TEST_CMD["1.9"] = "./tests/runtests.py --verbosity 2"
DJANGO_ENV = {v: {**_LOCALE, "PYTHONIOENCODING": "utf8"} for v in _OLD}
DJANGO_ENV |= {v: dict(_LOCALE) for v in ("3.0", "3.1", "3.2")}
# swebench.harness.constants.NON_TEST_EXTS (swebench is an extra: raas.tasks.swe reads rows
# without it): files of a test patch that get_test_directives leaves out.
NON_TEST_EXTS = (
    *(".json", ".png", "csv", ".txt", ".md", ".jpg"),
    *(".jpeg", ".pkl", ".yml", ".yaml", ".toml"),
)
DIFF_TARGET = re.compile(r"diff --git a/.* b/(.*)")
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# Where a SWE-bench image keeps its environment (``conda activate testbed``); a directory that is
# not there costs nothing. Never a directory under the repository: the patch could put a
# ``python3`` there.
PATH = "/opt/miniconda3/envs/testbed/bin:/usr/local/bin:/usr/bin:/bin"


class UnsupportedTests(ValueError):
    """The row's tests are not run with pytest or Django's runtests.py: this judge cannot
    record them."""


@dataclass(frozen=True)
class RunPlan:
    """The runner's arguments and how its log is read and graded (swebench's names)."""

    args: list[str]
    path0: bool = True  # the working directory first on sys.path, as ``python -m pytest``
    env: dict[str, str] = field(default_factory=lambda: {"PATH": PATH})
    log_parser: str = DEFAULT_PARSER
    eval_type: str = PASS_AND_FAIL
    runner: str = "pytest"  # or DJANGO (tests/runtests.py), SYMPY (bin/test), with ``args``


def files_of(test_ids: list[str]) -> list[str]:
    """The files of pytest node ids (``tests/test_x.py::T::test_y[1]``), in order, once."""
    return list(dict.fromkeys(test_id.split("::", 1)[0] for test_id in test_ids))


def django_labels(test_patch: str) -> list[str]:
    """swebench 4's ``get_test_directives`` for a Django row: the test modules its test patch
    touches, as runtests.py's labels (``tests/a/tests.py`` -> ``a.tests``)."""
    directives = []
    for path in DIFF_TARGET.findall(test_patch):
        if path.endswith(NON_TEST_EXTS) or not _is_django_test_file(path):
            continue
        path = path[: -len(".py")] if path.endswith(".py") else path
        path = path[len("tests/") :] if path.startswith("tests/") else path
        directives.append(path.replace("/", "."))
    return directives


def _is_django_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name == "tests.py" or name.startswith("test_") or "/tests/" in path or "/test_" in path


def plan(
    test_ids: list[str],
    eval_script: str | None = None,
    log_parser: str | None = None,
    eval_type: str | None = None,
    *,
    repo: str | None = None,
    version: str | None = None,
    test_patch: str = "",
) -> RunPlan:
    """How to run ``test_ids``: the eval script's test command where the row has one, else the
    command SWE-bench gave the row's repository and version."""
    grading = eval_type or PASS_AND_FAIL
    if not eval_script:
        if repo == "django/django":
            return _django_plan(version, test_patch, log_parser, grading)
        if repo == "sympy/sympy":
            return _sympy_plan(test_patch, log_parser, grading)
        parser = log_parser or DEFAULT_PARSER
        return RunPlan(["-rA", *files_of(test_ids)], log_parser=parser, eval_type=grading)
    argv = _test_command(eval_script)
    env = {"PATH": PATH, **_exports(eval_script)}
    while argv and ASSIGNMENT.match(argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    if _runs(argv, RUNTESTS):
        args = argv[1:] if _is(argv[0], RUNTESTS) else argv[2:]
        parser = log_parser or DJANGO_PARSER
        return RunPlan(args, False, env, parser, grading, DJANGO)
    if _runs(argv, BIN_TEST):
        args = argv[1:] if _is(argv[0], BIN_TEST) else argv[2:]
        return RunPlan(args, False, env, log_parser or SYMPY_PARSER, grading, SYMPY)
    parser = log_parser or DEFAULT_PARSER
    if argv[:1] and argv[0].rsplit("/", 1)[-1] in PYTEST:
        args, path0 = argv[1:], False
    elif (
        len(argv) >= 3
        and PYTHON.match(argv[0].rsplit("/", 1)[-1])
        and argv[1:3] == ["-m", "pytest"]
    ):
        args, path0 = argv[3:], True
    else:
        raise UnsupportedTests(
            f"the row's tests run with {shlex.join(argv)!r}, not pytest, Django's runtests.py"
            " or SymPy's bin/test"
        )
    if not any(a.startswith("-r") for a in args):
        args = ["-rA", *args]  # the summary lines SWE-bench's parsers read
    return RunPlan(args, path0, env, parser, grading)


def _django_plan(
    version: str | None, test_patch: str, log_parser: str | None, grading: str
) -> RunPlan:
    if version not in DJANGO_TEST_CMD:
        raise UnsupportedTests(f"SWE-bench gives no test command for Django {version!r}")
    directives = django_labels(test_patch)
    if not directives:
        raise UnsupportedTests("the row's test patch touches no Django test module")
    args = shlex.split(DJANGO_TEST_CMD[version])[1:] + directives
    env = {"PATH": PATH, **DJANGO_ENV.get(version, {})}
    return RunPlan(args, False, env, log_parser or DJANGO_PARSER, grading, DJANGO)


def _sympy_plan(test_patch: str, log_parser: str | None, grading: str) -> RunPlan:
    """swebench 4's command for every SymPy version, on the files of the row's test patch (its
    ``get_test_directives``: them as they are)."""
    files = [p for p in DIFF_TARGET.findall(test_patch) if not p.endswith(NON_TEST_EXTS)]
    if not files:
        raise UnsupportedTests("the row's test patch touches no SymPy test file")
    argv = shlex.split(SYMPY_TEST)
    name, _, value = argv[0].partition("=")
    env = {"PATH": PATH, name: value}
    return RunPlan([*argv[2:], *files], False, env, log_parser or SYMPY_PARSER, grading, SYMPY)


def _is(arg: str, script: str) -> bool:
    return arg in (script, f"./{script}")


def _runs(argv: list[str], script: str) -> bool:
    """``./script ...``, ``script ...`` or ``python script ...``, from the root."""
    if argv[:1] and _is(argv[0], script):
        return True
    python = len(argv) >= 2 and bool(PYTHON.match(argv[0].rsplit("/", 1)[-1]))
    return python and _is(argv[1], script)


def _exports(eval_script: str) -> dict[str, str]:
    """The variables the script exports before its test command (a Django image's locale), as
    the shell would read the value; never PATH, which stays the judge's."""
    env = {}
    for line in eval_script.split(START, 1)[0].splitlines():
        found = EXPORT.match(line.strip())
        if found is None or found[1] == "PATH":
            continue
        try:
            words = shlex.split(found[2])
        except ValueError:
            continue
        if len(words) == 1:
            env[found[1]] = words[0]
    return env


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
