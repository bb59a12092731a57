"""The image judge's runner for Django's own tests, in the sandbox: ``tests/runtests.py``
in-process, each test's outcome recorded from unittest's result object by the test's name, on a
channel the tests' output never reaches.

``python3 -I swe_django.py run`` reads one JSON object on stdin, from the repository's root:
``args`` (runtests.py's arguments: the instance's options and test labels), ``canaries``
(``[{"name", "passes", "a", "b"}]``), ``seed`` and a ``mark``. As swe_pytest.py does, before
anything of the repository is imported it keeps its stdout as the results channel and sends fd 1
to stderr: the log (what runtests.py, unittest and the tests print) arrives as stderr, bracketed
by SWE-bench's start and end markers, for SWE-bench's Django log parser to read.

runtests.py runs as ``__main__`` with ``tests/`` first on ``sys.path`` (as Python puts a script's
directory), then the repository's root: the repository's own ``django``, as patched, is the one
tested, also in an image that installed a copy of it (SWE-bench reinstalls it after the patch
for those versions). Before it runs, two methods of ``unittest.TextTestRunner`` (the runner
Django's DiscoverRunner runs its suite with, in every version since 1.6) are wrapped:

- ``run`` adds the canaries to the suite it is given, after Django's own selection (labels,
  tags, ``-k``, ``--reverse``): ``unittest.TestCase`` classes under random names, each with one
  test that must pass (``a == b``) or must fail (``a != b``), at random places between two test
  classes (never inside one, where unittest would run a class's fixtures again), each in the
  module of the test before it. A parallel suite (``--parallel`` above 1: SWE-bench's commands
  say ``--parallel 1``) gets none, and the judge says they are missing.
- ``_makeResult`` wraps the result's ``add*`` methods, so that each outcome is recorded by the
  name unittest's verbose output gives the test and SWE-bench's ``parse_log_django`` reads:
  the first line of its docstring where the runner shows descriptions, else ``str(test)``
  (``test_x (app.tests.SomeTests)``; Python 3.11 writes ``test_x (app.tests.SomeTests.test_x)``).

When runtests.py ends (its ``sys.exit`` or its return), one line goes on the channel:
``{"mark", "exit_code", "outcomes": [[name, id, category], ...], "canaries": {spec name: test
name}}``, ``category`` one of ``ok``, ``FAIL``, ``ERROR``, ``skipped``, ``expected failure``,
``unexpected success`` (unittest's own words), and the program ends at once.

What it cannot exclude, as swe_pytest.py cannot: the patched code runs in this process, so code
that sets out to find these wrappers in memory can still forge the record; the canaries and the
mark make that a targeted attack on this runner, not a line printed.

Standard library only, Python 3.5 or newer (SWE-bench's images of Django 1.x-2.2 have 3.5, of
3.x 3.6): no f-strings, no variable annotations.
"""

import os
import random
import sys
import unittest
import unittest.case
from typing import Any, Dict

# -I leaves this directory off sys.path: put it there for the sibling, and take it off again.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results

del sys.path[0]

RUNTESTS = os.path.join("tests", "runtests.py")
# unittest's own words for each outcome, by the result method that reports it.
CATEGORIES = {
    "addSuccess": "ok",
    "addFailure": "FAIL",
    "addError": "ERROR",
    "addSkip": "skipped",
    "addExpectedFailure": "expected failure",
    "addUnexpectedSuccess": "unexpected success",
}
# Bound now: the patched code may replace them on their classes later.
_SUBTEST = unittest.case.__dict__["_SubTest"]  # private: typeshed does not name it
_STR = {cls: cls.__dict__["__str__"] for cls in (unittest.TestCase, _SUBTEST)}
_SHORT = {cls: cls.__dict__["shortDescription"] for cls in _STR}
_isinstance, _type, _str = isinstance, type, str


def _defined(test: Any, attribute: str, originals: Dict[type, Any]) -> Any:
    """``attribute`` of ``test`` as its class defines it, unittest's own where it is unittest's."""
    for cls in _type(test).__mro__:
        if attribute in cls.__dict__:
            return originals.get(cls, cls.__dict__[attribute])
    return None


def name_of(test: Any, descriptions: bool) -> str:
    """The name unittest's verbose output shows for ``test`` (the line SWE-bench reads)."""
    text = _defined(test, "__str__", _STR)
    shown = _str(text(test)) if text is not None else _str(test)
    short = _defined(test, "shortDescription", _SHORT)
    doc = short(test) if descriptions and short is not None else None
    return _str(doc) if doc else shown


