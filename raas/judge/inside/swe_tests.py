"""The SWE judge's test runner, in the sandbox: unittest tests by id, results by id, not as text.

``python3 -I swe_tests.py run`` reads one JSON object on stdin: the test ids, the repository's
directories for ``sys.path``, the test modules' sources as the task has them, the canaries and
a ``mark``. Before anything of the repository is imported, it keeps its stdout as the results
channel (not inherited by any child) and sends fd 1 to stderr, so whatever the tests or the
code they call print lands in stderr; it notes the functions of the modules it relies on
(builtins, unittest, json) and compiles the test modules' sources itself. It loads each test by
id, adds the canaries to every test class (methods under random names that must pass or must
fail, among the task's own tests), runs them with a result object of its own, and writes one
line on the channel: ``{"mark", "outcomes": [[id, outcome], ...], "details", "errors",
"tampered"}``; then it ends at once (no atexit handler runs after it).

It reports as tampering: a function of those modules replaced or rewritten, a test method whose
code is not the task's source (swapped by a thread, a class-building hook, an import hook), a
callable added to a test class, a trace or profile function set during a test.

What it cannot exclude: the patched code runs in this process (the tests call it), so code that
sets out to find this runner's own objects in memory (the channel, the mark, the canaries, these
checks) can still forge the record. The canaries, the checks and the mark make that a targeted
attack on this runner, not a line printed or a function patched.

Standard library only, Python 3.8 or newer.
"""

from __future__ import annotations

import ast
import builtins
import json
import json.encoder
import os
import random
import sys
import traceback
import types
import unittest
import unittest.case
import unittest.loader
import unittest.result
import unittest.suite
import unittest.util
from typing import Any, Tuple

# -I leaves this directory off sys.path: put it there for the sibling, and take it off again
# (swe_tests lists what is importable from sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results

del sys.path[0]

DETAIL_CHARS = 2000
TRUSTED = (
    builtins,
    json,
    json.encoder,
    unittest,
    unittest.case,
    unittest.loader,
    unittest.result,
    unittest.suite,
    unittest.util,
    results,
    sys.modules[__name__],
)
# Bound now: the patched code may replace them in their modules later.
_gettrace, _getprofile = sys.gettrace, sys.getprofile

Mark = Tuple[Any, Any, Any, Any]


# --- what the tests must not change -------------------------------------------------------------


def _mark(value: Any) -> Mark:
    fn = getattr(value, "__func__", value)
    return (
        value,
        getattr(fn, "__code__", None),
        getattr(fn, "__defaults__", None),
        getattr(fn, "__kwdefaults__", None),
    )


def _watched(value: Any) -> bool:
    return callable(value) or isinstance(value, (classmethod, staticmethod, property))


def fingerprint() -> dict[tuple[str, str], Mark]:
    """Every function of the trusted modules and of the classes they define, as it is now."""
    seen: dict[tuple[str, str], Mark] = {}
    for module in TRUSTED:
        owner = module.__name__
        for name, value in list(vars(module).items()):
            if not _watched(value):
                continue
            seen[(owner, name)] = _mark(value)
            if isinstance(value, type) and value.__module__ == owner:
                for attr, member in list(vars(value).items()):
                    if _watched(member):
                        seen[(f"{owner}.{name}", attr)] = _mark(member)
    return seen


def changed(before: dict[tuple[str, str], Mark]) -> list[str]:
    now = fingerprint()
    return [
        f"{owner}.{name} was changed"
        for (owner, name), mark in before.items()
        if (owner, name) not in now or any(a is not b for a, b in zip(mark, now[(owner, name)]))
    ]


