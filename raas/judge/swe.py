"""The SWE judge: a patch applied to the task's snapshot in a fresh sandbox, its tests run by id.

EVAL starts from the task and the patch only, in a sandbox the agent never touched, and every
command is a fresh process (``Sandbox.exec``), never a shell. In order:

1. the snapshot is materialised as one commit (swe_repo), and the image's Python says which of
   the repository's directories are on ``sys.path`` and which top-level modules it finds
   elsewhere (inside/probe.py ``names``), before anything of the patch exists;
2. the patch is applied with ``git apply``; what it changed is read back from git, and a patch
   that could change how the tests are found or run is refused (swe_paths: a module that
   shadows the standard library, site-packages or a test module, startup hooks, bytecode, links);
   every test path it changed is put back as the snapshot has it, added ones removed;
3. the tests run through inside/swe_tests.py ``run``: loaded by id with unittest, outcomes
   recorded by id by the runner's own result object and written as one JSON line on a channel
   the tests' output never reaches (what the tests print is never parsed), with canary methods
   under random names added to every test class, four that must fail and two that must pass;
4. the record is checked here: the runner exited 0 within its time, the channel holds exactly
   its one line with this run's mark, no tampering was seen, every expected test and canary is
   present exactly once, every canary has its outcome (a must-fail canary that passes is a
   patched assertion or a forged result: the run scores 0), and every expected test passed.

What a judge of unittest suites cannot exclude, and this one does not claim to: the tests call
the patched code in their own process. Code that sets out to find the runner's objects in memory
can still forge its record (see inside/swe_tests.py), and a value whose ``__eq__`` says yes to
anything passes an ``assertEqual`` (the comparison runs where the value lives). Non-test files
the tests read (a helper module outside the test directories, a data file) are the patch's to
change, as the code under test is.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from dataclasses import replace
from typing import Any

from raas.judge.code import Verdict
from raas.judge.programs import JUDGE_DIR, CandidateEnded, ended, install, python, run_candidate
from raas.judge.reasons import REASON, clip, listed
from raas.judge.swe_paths import Change, parse_raw, review, test_modules
from raas.judge.swe_repo import REPO, git, materialise
from raas.judge.twins import UNITTEST, candidate_paths
from raas.sandbox import ExecResult, Sandbox, SandboxError

TEST_TIMEOUT_S = 120.0
RUN_OUTPUT = 8 * 1024 * 1024  # bytes of the record, and of what the tests print
PATCH_FILE = f"{JUDGE_DIR}/agent.patch"
OUTPUT_CHARS = 2000
# The canaries added to every test class: (how it asserts, whether it must pass, a str value).
CANARIES = [
    ("assertEqual", False, False),
    ("assertEqual", False, True),
    ("assertTrue", False, False),
    ("assert", False, False),
    ("assertEqual", True, False),
    ("assertEqual", True, True),
]


async def judge_swe(
    sandbox: Sandbox,
    *,
    files: dict[str, str],
    patch: str,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    timeout_s: float = TEST_TIMEOUT_S,
    twins: dict[str, str] | None = None,
) -> Verdict:
    """Whether ``patch`` on the snapshot ``files`` makes every listed test pass, in ``sandbox``
    (fresh); with ``twins`` (path -> text, raas.judge.twins), those test files replaced by their
    twins once the patch is in."""
    ids = list(dict.fromkeys(fail_to_pass + pass_to_pass))
    await install(sandbox)
    await materialise(sandbox, files)
    where = await modules_around(sandbox)
    metrics: dict[str, Any] = {"patch_bytes": len(patch), "patch_applied": False}
    if patch.strip():
        failed = await apply_patch(sandbox, patch)
        if failed is not None:
            return unresolved(metrics, f"the patch does not apply: {failed}", apply_output=failed)
        metrics["patch_applied"] = True
        found = review(await _changes(sandbox), set(files), ids, where["names"], where["roots"])
        if found.refused is not None:
            why = f"the patch is refused: {found.refused}"
            return unresolved(metrics, why, refused=found.refused)
        if found.restore:
            await _restore(sandbox, files, found.restore)
            metrics["dropped"] = found.restore
    wanted = [p for p in candidate_paths(fail_to_pass, UNITTEST) if p in files]
    tests = {**files, **(twins or {})}
    await write_tests(sandbox, REPO, {p: tests[p] for p in wanted})
    await hide_history(sandbox, REPO)
    specs = _canaries()
    request = {
        "mark": secrets.token_hex(16),
        "ids": ids,
        "roots": [f"{REPO}/{r}".rstrip("/") for r in where["roots"]],
        "sources": {m: [f"{REPO}/{p}", tests[p]] for m, p in test_modules(ids, set(files)).items()},
        "canaries": [{k: s[k] for k in ("name", "kind", "a", "b")} for s in specs],
        "seed": secrets.randbits(32),
    }
    try:
        run = await run_candidate(
            sandbox,
            python("swe_tests.py", "run"),
            json.dumps(request),
            cwd=REPO,
            timeout_s=timeout_s,
            max_output=RUN_OUTPUT,
        )
    except CandidateEnded as e:
        return Verdict(False, {**metrics, **ended(e)})
    verdict = _verdict(run, request, specs, fail_to_pass, pass_to_pass, metrics)
    return replace(verdict, sources={p: files[p] for p in wanted})


async def write_tests(sandbox: Sandbox, repo: str, texts: dict[str, str]) -> None:
    """The files of the deciding tests written again, the real text or a twin's, at the same
    point of every run (after the patch): their times, inodes and order then tell a twin run
    from the real one by nothing."""
    for path, text in sorted(texts.items()):
        await sandbox.write_file(f"{repo}/{path}", text)


async def hide_history(sandbox: Sandbox, repo: str) -> None:
    """Remove ``repo``'s .git before the tests run: it holds the tests as the task has them,
    which would tell a twin from the real test (the judge is done with git by then)."""
    removed = await sandbox.exec(["rm", "-rf", "--", f"{repo}/.git"])
    if removed.exit_code != 0:
        raise SandboxError(f"could not remove {repo}/.git: {removed.stderr[-500:]}")


async def modules_around(
    sandbox: Sandbox, repo: str = REPO, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The directories of ``repo`` on the image's ``sys.path`` (``roots``, the root always
    among them) and the top-level modules importable from elsewhere (``names``)."""
    probe = await sandbox.exec(python("probe.py", "names", repo), cwd=repo, env=env)
    try:
        where = json.loads(probe.stdout)
        return {"roots": sorted({"", *where["roots"]}), "names": set(where["names"])}
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SandboxError(f"the image's python3 did not list its modules: {probe.stderr}") from e


