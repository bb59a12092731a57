"""The image judge's test runner, in the sandbox: pytest in-process, each test's outcome recorded
by pytest's own hooks on a channel the tests' output never reaches.

``python3 -I swe_pytest.py run`` reads one JSON object on stdin: ``args`` (pytest's arguments:
the instance's options and test files), ``path0`` (whether the working directory goes first on
``sys.path``, as ``python -m pytest`` puts it), ``canaries`` (``[{"name", "passes", "a",
"b"}]``), ``seed`` and a ``mark``. Before pytest or anything of the repository is imported it
keeps its stdout as the results channel (not inherited by any child) and sends fd 1 to stderr:
the log, everything pytest and the tests print (``-rA``'s summary lines among it), arrives as
stderr, bracketed by SWE-bench's start and end markers, for SWE-bench's log parser to read.

A plugin object of this program (given to ``pytest.main``, so no name on the command line or in a
configuration file can turn it off) adds the canaries, test functions under random names that
must pass (``a == b``) or must fail (``a != b``), at random places among the collected items, and
records the outcome of every test by node id from ``pytest_runtest_logreport`` (the category
pytest's own ``pytest_report_teststatus`` gives it, as the terminal summary counts it) and every
collection error from ``pytest_collectreport``. When pytest returns, one line goes on the channel:
``{"mark", "exit_code", "outcomes": [[nodeid, category], ...], "canaries": {name: nodeid}}``,
and the program ends at once (no atexit handler of the tests runs after it).

What it cannot exclude: the patched code runs in this process (the tests call it), so code that
sets out to find this plugin in memory can still forge its record. The canaries and the mark make
that a targeted attack on this runner, not a line printed.

Standard library and the image's pytest only, Python 3.7 or newer.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

# -I leaves this directory off sys.path: put it there for the sibling, and take it off again
# (swe_tests lists what is importable from sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results

del sys.path[0]


def canary(spec: dict[str, Any], filename: str) -> Any:
    name = str(spec["name"])
    namespace: dict[str, Any] = {}
    body = f"def {name}():\n    assert {spec['a']!r} == {spec['b']!r}\n"
    exec(compile(body, filename, "exec"), namespace)
    return namespace[name]


class Recorder:
    """The plugin: canaries in, outcomes by node id out."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.specs = request["canaries"]
        self.rng = random.Random(request["seed"])
        self.outcomes: list[list[str]] = []
        self.canaries: dict[str, str] = {}
        self.config: Any = None

    def pytest_configure(self, config: Any) -> None:
        self.config = config

    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list[Any]) -> None:
        import pytest

        modules = []
        for item in items:
            module = item.getparent(pytest.Module)
            if module is not None and module not in modules:
                modules.append(module)
        if not modules:
            return  # nothing collected: the canaries are missing, and the judge says so
        for spec in self.specs:
            module = self.rng.choice(modules)
            fn = canary(spec, str(getattr(module, "fspath", "<canary>")))
            if hasattr(pytest.Function, "from_parent"):
                item = pytest.Function.from_parent(module, name=spec["name"], callobj=fn)
            else:  # pytest before 5.4
                item = pytest.Function(spec["name"], parent=module, callobj=fn)
            self.canaries[spec["name"]] = item.nodeid
            items.insert(self.rng.randint(0, len(items)), item)

    def pytest_runtest_logreport(self, report: Any) -> None:
        status = self.config.hook.pytest_report_teststatus(report=report, config=self.config)
        category = status[0] if isinstance(status, tuple) and status else ""
        if category:
            self.outcomes.append([report.nodeid, str(category)])

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.outcomes.append([report.nodeid, "error"])


def run(request: dict[str, Any], channel: int) -> None:
    # -I leaves PYTHONPATH out; the row's environment (its image, its eval script) may set it.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = ([os.getcwd()] if request.get("path0") else []) + extra
    import pytest

    # After every other plugin's (``-k``, ``--deselect``), so no option deselects a canary.
    hook = pytest.hookimpl(trylast=True)(Recorder.pytest_collection_modifyitems)
    setattr(Recorder, "pytest_collection_modifyitems", hook)  # noqa: B010 (mypy: a method)
    recorder = Recorder(request)
    exit_code = results.between_markers(
        lambda: int(pytest.main(list(request["args"]), plugins=[recorder]))
    )
    results.send_outcomes(channel, request["mark"], exit_code, recorder.outcomes, recorder.canaries)


def main() -> None:
    results.serve(run)


if __name__ == "__main__":
    main()
