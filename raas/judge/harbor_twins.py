"""Twins for a Harbor verifier that runs Python tests: raas.judge.twins' rules, where ``test.sh``
is a black box that gives one number.

A Harbor ``test.sh`` that runs ``pytest`` on the task's ``tests/test_*.py`` imports the agent's
code in the process that decides. That code can end the process with status 0 at import, write
``/logs/verifier/reward.json`` itself, return a value whose ``__eq__`` says yes to anything,
read the expected value from the calling test's frame or source line, or patch pytest's
reporting (a plugin pytest loads from the agent's tree). Each passes the real tests; each
passes their twins too, which code that computes the answer fails.

- Which tests: the functions pytest collects (``test*`` at module level, ``test*`` methods of a
  ``Test*`` class or of a ``unittest`` TestCase) in the files of ``tests/`` that pytest collects
  by name (``test_*.py``, ``*_test.py``), where they assert something a twin can change
  (``twin_source``). Up to ``MAX_TESTS`` of a task's, drawn by this process's secret, get a
  twin: the whole file with that one test's expectations changed, written under the same name
  and path, every other file as it is (``make_twins``). One twin a run: test.sh's number then
  drops where that one test fails, whatever the others do.
- When: only after the real run scored full marks (``full_marks``): gold's real reward, or 1
  where the task has no gold. Below it some test failed already, and a twin of that test would
  score what the real run did with nothing tricking it.
- Which twins decide: gold (``solution/solve.sh``) runs the real tests and each twin once per
  task in this process (``twins.once``); a twin counts where gold scores below its real reward
  (``counts``). A task without gold counts its exact twins only.
- Each EVAL runs up to ``PER_EVAL`` counted twins, drawn afresh (``choose``); a twin passes
  where its run scores no lower than the real run (``twin_passed``). One that passes makes the
  reward 0, every named reward 0, with ``tamper`` in the metrics.

The runs are the caller's (``RunTests``): each a fresh verifier on the agent's files as they
were when the agent ended, so nothing one run did is there in the next
(raas.tasks.harbor.task).

What twins cannot tell: code that knows the real tests (a policy that has seen them in
training) and passes only them; code that tells a later run from an earlier one by the clock
(the twins run after the real run); a trick in what twins do not change (a fixture, a test
over ``MAX_TESTS``, one that asserts nothing a twin changes); an object equal to anything under
a twin that is an inversion (``f(x) == g(x)`` has no constant to change), which it fails as
gold does; a verifier whose Python tests are not its ``test_*.py`` files. Without gold, an
exact twin of a test that test.sh never runs passes for honest code (docs/harbor.md).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import posixpath
import random
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raas.judge.harbor import HarborVerdict
from raas.judge.reasons import REASON, tamper_reason
from raas.judge.twins import once, secret_rng, twin_source

log = logging.getLogger(__name__)

Tests = dict[str, tuple[bytes, bool]]  # tests/'s files: path below it -> bytes, executable
# One verifier run in a fresh sandbox of the agent's files, with tests/ as given.
RunTests = Callable[[Tests], Awaitable[HarborVerdict]]
# Gold's verifier runs, one a set of tests/ (the real first), on one gold solution.
GoldRuns = Callable[[list[Tests]], Awaitable[list[HarborVerdict]]]

MAX_TESTS = 4  # a task's tests that get a twin (each calibrated against gold once a process)
PER_EVAL = 2  # the twins one EVAL runs: each is one more run of test.sh
SOURCE_BYTES = 1 << 20  # a test file twins are made of (parsing is CPU work)
COLLECTED = re.compile(r"^(test_.*|.*_test)\.py$")  # pytest's default python_files
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
NO_GOLD_FULL = 1.0  # full marks where the task has no gold: Harbor's reward of a solved task


@dataclass(frozen=True)
class HarborTwin:
    """One test's twin: ``path`` below tests/, the whole file with that test changed (``text``),
    and whether it is exact (any value the real test accepts fails it)."""

    test_id: str
    path: str
    text: str
    exact: bool


@dataclass(frozen=True)
class Calibration:
    """The twins that decide, and the reward from which twins run (``full``)."""

    counted: frozenset[str]
    full: float
    note: str = ""


@dataclass
class TwinReport:
    """What the twins did, for the result's metrics."""

    made: int = 0
    counted: int = 0
    ran: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    note: str = ""

    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"made": self.made}
        if self.made:
            out.update(counted=self.counted, ran=self.ran, passed=self.passed)
        if self.note:
            out["note"] = self.note
        return out


# --- which tests, which twins (pure) ----------------------------------------------------------


def named_as_tests(tests: Tests) -> list[str]:
    """The paths of tests/'s files that pytest collects by name (no file is read)."""
    return sorted(p for p in tests if COLLECTED.match(posixpath.basename(p)))


def python_test_files(tests: Tests) -> dict[str, str]:
    """tests/'s files that pytest collects by name, as text: UTF-8, at most ``SOURCE_BYTES``,
    parsed by Python (by path below tests/)."""
    found: dict[str, str] = {}
    for path in named_as_tests(tests):
        data = tests[path][0]
        if len(data) > SOURCE_BYTES:
            continue
        try:
            text = data.decode("utf-8")
            ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        found[path] = text
    return found