async def apply_patch(
    sandbox: Sandbox, patch: str, repo: str = REPO, where: str = PATCH_FILE
) -> str | None:
    """None once ``patch`` is applied to ``repo`` (written to ``where`` first), else what git
    said."""
    await sandbox.write_file(where, patch if patch.endswith("\n") else patch + "\n")
    applied = await git(sandbox, "apply", "--whitespace=nowarn", where, cwd=repo)
    return None if applied.exit_code == 0 else (applied.stdout + applied.stderr)[-1000:]


async def _changes(sandbox: Sandbox) -> list[Change]:
    """Every path that differs from the base, ignored ones included (-f)."""
    added = await git(sandbox, "add", "-A", "-f")
    diff = await git(sandbox, "diff", "--cached", "--raw", "-z", "--no-renames", "base")
    if added.exit_code != 0 or diff.exit_code != 0:
        raise SandboxError(f"git could not list the patch's changes: {added.stderr}{diff.stderr}")
    return parse_raw(diff.stdout)


async def _restore(sandbox: Sandbox, files: dict[str, str], paths: list[str]) -> None:
    """``paths`` as the snapshot has them: removed, whatever they are now, then written."""
    removed = await sandbox.exec(["rm", "-rf", "--", *paths], cwd=REPO)
    if removed.exit_code != 0:
        raise SandboxError(f"could not put the tests back: {removed.stderr[-500:]}")
    for path in paths:
        if path in files:
            await sandbox.write_file(f"{REPO}/{path}", files[path])


def _canaries() -> list[dict[str, Any]]:
    specs = []
    for kind, passes, text in CANARIES:
        a = secrets.randbelow(10**9)
        b = a if passes else a + 1 + secrets.randbelow(10**6)
        values = (f"v{a}", f"v{b}") if text else (a, b)
        name = f"test_{secrets.token_hex(5)}"
        specs.append({"name": name, "kind": kind, "a": values[0], "b": values[1], "passes": passes})
    return specs


