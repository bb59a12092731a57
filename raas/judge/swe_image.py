"""The SWE judge for rows in their own images: the patch applied to the image's repository in a
fresh sandbox, the tests run with pytest, Django's own runtests.py or SymPy's bin/test, graded by
SWE-bench's own parser and rules, and the log checked against a record the tests cannot reach.

EVAL starts from the image and the patch only, in a sandbox the agent never touched, and every
command is a fresh process (``Sandbox.exec``), never a shell. In order:

1. the repository (``/testbed``; a parameter, so that a plain sandbox can stand in for an
   image) is checked at the row's base commit, its tracked files listed by the image's own git,
   and the image's Python says which of its directories are on ``sys.path`` and which top-level
   modules it finds elsewhere, before anything of the patch exists;
2. the patch is applied with ``git apply``; the paths it touched (from ``git apply --numstat``)
   are looked at as they are now, and a patch that could change how the tests are found or run
   is refused as raas.judge.swe_paths refuses it (shadowing the standard library, site-packages
   or a test module, startup hooks, bytecode, links), and so is one that writes package
   metadata (``*.egg-info``, ``*.dist-info``: the entry points pytest loads plugins from);
   every test path it changed is put back as the base commit has it (added ones removed), and
   so is pytest's configuration (``pytest.ini``, ``tox.ini``, ``setup.cfg``,
   ``pyproject.toml``): a patch fixes code, it does not choose which tests run or how;
3. the row's ``test_patch``, if any, is applied after it, as SWE-bench's harness does;
4. the tests run through inside/swe_pytest.py: pytest in-process with a plugin that adds canary
   tests under random names (two that must fail, two that must pass) and records each test's
   outcome by node id from pytest's own hooks, on a channel the tests' output never reaches;
   the log (what pytest and the tests printed) comes back on stderr. A Django row's tests run
   the same way through inside/swe_django.py: Django's ``tests/runtests.py`` in-process, the
   canaries added to the suite unittest runs, each outcome recorded from unittest's result
   object by the name its verbose output gives the test (the one SWE-bench's rows use). Django's
   ``tests/`` directory (every test app, runtests.py, the settings) is test code: what a patch
   changed there is put back, and a top-level module it adds under the name of one of those
   apps is refused. A SymPy row's through inside/swe_sympy.py: SymPy's ``bin/test``
   in-process, the canaries run as test files of their own among the files it selected, each
   outcome recorded from SymPy's test reporter by the test function's name; a patch's change
   to ``bin/`` or to SymPy's runner module is put back;
5. the log is read by SWE-bench's own rules (``get_logs_eval``: its markers, the instance's
   parser from ``PARSER_REGISTRY``, the test command's exit status, here the one the record
   holds) and graded (``get_eval_tests_report``, ``get_resolution_status``: resolved means
   ``RESOLVED_FULL``); the record is graded the same way, and the run scores 0 with a reason if
   the two gradings differ, a canary is missing or has the wrong outcome in either, or the
   record is not there (the process ended early, printed on the channel, ran past its time).
   A unittest name is matched to the row's in either of unittest's spellings (``test_x
   (app.tests.T)``, and Python 3.11's ``test_x (app.tests.T.test_x)``), in the log and in the
   record alike, so a row names its tests as SWE-bench's dataset does whichever Python its
   image has.

What it cannot exclude, as raas.judge.swe cannot: the tests call the patched code in their own
process, so code written to find the recording plugin in memory could forge its record. A
patch may still edit files in the repository that git does not track (a virtual environment kept
inside it): they are not the base commit's to put back.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from raas.judge.code import Verdict
from raas.judge.programs import JUDGE_DIR, CandidateEnded, ended, install, python, run_candidate
from raas.judge.reasons import REASON, clip
from raas.judge.swe import (
    OUTPUT_CHARS,
    RUN_OUTPUT,
    apply_patch,
    failing_reason,
    hide_history,
    modules_around,
    read_record,
    short_test_id,
    unresolved,
    write_tests,
)
from raas.judge.swe_paths import GITLINK, SYMLINK, Change, is_test_path, review
from raas.judge.swe_repo import git
from raas.judge.swe_specs import DJANGO, SYMPY, RunPlan
from raas.judge.twins import candidate_paths
from raas.sandbox import ExecResult, Sandbox, SandboxError, ToolError

TESTBED = "/testbed"
TEST_TIMEOUT_S = 1800.0  # real suites in real images are slower than the bundled ones
TEST_PATCH_FILE = f"{JUDGE_DIR}/test.patch"
SOURCE_BYTES = 4 * 1024 * 1024  # a test file twins are made of
KIND_MODES = {"file": "100644", "exec": "100755", "link": SYMLINK}
# The order of -rA's short summary (passed, skipped, xfailed, xpassed, error, failed): a test
# with several outcomes (a pass, then an error in its teardown) is read by its last line.
SUMMARY_ORDER = ["passed", "skipped", "xfailed", "xpassed", "error", "failed"]
# The categories -rA writes with the node id, as SWE-bench's parsers read them (a skip is
# written by file and line, an xpass under a status swebench does not know).
BY_NODEID = {"passed": "PASSED", "failed": "FAILED", "error": "ERROR", "xfailed": "XFAIL"}
CANARIES = [(False, False), (False, True), (True, False), (True, True)]  # (passes, a str)
RUNNERS = {"pytest": "swe_pytest.py", DJANGO: "swe_django.py", SYMPY: "swe_sympy.py"}
DJANGO_TESTS = "tests"  # where Django keeps its test apps, runtests.py's directory
# SymPy's runner: bin/test (bin/ first on sys.path, the root after it) and the module it runs.
SYMPY_RUNNER = ("bin/", "sympy/testing/runtests.py", "sympy/utilities/runtests.py")
# The reporter's words for an outcome (inside/swe_sympy.py), as SWE-bench's SymPy parser reads
# them; a skip, an expected failure, a timeout it does not read.
SYMPY_STATUS = {"ok": "PASSED", "F": "FAILED", "E": "ERROR"}
# unittest's words for an outcome (inside/swe_django.py), as SWE-bench's Django parser names
# them; an expected failure or an unexpected success it does not read.
UNITTEST_STATUS = {"ok": "PASSED", "FAIL": "FAILED", "ERROR": "ERROR", "skipped": "SKIPPED"}
UNITTEST_NAME = re.compile(r"^(\w+) \(([\w.]+)\)$")


async def judge_swe_image(
    sandbox: Sandbox,
    *,
    patch: str,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    plan: RunPlan,
    test_patch: str = "",
    base_commit: str | None = None,
    repo: str = TESTBED,
    timeout_s: float = TEST_TIMEOUT_S,
    twins: dict[str, str] | None = None,
) -> Verdict:
    """Whether ``patch`` on the repository at ``repo`` in ``sandbox`` (fresh, from the row's
    image) resolves the row by SWE-bench's rules: every FAIL_TO_PASS test passes, every
    PASS_TO_PASS test still does. With ``twins`` (path -> text, raas.judge.twins), those test
    files are replaced by their twins once the test patch is in."""
    await asyncio.to_thread(_require_swebench)  # its first import takes a second
    await install(sandbox)
    tracked = await _tracked(sandbox, repo, base_commit)
    where = await modules_around(sandbox, repo, plan.env)
    if plan.runner == DJANGO:
        where = _around_django_tests(where, tracked)
    elif plan.runner == SYMPY:
        where = {**where, "roots": sorted({*where["roots"], "", "bin"})}
    metrics: dict[str, Any] = {"patch_bytes": len(patch), "patch_applied": False}
    if patch.strip():
        paths = await _patch_paths(sandbox, patch, repo)
        failed = await apply_patch(sandbox, patch, repo) if isinstance(paths, list) else paths
        if failed is not None or not isinstance(paths, list):
            why = f"the patch does not apply: {failed}"
            return unresolved(metrics, why, apply_output=failed)
        metrics["patch_applied"] = True
        changes = await _changes(sandbox, repo, paths, tracked, plan.env)
        # Django's and SymPy's names are no module paths; their test files are put back anyway.
        by_file = plan.runner == "pytest"
        ids = _module_ids(fail_to_pass + pass_to_pass) if by_file else []
        found = review(changes, set(tracked), ids, where["names"], where["roots"])
        if found.refused is not None:
            why = f"the patch is refused: {found.refused}"
            return unresolved(metrics, why, refused=found.refused)
        runner = [c.path for c in changes if _runner_file(c.path, plan.runner)]
        restore = sorted({*found.restore, *runner})
        if restore:
            await _restore(sandbox, repo, restore, tracked)
            metrics["dropped"] = restore
    if test_patch.strip():
        failed = await apply_patch(sandbox, test_patch, repo, TEST_PATCH_FILE)
        if failed is not None:
            why = f"the row's test patch does not apply over the patch: {failed}"
            return unresolved(metrics, why, test_patch_output=failed)
    # The test patch's text would tell a twin from the real tests: it goes before they run.
    await sandbox.exec(["rm", "-f", "--", TEST_PATCH_FILE])
    sources = await _test_sources(sandbox, repo, fail_to_pass, plan)
    await write_tests(sandbox, repo, {**sources, **(twins or {})})
    await hide_history(sandbox, repo)
    specs = _canaries()
    request = {
        "mark": secrets.token_hex(16),
        "args": plan.args,
        "path0": plan.path0,
        "canaries": specs,
        "seed": secrets.randbits(32),
    }
    try:
        run = await run_candidate(
            sandbox,
            python(RUNNERS[plan.runner], "run"),
            json.dumps(request),
            cwd=repo,
            env=plan.env,
            timeout_s=timeout_s,
            max_output=RUN_OUTPUT,
        )
    except CandidateEnded as e:
        return Verdict(False, {**metrics, **ended(e)})
    verdict = await _verdict(run, request, fail_to_pass, pass_to_pass, plan, metrics)
    return replace(verdict, sources=sources)


async def _test_sources(
    sandbox: Sandbox, repo: str, deciding: list[str], plan: RunPlan
) -> dict[str, str]:
    """The files that may hold the deciding tests, as the run has them (twins are made of
    them): the files their ids name, a SymPy row's test files."""
    paths = candidate_paths(deciding, plan.runner)
    if plan.runner == SYMPY:
        paths += [a for a in plan.args if a.endswith(".py")]
    found = {}
    for path in dict.fromkeys(paths):
        if path.startswith("/") or ".." in path.split("/"):
            continue
        try:
            found[path] = (await sandbox.read_file(f"{repo}/{path}", SOURCE_BYTES)).decode()
        except (ToolError, UnicodeDecodeError):
            continue  # not there, or not a test file
    return found


