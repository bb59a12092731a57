"""The image judge's runner for SymPy's own tests, in the sandbox: ``bin/test`` in-process, each
test's outcome recorded from SymPy's test reporter by the test function's name, on a channel the
tests' output never reaches.

``python3 -I swe_sympy.py run`` reads one JSON object on stdin, from the repository's root:
``args`` (bin/test's arguments: the instance's options and test files), ``canaries``, ``seed``
and a ``mark``, as swe_django.py does; the log (what bin/test and the tests print) arrives as
stderr between SWE-bench's markers, for SWE-bench's SymPy log parser to read.

bin/test runs as ``__main__`` (its directory first on ``sys.path``, as Python puts a script's),
sets its environment (``-C``: no cache), imports ``sympy`` and calls ``sympy.test``. When SymPy's
runner module is imported (``sympy.testing.runtests``, ``sympy.utilities.runtests`` before 1.6),
an import hook of this program, placed before anything of the repository is imported, wraps:

- its ``run_in_subprocess_with_hash_randomization``, to answer that it cannot (its documented
  answer where hash randomization is unavailable), so that ``sympy.test`` runs the tests in this
  process, with this interpreter's own random hash seed, instead of starting another;
- ``PyTestReporter``'s ``entering_test`` and the methods that report an outcome (``test_pass``,
  ``test_fail``, ``test_exception``, ``test_skip``, ``test_xfail``, ``test_xpass``), recording
  each outcome by the test function's name, which SWE-bench's rows use, in the reporter's own
  words: ``ok``, ``F``, ``E``, ``T`` (a timeout), ``s``, ``f``, ``X``;
- ``SymPyTests.test_file``, to run the canaries (a test file each, outside the repository, under
  random names; two must pass, two must fail; each followed by a test that passes, since
  SWE-bench's parser does not read the line of a file's last test, which the reporter ends with
  the file's ``[OK]`` or ``[FAIL]``) before files chosen at random among those the run selected,
  through the same ``test_file``.

When bin/test ends, one line goes on the channel, as swe_django.py's: ``{"mark", "exit_code",
"outcomes": [[name, category], ...], "canaries": {spec name: test name}}``.

What it cannot exclude, as the other runners cannot: the patched code runs in this process, so
code that sets out to find these wrappers in memory can still forge the record.

Standard library only, Python 3.5 or newer: no f-strings, no variable annotations.
"""

import importlib.abc
import os
import random
import sys
import tempfile
from typing import Any, Dict

# -I leaves this directory off sys.path: put it there for the sibling, and take it off again.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results

del sys.path[0]

BIN_TEST = os.path.join("bin", "test")
RUNNER_MODULES = ("sympy.testing.runtests", "sympy.utilities.runtests")
OUTCOMES = {
    "test_pass": "ok",
    "test_fail": "F",
    "test_skip": "s",
    "test_xfail": "f",
    "test_xpass": "X",
}
_str, _getattr = str, getattr


class Recorder:
    """Canaries among the files, outcomes out of the reporter."""

    def __init__(self, request: Dict[str, Any]) -> None:
        self.specs = request["canaries"]
        self.rng = random.Random(request["seed"])
        self.outcomes = []  # type: list[list[str]]
        self.canaries = {}  # type: dict[str, str]
        self.current = None  # type: Any
        self.before = {}  # type: dict[int, list[str]]  # file index -> canary files
        self.seen = 0
        self.hooked = False

    def schedule(self, count: int) -> None:
        """Where the canaries run: before files chosen at random among ``count``."""
        if count == 0 or self.before:
            return  # nothing selected: the canaries are missing, and the judge says so
        where = tempfile.mkdtemp()
        for spec in self.specs:
            name = str(spec["name"])
            path = os.path.join(where, name + ".py")
            # A test after it: SymPy's reporter ends a file's last line with its [OK] or
            # [FAIL], and SWE-bench's parser does not read that line.
            after = "test_" + format(self.rng.getrandbits(40), "010x")
            with open(path, "w") as f:
                f.write("def " + name + "():\n    assert " + repr(spec["a"]) + " == ")
                f.write(repr(spec["b"]) + "\n\n\ndef " + after + "():\n    pass\n")
            self.before.setdefault(self.rng.randrange(count), []).append(path)
            self.canaries[name] = name

    def record(self, category: str) -> None:
        if self.current is not None:
            self.outcomes.append([self.current, category])
        self.current = None

    def hook(self, runtests: Any) -> None:
        """Wrap what SymPy's runner module ``runtests`` reports and runs."""
        if self.hooked:
            return
        self.hooked = True
        recorder = self
        runtests.run_in_subprocess_with_hash_randomization = lambda *a, **k: False
        reporter, tests = runtests.PyTestReporter, runtests.SymPyTests
        entering, entering_file = reporter.entering_test, reporter.entering_filename

        def entering_test(self: Any, f: Any) -> Any:
            recorder.current = _str(_getattr(f, "__name__", f))
            return entering(self, f)

        def entering_filename(self: Any, *args: Any) -> Any:
            recorder.current = None  # an error outside a test is not a test's
            return entering_file(self, *args)

        reporter.entering_test = entering_test
        reporter.entering_filename = entering_filename
        for method, category in OUTCOMES.items():
            setattr(reporter, method, self._reporting(_getattr(reporter, method), category))
        exception = reporter.test_exception

        def test_exception(self: Any, exc_info: Any) -> Any:
            timed_out = _getattr(exc_info[0], "__name__", "") == "TimeOutError"
            recorder.record("T" if timed_out else "E")
            return exception(self, exc_info)

        reporter.test_exception = test_exception
        run_tests, test_file = tests.test, tests.test_file

        def test(self: Any, *args: Any, **kwargs: Any) -> Any:
            recorder.schedule(len(self._testfiles))
            return run_tests(self, *args, **kwargs)

        def placing_test_file(self: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
            for canary in recorder.before.pop(recorder.seen, []):
                test_file(self, canary, *args, **kwargs)
            recorder.seen += 1
            return test_file(self, filename, *args, **kwargs)

        tests.test = test
        tests.test_file = placing_test_file

    def _reporting(self, original: Any, category: str) -> Any:
        recorder = self

        def report(self: Any, *args: Any, **kwargs: Any) -> Any:
            recorder.record(category)
            return original(self, *args, **kwargs)

        return report


class RunnerHook(importlib.abc.MetaPathFinder):
    """Hooks SymPy's runner module as soon as it has been executed (bin/test imports sympy
    after setting its environment, so this program must not import it first)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in RUNNER_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                self._wrap(spec.loader)
                return spec
        return None

    def _wrap(self, loader: Any) -> None:
        execute, recorder = loader.exec_module, self.recorder

        def exec_module(module: Any) -> None:
            execute(module)
            if hasattr(module, "PyTestReporter") and hasattr(module, "SymPyTests"):
                recorder.hook(module)

        loader.exec_module = exec_module


def run(request: Dict[str, Any], channel: int) -> None:
    recorder = Recorder(request)
    sys.meta_path.insert(0, RunnerHook(recorder))
    bin_dir = os.path.join(os.getcwd(), "bin")
    results.run_test_script(request, channel, BIN_TEST, [bin_dir], recorder)


def main() -> None:
    results.serve(run)


if __name__ == "__main__":
    main()