class Source:
    """A test module as the task has it: its methods' code, and which are decorated."""

    def __init__(self, path: str, text: str) -> None:
        self.code: dict[str, types.CodeType] = {}
        self.decorated: set[str] = set()
        self.defined: dict[str, set[str]] = {}  # class -> the names its body binds
        self._walk(compile(text, path, "exec", dont_inherit=True), "")
        self._decorations(ast.parse(text), "")

    def _walk(self, code: types.CodeType, prefix: str) -> None:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                name = prefix + const.co_name
                self.code[name] = const  # a later definition of a name wins, as at run time
                self.defined[name] = set(const.co_names)
                self._walk(const, name + ".")

    def _decorations(self, tree: ast.AST, prefix: str) -> None:
        for node in ast.iter_child_nodes(tree):
            if isinstance(node, ast.ClassDef):
                self._decorations(node, prefix + node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
                self.decorated.add(prefix + node.name)


def method_problem(test: unittest.TestCase, sources: dict[str, Source]) -> str | None:
    """Why ``test``'s method is not the one the task's source defines (None if it is)."""
    cls = type(test)
    source = sources.get(cls.__module__)
    where = f"{cls.__qualname__}.{test._testMethodName}"
    if source is None or where not in source.code:
        return None
    fn = getattr(cls, test._testMethodName, None)
    chain = [fn]
    while where in source.decorated and hasattr(chain[-1], "__wrapped__") and len(chain) < 20:
        chain.append(chain[-1].__wrapped__)  # type: ignore[union-attr]
    if not any(getattr(f, "__code__", None) == source.code[where] for f in chain):
        return f"{test.id()} does not run the task's code"
    return None


def added_callables(cls: type, sources: dict[str, Source], canaries: set[str]) -> list[str]:
    source = sources.get(cls.__module__)
    if source is None or cls.__qualname__ not in source.defined:
        return []
    body = source.defined[cls.__qualname__]
    return [
        f"{cls.__qualname__}.{name} was added"
        for name, value in list(vars(cls).items())
        if _watched(value)
        and name not in body
        and name not in canaries
        and not (name.startswith("__") and name.endswith("__"))
    ]


# --- the run -----------------------------------------------------------------------------------


class Recorder(unittest.TestResult):
    """Outcomes by test id, in the words of ``unittest -v``."""

    def __init__(self, check: Any) -> None:
        super().__init__()
        self.outcomes: list[list[str]] = []
        self.details: dict[str, str] = {}
        self.current: str | None = None
        self.check = check

    def _set(self, test: Any, outcome: str, err: Any = None) -> None:
        if err is not None:
            self.details[test.id()] = "".join(traceback.format_exception(*err))[-DETAIL_CHARS:]
        if isinstance(test, unittest.TestCase) and self.current is not None:
            if self.current in ("started", "ok"):  # the first failure of a test says what it is
                self.current = outcome
        else:  # a class or module fixture failed: no test started
            self.outcomes.append([test.id(), outcome])

    def startTest(self, test: Any) -> None:
        super().startTest(test)
        self.current = "started"
        self.check(test)

    def stopTest(self, test: Any) -> None:
        self.check(test)
        outcome = self.current if self.current not in ("started", None) else "ERROR"
        self.outcomes.append([test.id(), outcome])
        self.current = None
        super().stopTest(test)

    def addSuccess(self, test: Any) -> None:
        if self.current == "started":
            self.current = "ok"

    def addFailure(self, test: Any, err: Any) -> None:
        self._set(test, "FAIL", err)

    def addError(self, test: Any, err: Any) -> None:
        self._set(test, "ERROR", err)

    def addSkip(self, test: Any, reason: str) -> None:
        self._set(test, "skipped")

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self._set(test, "expected failure")

    def addUnexpectedSuccess(self, test: Any) -> None:
        self._set(test, "unexpected success")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._set(test, "FAIL" if failed else "ERROR", err)


def canary(spec: dict[str, Any], cls: type, filename: str) -> Any:
    """A test method that must pass (``a == b``) or fail (``a != b``), asserted as ``kind``."""
    a, b, name = repr(spec["a"]), repr(spec["b"]), spec["name"]
    body = {
        "assertEqual": f"self.assertEqual({a}, {b})",
        "assertTrue": f"self.assertTrue({a} == {b})",
        "assert": f"assert {a} == {b}",
    }[spec["kind"]]
    namespace: dict[str, Any] = {}
    exec(compile(f"def {name}(self):\n    {body}\n", filename, "exec"), namespace)
    fn = namespace[name]
    fn.__module__, fn.__qualname__ = cls.__module__, f"{cls.__qualname__}.{name}"
    return fn


def flatten(suite: Any) -> list[Any]:
    if isinstance(suite, unittest.TestSuite):
        return [t for s in suite for t in flatten(s)]
    return [suite]


def with_canaries(tests: list[Any], specs: list[dict[str, Any]], seed: int) -> list[Any]:
    """``tests`` with each canary added to every test class, at a random place among that
    class's tests (so class fixtures run as they would)."""
    rng = random.Random(seed)
    classes: list[type] = []
    for test in tests:
        cls = type(test)
        loaded = isinstance(test, unittest.TestCase) and cls.__module__ != "unittest.loader"
        if loaded and cls not in classes:
            classes.append(cls)
    placed: list[Any] = list(tests)
    for cls in classes:
        filename = getattr(sys.modules.get(cls.__module__), "__file__", None) or "<test>"
        for spec in specs:
            setattr(cls, spec["name"], canary(spec, cls, filename))
            spots = [i for i, t in enumerate(placed) if type(t) is cls]
            placed.insert(rng.choice(spots + [spots[-1] + 1]), cls(spec["name"]))
    return placed


def run(request: dict[str, Any], channel: int) -> None:
    sources = {m: Source(path, text) for m, (path, text) in request["sources"].items()}
    canaries = {spec["name"] for spec in request["canaries"]}
    tampered: list[str] = []

    def check(test: Any) -> None:
        if _gettrace() is not None or _getprofile() is not None:
            tampered.append(f"a trace or profile function was set during {test.id()}")
        problem = method_problem(test, sources) if isinstance(test, unittest.TestCase) else None
        if problem is not None:
            tampered.append(problem)

    before = fingerprint()
    sys.path[:0] = request["roots"]
    sys.argv = [sys.argv[0]]
    loader = unittest.TestLoader()
    tests = [t for test_id in request["ids"] for t in flatten(loader.loadTestsFromName(test_id))]
    tests = with_canaries(tests, request["canaries"], request["seed"])
    result = Recorder(check)
    unittest.TestSuite(tests).run(result)
    for cls in {type(t) for t in tests}:
        tampered += added_callables(cls, sources, canaries)
    tampered += changed(before)
    record = {
        "mark": request["mark"],
        "outcomes": result.outcomes,
        "details": result.details,
        "errors": [e[-DETAIL_CHARS:] for e in getattr(loader, "errors", [])],
        "tampered": sorted(set(tampered)),
    }
    results.send(channel, record)


def main() -> None:
    results.serve(run)


if __name__ == "__main__":
    main()