def _require_swebench() -> None:
    try:
        import swebench.harness.grading  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            f"image rows are graded by SWE-bench's own rules: pip install 'raas[swe]' ({e})"
        ) from e


async def _tracked(sandbox: Sandbox, repo: str, base_commit: str | None) -> dict[str, str]:
    """The files the base commit tracks, with their modes (the image's own git: this sandbox is
    fresh, so nothing of the agent's has touched it)."""
    if base_commit is not None:
        head = await git(sandbox, "rev-parse", "HEAD", cwd=repo)
        if head.exit_code != 0 or not head.stdout.strip().startswith(base_commit):
            raise SandboxError(
                f"{repo} is not at the row's base commit {base_commit}:"
                f" {(head.stdout + head.stderr).strip()[-300:]}"
            )
    listed = await git(sandbox, "ls-files", "-s", "-z", cwd=repo, max_output=RUN_OUTPUT)
    if listed.exit_code != 0 or listed.stdout_cut_bytes:
        raise SandboxError(f"git could not list {repo}'s files: {listed.stderr[-500:]}")
    tracked = {}
    for entry in filter(None, listed.stdout.split("\0")):
        stage, _, path = entry.partition("\t")
        tracked[path] = stage.split(" ", 1)[0]
    return tracked


async def _patch_paths(sandbox: Sandbox, patch: str, repo: str) -> list[str] | str:
    """Every path ``patch`` names (both sides of a rename), by git's own reading of it; what
    git said if it cannot read it."""
    probe = f"{JUDGE_DIR}/paths.patch"
    await sandbox.write_file(probe, patch if patch.endswith("\n") else patch + "\n")
    listed = await git(sandbox, "apply", "--numstat", "-z", probe, cwd=repo)
    if listed.exit_code != 0:
        return (listed.stdout + listed.stderr)[-1000:]
    paths: list[str] = []
    fields = listed.stdout.split("\0")
    i = 0
    while i < len(fields):
        counts = fields[i].split("\t")
        if len(counts) == 3 and counts[2]:
            paths.append(counts[2])
            i += 1
        elif len(counts) == 3:  # a rename: its two paths follow
            paths += [p for p in fields[i + 1 : i + 3] if p]
            i += 3
        else:
            i += 1
    return list(dict.fromkeys(paths))