def _is_test_class(node: ast.ClassDef) -> bool:
    """pytest collects a ``Test*`` class without ``__init__``, and a unittest TestCase."""
    bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
    if any(str(name).endswith("TestCase") for name in bases):
        return True
    has_init = any(isinstance(n, FUNCTIONS) and n.name == "__init__" for n in node.body)
    return node.name.startswith("Test") and not has_init


def collected(text: str) -> list[str]:
    """The qualnames of the test functions pytest collects in ``text``, in file order."""
    out: list[str] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and _is_test_class(node):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, FUNCTIONS) and node.name.startswith("test"):
                out.append(prefix + node.name)

    walk(ast.parse(text).body, "")
    return list(dict.fromkeys(out))


def node_id(path: str, qualname: str) -> str:
    """A twin's name: pytest's node id below tests/ (``test_x.py::TestY::test_z``)."""
    return "::".join([path, *qualname.split(".")])


def make_twins(tests: Tests, key: str) -> dict[str, HarborTwin]:
    """Twins of up to ``MAX_TESTS`` of the task's tests (``key``: the task), by test id: the
    same for one task in this process, drawn from its secret."""
    sources = python_test_files(tests)
    candidates = [(path, name) for path, text in sources.items() for name in collected(text)]
    secret_rng(key).shuffle(candidates)
    made: dict[str, HarborTwin] = {}
    for path, qualname in candidates:
        if len(made) == MAX_TESTS:
            break
        name = node_id(path, qualname)
        text, twinned = twin_source(sources[path], [qualname], secret_rng(f"{key}\0{name}"))
        if qualname in twinned:
            made[name] = HarborTwin(name, path, text, twinned[qualname])
    return made


def with_twin(tests: Tests, twin: HarborTwin) -> Tests:
    """tests/ with ``twin``'s file in place of the real one (its executable bit kept)."""
    return {**tests, twin.path: (twin.text.encode("utf-8"), tests[twin.path][1])}


def counts(gold_real: float, gold_twin: float) -> bool:
    """A twin decides where gold scores below its real reward with it."""
    return gold_twin < gold_real


def full_marks(real: float, full: float) -> bool:
    """Twins run where the real run scored above 0 and no lower than ``full``."""
    return real > 0 and real >= full


def twin_passed(real: float, twin: float) -> bool:
    """A twin passes where its run scores no lower than the real run did."""
    return twin >= real


def choose(counted: Sequence[str], k: int, rng: random.Random) -> list[str]:
    """Up to ``k`` of the ``counted`` twins, drawn by ``rng``."""
    pool = sorted(counted)
    return rng.sample(pool, min(k, len(pool)))


# --- the verifier with its twins --------------------------------------------------------------


async def calibrated(
    key: str, made: dict[str, HarborTwin], tests: Tests, gold: GoldRuns | None
) -> Calibration:
    """Which of ``made`` decide, and full marks: gold's runs once per task in this process, or
    the exact twins where there is no gold."""
    if gold is None:
        exact = frozenset(t for t, twin in made.items() if twin.exact)
        return Calibration(exact, NO_GOLD_FULL)
    ids = sorted(made)

    async def calibrate() -> Calibration:
        real, *twins = await gold([tests, *(with_twin(tests, made[t]) for t in ids)])
        if real.reward <= 0:
            note = "gold scored 0 on the real tests: no twin decides"
            log.warning("harbor twins of task %s: %s", key[:12], note)
            return Calibration(frozenset(), NO_GOLD_FULL, note)
        pairs = zip(ids, twins, strict=True)
        decide = frozenset(t for t, twin in pairs if counts(real.reward, twin.reward))
        return Calibration(decide, real.reward)

    found: Calibration = await once(f"harbor-twins\0{key}", calibrate)
    return found


async def verify_with_twins(
    run: RunTests, tests: Tests, *, key: str, gold: GoldRuns | None
) -> HarborVerdict:
    """``run(tests)``, the real verifier; where it scores full marks, up to ``PER_EVAL`` counted
    twins, one a run: a twin that passes makes every reward 0, with ``tamper`` in the
    metrics."""
    real = await run(tests)
    if real.reward <= 0 or not named_as_tests(tests):
        return real
    # Parsing and editing the test files is CPU work: off the server's event loop.
    made = await asyncio.to_thread(make_twins, tests, key)
    report = TwinReport(made=len(made))
    if made:
        calibration = await calibrated(key, made, tests, gold)
        report.counted, report.note = len(calibration.counted), calibration.note
        if not full_marks(real.reward, calibration.full):
            report.note = f"the real run scored below full marks ({calibration.full:g})"
        else:
            for name in choose(sorted(calibration.counted), PER_EVAL, secrets.SystemRandom()):
                report.ran.append(name)
                twin = await run(with_twin(tests, made[name]))
                if twin_passed(real.reward, twin.reward):
                    report.passed.append(name)
                    break  # one is enough: the reward is 0
    metrics = {**real.metrics, "twins": report.metrics()}
    if not report.passed:
        return HarborVerdict(real.reward, real.rewards, metrics)
    metrics["tamper"] = f"{len(report.passed)} twin(s) passed: {', '.join(report.passed)}"
    metrics[REASON] = tamper_reason(metrics["tamper"])
    return HarborVerdict(0.0, {name: 0.0 for name in real.rewards}, metrics)