def _first_class(item: Any) -> Any:
    while _isinstance(item, unittest.TestSuite):
        item = next(iter(item), None)
    return _type(item)


def _last_class(item: Any) -> Any:
    while _isinstance(item, unittest.TestSuite):
        tests = list(item)
        item = tests[-1] if tests else None
    return _type(item)


def canary(spec: Dict[str, Any], module: str, rng: random.Random) -> unittest.TestCase:
    name = str(spec["name"])
    namespace = {}  # type: Dict[str, Any]
    body = "def " + name + "(self):\n    assert " + repr(spec["a"]) + " == " + repr(spec["b"])
    exec(compile(body + "\n", "<" + module + ">", "exec"), namespace)
    attrs = {name: namespace[name], "__module__": module}
    cls = _type("Test" + format(rng.getrandbits(48), "012x"), (unittest.TestCase,), attrs)
    test = cls(name)  # type: unittest.TestCase
    return test


class Recorder:
    """Canaries into the suite, outcomes out of the result."""

    def __init__(self, request: Dict[str, Any]) -> None:
        self.specs = request["canaries"]
        self.rng = random.Random(request["seed"])
        self.outcomes = []  # type: list[list[str]]
        self.canaries = {}  # type: Dict[str, str]
        self.placed = False

    def place(self, suite: Any) -> None:
        """The canaries among ``suite``'s top-level tests, at boundaries between classes."""
        if self.placed or hasattr(suite, "subsuites") or not hasattr(suite, "_tests"):
            return
        self.placed = True
        tests = suite._tests
        if not tests:
            return  # nothing selected: the canaries are missing, and the judge says so
        for spec in self.specs:
            bounds = [
                i
                for i in range(len(tests) + 1)
                if i in (0, len(tests)) or _last_class(tests[i - 1]) is not _first_class(tests[i])
            ]
            at = self.rng.choice(bounds)
            module = _first_class(tests[at - 1] if at else tests[0]).__module__
            test = canary(spec, module, self.rng)
            self.canaries[spec["name"]] = name_of(test, False)
            tests.insert(at, test)

    def watch(self, result: Any) -> Any:
        """``result`` with each of its ``add*`` methods recording before it reports."""
        descriptions = bool(getattr(result, "descriptions", True))
        for method, category in CATEGORIES.items():
            original = getattr(result, method, None)
            if original is not None:
                setattr(result, method, self._recording(original, category, descriptions))
        original_sub = getattr(result, "addSubTest", None)
        if original_sub is not None:
            result.addSubTest = self._recording_sub(original_sub, descriptions)
        return result

    def _record(self, test: Any, category: str, descriptions: bool) -> None:
        ident = test.id() if hasattr(test, "id") else ""
        self.outcomes.append([name_of(test, descriptions), _str(ident), category])

    def _recording(self, original: Any, category: str, descriptions: bool) -> Any:
        def add(test: Any, *args: Any) -> Any:
            self._record(test, category, descriptions)
            return original(test, *args)

        return add

    def _recording_sub(self, original: Any, descriptions: bool) -> Any:
        def add(test: Any, subtest: Any, err: Any) -> Any:
            if err is not None:  # unittest shows a subtest only when it fails
                failed = issubclass(err[0], getattr(test, "failureException", AssertionError))
                self._record(subtest, "FAIL" if failed else "ERROR", False)
            return original(test, subtest, err)

        return add


def hook(recorder: Recorder) -> None:
    runner = unittest.TextTestRunner
    run, make_result = runner.run, runner._makeResult

    def placing_run(self: Any, test: Any) -> Any:
        recorder.place(test)
        return run(self, test)

    def watched_result(self: Any) -> Any:
        return recorder.watch(make_result(self))

    runner.run = placing_run  # type: ignore[method-assign]
    runner._makeResult = watched_result  # type: ignore[method-assign]


def run(request: Dict[str, Any], channel: int) -> None:
    root = os.getcwd()
    recorder = Recorder(request)
    hook(recorder)
    results.run_test_script(
        request, channel, RUNTESTS, [os.path.join(root, "tests"), root], recorder
    )


def main() -> None:
    results.serve(run)


if __name__ == "__main__":
    main()