async def _changes(
    sandbox: Sandbox, repo: str, paths: list[str], tracked: dict[str, str], env: dict[str, str]
) -> list[Change]:
    """What the patch made of each of its ``paths``: added, modified, deleted or of another
    type now, by what is on disk (the probe reads it without following links)."""
    probe = await sandbox.exec(python("probe.py", "stat"), json.dumps(paths), cwd=repo, env=env)
    try:
        kinds = json.loads(probe.stdout)
    except json.JSONDecodeError as e:
        raise SandboxError(
            f"the image's python3 did not look at the patch's paths: {probe.stderr}"
        ) from e
    changes = []
    for path in paths:
        kind, before = kinds.get(path, "missing"), tracked.get(path)
        if kind == "missing":
            if before is not None:
                changes.append(Change("D", path, "000000"))
            continue
        mode = KIND_MODES.get(kind, GITLINK)  # a directory or a device where a file was named
        if before is None:
            changes.append(Change("A", path, mode))
        else:
            changes.append(Change("M" if before[:2] == mode[:2] else "T", path, mode))
    return changes


def _module_ids(test_ids: list[str]) -> list[str]:
    """Each test file as the dotted name raas.judge.swe_paths looks test modules up by
    (``tests/test_x.py::test_y`` -> ``tests.test_x.test_y``)."""
    out = []
    for test_id in test_ids:
        file = test_id.split("::", 1)[0]
        if file.endswith(".py"):
            out.append(file[: -len(".py")].replace("/", ".") + ".test")
    return out