def _verdict(
    run: ExecResult,
    request: dict[str, Any],
    specs: list[dict[str, Any]],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    metrics: dict[str, Any],
) -> Verdict:
    record, untrusted = read_record(run, request["mark"])
    outcomes = [tuple(o) for o in record.get("outcomes", []) if isinstance(o, list) and len(o) == 2]
    counts = Counter(test_id for test_id, _ in outcomes)
    said = dict(outcomes)
    untrusted += [str(t) for t in record.get("tampered", [])]

    def outcome(test_id: str) -> str:
        return {0: "missing", 1: str(said.get(test_id))}.get(counts[test_id], "duplicated")

    f2p = {t: outcome(t) for t in fail_to_pass}
    p2p = {t: outcome(t) for t in pass_to_pass}
    untrusted += [f"{t} ran {counts[t]} times" for t in request["ids"] if counts[t] > 1]
    untrusted += _canary_problems(specs, request["ids"], counts, said)
    passed = all(s == "ok" for s in [*f2p.values(), *p2p.values()])
    passing = frozenset(t for t, s in f2p.items() if s == "ok")
    resolved = passed and not untrusted
    metrics = {**metrics, "resolved": resolved, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
    if untrusted:
        metrics["untrusted"] = untrusted[:20]
    if not resolved:
        metrics["test_output"] = _output(run, record, request["ids"])
        failing = [f"{short_test_id(t)} ({s})" for t, s in f2p.items() if s != "ok"]
        broken = [f"{short_test_id(t)} ({s})" for t, s in p2p.items() if s != "ok"]
        metrics[REASON] = failing_reason(metrics, failing, broken, untrusted)
    return Verdict(resolved, metrics, passing)


def unresolved(metrics: dict[str, Any], why: str, **said: Any) -> Verdict:
    """The verdict on a patch whose tests never ran: what stopped them (``said``: git's output,
    the review's refusal) in the metrics, and ``why`` as the reason."""
    return Verdict(False, {**metrics, "resolved": False, **said, REASON: clip(why)})


def failing_reason(
    metrics: dict[str, Any], failing: list[str], broken: list[str], untrusted: list[str]
) -> str:
    """Why a run of the tests did not resolve the row: the FAIL_TO_PASS tests that still fail
    (``failing``), the PASS_TO_PASS ones that now do (``broken``; both as short_test_id gives
    them), why the run is not trusted; an empty patch said first (nothing was tried)."""
    parts = [f"{len(failing)} FAIL_TO_PASS still failing: {listed(failing, 2)}"] if failing else []
    if broken:
        parts.append(f"{len(broken)} PASS_TO_PASS now failing: {listed(broken, 2)}")
    if untrusted:
        parts.append(f"the run is not trusted: {listed(untrusted, 1)}")
    empty = "the patch is empty; " if not metrics.get("patch_bytes") else ""
    return clip(empty + ("; ".join(parts) or "the tests did not all pass"))


def short_test_id(test_id: str) -> str:
    """``test_id`` short enough for a reason: a pytest node id without its file, a dotted
    unittest id as its class and method (the metrics keep the whole ids)."""
    if "::" in test_id:
        return test_id.split("::", 1)[1]
    if " " in test_id:  # Django's "test_x (module.Class)" names stay whole
        return test_id
    return ".".join(test_id.split(".")[-2:])


def read_record(run: ExecResult, mark: str) -> tuple[dict[str, Any], list[str]]:
    """The runner's record, and why the run cannot be trusted (empty if it can)."""
    if run.timed_out:
        return {}, ["the tests ran past their time"]
    problems = []
    if run.exit_code != 0:
        problems.append(f"the test process exited with status {run.exit_code}")
    if run.stdout_cut_bytes:
        problems.append("the results channel overflowed")
    lines = run.stdout.splitlines()
    try:
        record = json.loads(lines[0]) if len(lines) == 1 else None
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or record.get("mark") != mark:
        return {}, [*problems, "the results channel holds something other than the runner's record"]
    return record, problems


def _canary_problems(
    specs: list[dict[str, Any]], ids: list[str], counts: Counter[str], said: dict[str, str]
) -> list[str]:
    problems = []
    for cls in dict.fromkeys(test_id.rsplit(".", 1)[0] for test_id in ids):
        ran = any(counts[t] for t in ids if t.rsplit(".", 1)[0] == cls)
        for spec in specs:
            test_id, want = f"{cls}.{spec['name']}", "ok" if spec["passes"] else "FAIL"
            if counts[test_id] == 0 and not ran:
                continue  # the class did not load: its own tests are missing too
            if counts[test_id] != 1 or said.get(test_id) != want:
                got = said.get(test_id, "missing") if counts[test_id] <= 1 else "duplicated"
                problems.append(f"a canary that must {'pass' if spec['passes'] else 'fail'}: {got}")
    return problems


def _output(run: ExecResult, record: dict[str, Any], ids: list[str]) -> str:
    """What the tests printed (its end), then why the expected tests failed or did not load."""
    details = record.get("details") or {}
    parts = [run.stderr[-OUTPUT_CHARS // 4 :]] if run.stderr.strip() else []
    parts += [str(details[t]) for t in ids if t in details]
    parts += [str(e) for e in record.get("errors") or []]
    return "\n".join(parts)[:OUTPUT_CHARS]