def _around_django_tests(where: dict[str, Any], tracked: dict[str, str]) -> dict[str, Any]:
    """runtests.py puts ``tests/`` first on sys.path and the repository's root after it: each
    is a root, and the modules of ``tests/`` (its test apps) are names a patch must not give
    a module elsewhere (where a test app has no ``__init__.py``, one at the root would win)."""
    apps = set()
    for path in tracked:
        parts = path.split("/")
        if len(parts) > 1 and parts[0] == DJANGO_TESTS:
            apps.add(parts[1].split(".")[0] if len(parts) == 2 else parts[1])
    roots = sorted({*where["roots"], "", DJANGO_TESTS})
    return {"roots": roots, "names": where["names"] | {a for a in apps if a.isidentifier()}}


def _runner_file(path: str, runner: str) -> bool:
    """A test, or a file of how the tests are found and run (swe_paths' RUNNER_FILES; SymPy's
    bin/test and its runner module): a patch's change to it is put back."""
    if runner == SYMPY and path.startswith(SYMPY_RUNNER):
        return True
    return is_test_path(path, set())


async def _restore(sandbox: Sandbox, repo: str, paths: list[str], tracked: dict[str, str]) -> None:
    """``paths`` as the base commit has them: removed, whatever they are now, then checked out."""
    removed = await sandbox.exec(["rm", "-rf", "--", *paths], cwd=repo)
    if removed.exit_code != 0:
        raise SandboxError(f"could not put the tests back: {removed.stderr[-500:]}")
    kept = [p for p in paths if p in tracked]
    if kept:
        checked = await git(sandbox, "checkout", "HEAD", "--", *kept, cwd=repo)
        if checked.exit_code != 0:
            raise SandboxError(f"could not put the tests back: {checked.stderr[-500:]}")


def _canaries() -> list[dict[str, Any]]:
    specs = []
    for passes, text in CANARIES:
        a = secrets.randbelow(10**9)
        b = a if passes else a + 1 + secrets.randbelow(10**6)
        values = (f"v{a}", f"v{b}") if text else (a, b)
        name = f"test_{secrets.token_hex(5)}"
        specs.append({"name": name, "passes": passes, "a": values[0], "b": values[1]})
    return specs


async def _verdict(
    run: ExecResult,
    request: dict[str, Any],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    plan: RunPlan,
    metrics: dict[str, Any],
) -> Verdict:
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, TEST_EXIT_CODE
    from swebench.harness.grading import (
        EvalType,
        ResolvedStatus,
        get_eval_tests_report,
        get_resolution_status,
    )

    record, untrusted = read_record(run, request["mark"])
    if run.stderr_cut_bytes:
        untrusted.append("the test log overflowed")
    # The exit status SWE-bench's rules check the log against: the record's, not a line the
    # tests could print.
    log = run.stderr + f"\n{TEST_EXIT_CODE}: {record.get('exit_code', -1)}\n"
    logged, readable = await asyncio.to_thread(_read_log, log, fail_to_pass, pass_to_pass, plan)
    outcomes = record.get("outcomes") or []
    if plan.runner == DJANGO:
        names = fail_to_pass + pass_to_pass
        recorded = _by_row_names(_named_statuses(outcomes, UNITTEST_STATUS), names)
        logged = _by_row_names(logged, names)
    elif plan.runner == SYMPY:
        recorded = _named_statuses(outcomes, SYMPY_STATUS)
    else:
        recorded = _statuses(outcomes)
    gold = {FAIL_TO_PASS: fail_to_pass, PASS_TO_PASS: pass_to_pass}
    eval_type = EvalType(plan.eval_type)
    report = get_eval_tests_report(logged, gold, eval_type=eval_type)
    recorded_report = get_eval_tests_report(recorded, gold, eval_type=eval_type)
    if record:
        differ = _differences(report, recorded_report)
        untrusted += [f"the log and the record disagree on {t}" for t in differ[:10]]
        untrusted += _canary_problems(request["canaries"], record, recorded, logged)
    resolution = get_resolution_status(report) if readable else ResolvedStatus.NO.value
    resolved = readable and resolution == ResolvedStatus.FULL.value and not untrusted
    metrics = {
        **metrics,
        "resolved": resolved,
        "resolution": resolution,
        "FAIL_TO_PASS": report[FAIL_TO_PASS],
        "PASS_TO_PASS": report[PASS_TO_PASS],
    }
    passing = frozenset(_succeeded(report) | _succeeded(recorded_report)) & set(fail_to_pass)
    if not readable:
        metrics["log"] = "SWE-bench's rules found no test results in the log it can trust"
    if untrusted:
        metrics["untrusted"] = untrusted[:20]
    if not resolved:
        metrics["test_output"] = run.stderr[-OUTPUT_CHARS:]
        failing = [short_test_id(t) for t in report[FAIL_TO_PASS].get("failure", [])]
        broken = [short_test_id(t) for t in report[PASS_TO_PASS].get("failure", [])]
        why = failing_reason(metrics, failing, broken, untrusted)
        metrics[REASON] = why if readable else clip(f"{metrics['log']}; {why}")
    return Verdict(resolved, metrics, passing)


def _succeeded(report: dict[str, Any]) -> set[str]:
    """The tests a report has passing (either kind)."""
    return {t for kind in report.values() for t in kind.get("success", [])}


def _read_log(
    log: str, fail_to_pass: list[str], pass_to_pass: list[str], plan: RunPlan
) -> tuple[dict[str, str], bool]:
    """The log's statuses by test, and whether SWE-bench's rules accept it (``get_logs_eval``
    reads a file: the log is written to one)."""
    from swebench.harness.grading import get_logs_eval
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id="",
        image="",
        eval_script_list=[],
        repo="",
        version="",
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        log_parser=plan.log_parser,
        eval_type=plan.eval_type,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log)
        statuses, readable = get_logs_eval(spec, str(path))
    return dict(statuses), bool(readable)


def _statuses(outcomes: list[Any]) -> dict[str, str]:
    """The record's outcomes as the -rA summary would show them by node id: each test's last
    summary line, the categories that line is not written for left out."""
    worst: dict[str, int] = {}
    for outcome in outcomes:
        if not (isinstance(outcome, list) and len(outcome) == 2):
            continue
        nodeid, category = str(outcome[0]), str(outcome[1])
        rank = SUMMARY_ORDER.index(category) if category in SUMMARY_ORDER else -1
        worst[nodeid] = max(rank, worst.get(nodeid, -1))
    statuses = {}
    for nodeid, rank in worst.items():
        status = BY_NODEID.get(SUMMARY_ORDER[rank]) if rank >= 0 else None
        if status is not None:
            statuses[nodeid] = status
    return statuses


def _named_statuses(outcomes: list[Any], words: dict[str, str]) -> dict[str, str]:
    """The record of inside/swe_django.py or swe_sympy.py (``[name, ..., category]``) as
    SWE-bench's parser reads the log: each test's last outcome by its name, the ones it does
    not read left out."""
    statuses = {}
    for outcome in outcomes:
        if not (isinstance(outcome, list) and len(outcome) >= 2):
            continue
        status = words.get(str(outcome[-1]))
        if status is not None:
            statuses[str(outcome[0])] = status
    return statuses


def _spellings(name: str) -> set[str]:
    """The ways unittest writes one test's name: ``test_x (app.tests.T)``, and Python 3.11's
    ``test_x (app.tests.T.test_x)``; a docstring's line is written one way."""
    found = UNITTEST_NAME.match(name)
    if found is None:
        return {name}
    method, where = found.groups()
    if where.endswith("." + method):
        return {name, f"{method} ({where[: -len(method) - 1]})"}
    return {name, f"{method} ({where}.{method})"}


def _by_row_names(statuses: dict[str, str], names: list[str]) -> dict[str, str]:
    """``statuses`` with each test the row names under the row's spelling of its name."""
    spelled = {spelling: name for name in names for spelling in _spellings(name)}
    return {spelled.get(key, key): status for key, status in statuses.items()}


def _differences(logged: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """The tests the two reports class differently."""
    differ = []
    for kind in sorted(logged):
        for side in ("success", "failure"):
            differ += sorted(set(logged[kind][side]) ^ set(recorded[kind][side]))
    return list(dict.fromkeys(differ))


def _canary_problems(
    specs: list[dict[str, Any]],
    record: dict[str, Any],
    recorded: dict[str, str],
    logged: dict[str, str],
) -> list[str]:
    placed = record.get("canaries") or {}
    problems = []
    for spec in specs:
        want = "PASSED" if spec["passes"] else "FAILED"
        nodeid = placed.get(spec["name"]) if isinstance(placed, dict) else None
        got = (recorded.get(nodeid), logged.get(nodeid)) if nodeid else (None, None)
        if got != (want, want):
            must = "pass" if spec["passes"] else "fail"
            problems.append(f"a canary that must {must}: recorded {got[0]}, logged {got[1]}")
    return problems
