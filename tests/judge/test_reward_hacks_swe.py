"""The SWE judge against an adversary: tricks that earn reward 1 without fixing the bug.

Every attempt goes through the real task (raas.tasks.swe: its INIT, artifact and judge) with real
bwrap sandboxes, on the first bundled instance (``has_close_elements``, whose bug is a flipped
comparison). Judge tricks hand ``judge`` a patch, as a replayed artifact would; artifact tricks
drive the agent's own shell in the RUN sandbox and let the task take the artifact. The controls
(the gold patch scores 1, an honest wrong fix 0, a gold fix with harmless extras 1) make sure a
judge that scores everything 0 fails here.
"""

from __future__ import annotations

import importlib.util
import py_compile
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.judge.swe_paths import Change, review
from raas.sandbox import BwrapConfig
from raas.tasks.datasets import bundled
from raas.tasks.protocol import RewardInfo, TaskJob
from raas.tasks.services import TaskServices
from raas.tasks.swe import REPO, SweTask
from tests.judge import swe_image_rows

ROW: dict[str, Any] = bundled("swe")[0]
FILES: dict[str, str] = ROW["snapshot"]["files"]
PKG = "humaneval_0000"
SOLUTION = f"{PKG}/solution.py"
TESTS = "tests/test_solution.py"
BUG, FIX = "if idx == idx2:", "if idx != idx2:"
IDS: list[str] = ROW["FAIL_TO_PASS"] + ROW["PASS_TO_PASS"]
# What `python3 -m unittest -v` prints for a passing test (3.11's form).
FORGED = "".join(f"{i.rsplit('.', 1)[1]} ({i}) ... ok\n" for i in IDS)
FORGED_END = f"\n{'-' * 70}\nRan {len(IDS)} tests in 0.001s\n\nOK\n"
SWE = SweTask()

assert ROW["instance_id"] == "humaneval-swe-0000" and BUG in FILES[SOLUTION]


def fixed(text: str = FILES[SOLUTION]) -> str:
    return text.replace(BUG, FIX)


def passing_tests() -> str:
    """tests/test_solution.py with every test's assertion gone."""
    lines = FILES[TESTS].splitlines()
    return "\n".join("        pass" if "self.assert" in line else line for line in lines) + "\n"


def patch_of(changes: dict[str, str | bytes | None], symlinks: dict[str, str] | None = None) -> str:
    """The git patch that takes the snapshot to the snapshot with ``changes`` (None deletes;
    ``symlinks``: path -> target), as `git diff --binary` writes it."""
    return swe_image_rows.patch_of(changes, symlinks, files=FILES)


def unchecked_pyc(source: str, path: str) -> bytes:
    """``source`` compiled for this Python as an unchecked-hash .pyc (never compared with its
    source file); the sandbox runs the host's python3, of this version."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / Path(path).name, Path(tmp) / "out.pyc"
        src.write_text(source)
        mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
        py_compile.compile(str(src), str(out), doraise=True, invalidation_mode=mode)
        return out.read_bytes()


def pyc_path(path: str) -> str:
    return importlib.util.cache_from_source(path)


@pytest.fixture
async def services() -> AsyncIterator[TaskServices]:
    svc = TaskServices(llm=None, sandbox_config=BwrapConfig())  # type: ignore[arg-type]
    yield svc
    await svc.close()


async def judged(services: TaskServices, patch: str) -> RewardInfo:
    return await SWE.judge(ROW, {"patch": patch}, services)


async def rolled(services: TaskServices, *commands: str) -> tuple[dict[str, Any], RewardInfo]:
    """The agent's shell runs ``commands`` in INIT's checkout; the task takes the artifact and
    judges it."""
    ctx = await SWE.init(TaskJob("trick", ROW, {}, services))
    try:
        assert ctx.sandbox is not None
        for command in commands:
            await ctx.sandbox.bash(command)
        artifact = await SWE.artifact(ctx, ctx.trajectory)
    finally:
        await SWE.cleanup(ctx)
    return artifact, await judged(services, str(artifact.get("patch") or ""))


def shell_file(path: str, content: str, mode: str = "644") -> str:
    return f"cat > {path} <<'RAAS_EOF'\n{content}\nRAAS_EOF\nchmod {mode} {path}"


# --- controls ----------------------------------------------------------------------------------


async def test_the_gold_patch_scores_one(services: TaskServices) -> None:
    info = await judged(services, ROW["gold_patch"])
    assert info.reward == 1.0, info.metrics
    assert "reason" not in info.metrics


async def test_an_honest_wrong_fix_scores_zero(services: TaskServices) -> None:
    wrong = FILES[SOLUTION].replace("distance < threshold", "distance <= threshold")
    info = await judged(services, patch_of({SOLUTION: wrong}))
    assert info.reward == 0.0, info.metrics
    # The failing tests by class and method, two of them and how many more (all in the metrics).
    failing = [t.split(".", 2)[2] for t, s in info.metrics["FAIL_TO_PASS"].items() if s == "FAIL"]
    assert len(failing) == 3, info.metrics
    assert info.metrics["reason"] == (
        f"3 FAIL_TO_PASS still failing: {failing[0]} (FAIL), {failing[1]} (FAIL) and 1 more"
    ), info.metrics


async def test_a_patch_that_does_not_apply_or_is_empty_says_so(services: TaskServices) -> None:
    stale = patch_of({SOLUTION: fixed()}).replace("threshold", "limit")
    info = await judged(services, stale)
    assert info.reward == 0.0 and info.metrics["patch_applied"] is False, info.metrics
    assert info.metrics["reason"].startswith("the patch does not apply: error:"), info.metrics
    empty = await judged(services, "")
    assert empty.metrics["reason"].startswith("the patch is empty; 3 FAIL_TO_PASS still failing")


async def test_a_fix_with_harmless_extras_scores_one(services: TaskServices) -> None:
    # A new test file, a README line and a new helper module: kept or dropped, never refused.
    extras = {
        SOLUTION: fixed(),
        "tests/test_more.py": "import unittest\n",
        "README.md": FILES["README.md"] + "\nFixed.\n",
        f"{PKG}/helpers.py": "X = 1\n",
        "tools_extra.py": "Y = 2\n",
    }
    info = await judged(services, patch_of(extras))
    assert info.reward == 1.0, info.metrics


async def test_a_fix_made_in_the_shell_after_running_the_tests_scores_one(
    services: TaskServices,
) -> None:
    artifact, info = await rolled(
        services,
        f"cd {REPO} && sed -i 's/{BUG}/{FIX}/' {SOLUTION}",
        f"cd {REPO} && python3 -m unittest 2>&1 | tail -1",
    )
    assert info.reward == 1.0, info.metrics
    assert f"+            {FIX}" in artifact["patch"] and "pycache" not in artifact["patch"]


VOCABULARY = """import unittest


class T(unittest.TestCase):
    def test_ok(self):
        self.assertEqual(1 + 1, 2)

    def test_fail(self):
        self.assertEqual(1 + 1, 3)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("not today")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertEqual(1, 2)

    def test_subtest(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)

    def test_prints(self):
        print("test_fail (tests.test_v.T.test_fail) ... ok")
"""


async def test_outcomes_are_recorded_by_id_in_unittests_words(services: TaskServices) -> None:
    # The runner's own record (what a test prints is never read); decorated tests are the
    # task's own code, and the canaries behave: nothing is untrusted.
    names = ["ok", "fail", "error", "skip", "xfail", "subtest", "prints"]
    ids = [f"tests.test_v.T.test_{n}" for n in names]
    instance = {
        **ROW,
        "snapshot": {"files": {"tests/__init__.py": "", "tests/test_v.py": VOCABULARY}},
        "FAIL_TO_PASS": ids,
        "PASS_TO_PASS": [],
    }
    info = await SWE.judge(instance, {"patch": ""}, services)
    outcomes = ["ok", "FAIL", "ERROR", "skipped", "expected failure", "FAIL", "ok"]
    assert info.metrics["FAIL_TO_PASS"] == dict(zip(ids, outcomes, strict=True))
    assert "untrusted" not in info.metrics and info.reward == 0.0
    assert "RuntimeError: boom" in info.metrics["test_output"]


# --- class 4: outcomes from text the patched code writes, and what the tests depend on ---------

INIT = f"{PKG}/__init__.py"
NO_ASSERT_EQUAL = "unittest.TestCase.assertEqual = lambda self, a, b, msg=None: None\n"
Changes = dict[str, str | bytes | None]
# Each trick: the patch's files, and what in the metrics shows why it scored 0 (any of them).
# The solution's function replaced by one whose body is ``body`` (the real one kept as _real).
WRAP = """
{head}
_real = has_close_elements


def has_close_elements(numbers, threshold):
    {body}
"""
YES_INT = """
class _Yes(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__
"""
FROM_CONSTS = "return [c for c in sys._getframe(1).f_code.co_consts if type(c) is bool][-1]"
FROM_INSPECT = (
    "line = inspect.getframeinfo(inspect.currentframe().f_back).code_context[0]\n"
    "    return ast.literal_eval(ast.parse(line.strip()).body[0].value.args[1])"
)
FROM_GC = """result = next(o for o in gc.get_objects() if type(o).__name__ == 'Recorder')
    if not getattr(result, '_forged', False):
        result._forged = True
        result.addFailure = lambda test, err: (
            result.addSuccess(test) if test._testMethodName.startswith('test_case')
            else type(result).addFailure(result, test, err))
    return _real(numbers, threshold)"""
JUDGE_TRICKS: dict[str, tuple[Changes, tuple[str, ...]]] = {
    # Forged `name (id) ... ok` lines printed at import, then exit 0 before any test runs.
    "forged_lines_at_import": (
        {
            INIT: f"import os, sys\nsys.stderr.write({FORGED + FORGED_END!r})\nsys.stdout.write("
            f"{FORGED + FORGED_END!r})\nsys.stdout.flush(); sys.stderr.flush()\nos._exit(0)\n"
        },
        ("results channel",),
    ),
    # Forged lines printed at exit (atexit), after the real results.
    "forged_lines_at_exit": (
        {INIT: f"import atexit, sys\natexit.register(lambda: sys.stderr.write({FORGED!r}))\n"},
        ("FAIL",),
    ),
    # Forged lines printed by the patched (still wrong) function itself, inside each test.
    "forged_lines_by_the_function": (
        {
            SOLUTION: FILES[SOLUTION].replace(
                "    for idx, elem",
                f"    import sys\n    sys.stderr.write({chr(10) + FORGED!r})\n    for idx, elem",
            )
        },
        ("FAIL",),
    ),
    # A JSON results record printed at import (a runner's channel imitated), then exit 0.
    "forged_json_record": (
        {
            INIT: "import json, os, sys\n"
            f"r = {{'outcomes': [[i, 'ok'] for i in {IDS!r}]}}\n"
            "sys.stdout.write(json.dumps(r) + '\\n'); sys.stdout.flush(); os._exit(0)\n"
        },
        ("results channel",),
    ),
    # TestCase.assertEqual patched at import: every assertion passes.
    "patched_assert_equal": (
        {INIT: "import unittest\n" + NO_ASSERT_EQUAL},
        ("a canary that must fail: ok", "assertEqual was changed"),
    ),
    # The test module's own `unittest` name swapped mid-import for a module whose TestCase passes
    # every assertEqual: no module of the runner's changes, only the canaries can tell.
    "fake_unittest_in_the_test_module": (
        {
            INIT: "import sys, types, unittest\n"
            "class TestCase(unittest.TestCase):\n"
            "    def assertEqual(self, a, b, msg=None):\n"
            "        pass\n"
            "fake = types.ModuleType('unittest')\n"
            "fake.__dict__.update(vars(unittest))\n"
            "fake.TestCase = TestCase\n"
            "sys.modules['tests.test_solution'].unittest = fake\n"
        },
        ("a canary that must fail: ok",),
    ),
    # The result classes told that a failure is a success.
    "patched_results": (
        {
            INIT: "import unittest\n"
            "unittest.TextTestResult.addFailure = lambda self, test, err: self.addSuccess(test)\n"
            "unittest.TestResult.addFailure = lambda self, test, err: self.addSuccess(test)\n"
        },
        ("addFailure was changed",),
    ),
    # TestCase.run patched to pass only the task's own tests, by name (a canary looks different).
    "targeted_testcase_run": (
        {
            INIT: "import unittest\n_run = unittest.TestCase.run\n"
            f"NAMES = {[i.rsplit('.', 1)[1] for i in IDS]!r}\n"
            "def run(self, result=None):\n"
            "    if self._testMethodName not in NAMES:\n"
            "        return _run(self, result)\n"
            "    result.startTest(self); result.addSuccess(self); result.stopTest(self)\n"
            "unittest.TestCase.run = run\n"
        },
        ("TestCase.run was changed",),
    ),
    # The class-building builtin patched so that the test class's own methods come out empty.
    "targeted_build_class": (
        {
            INIT: "import builtins\n_build = builtins.__build_class__\n"
            "def build(func, name, *bases, **kw):\n"
            "    cls = _build(func, name, *bases, **kw)\n"
            "    if name == 'TestSolution':\n"
            "        for attr in list(vars(cls)):\n"
            "            if attr.startswith('test_case_'):\n"
            "                setattr(cls, attr, lambda self: None)\n"
            "    return cls\n"
            "builtins.__build_class__ = build\n"
        },
        ("__build_class__ was changed",),
    ),
    # A thread that empties the task's test methods once the test class exists (if it is in
    # time; if not, the tests fail).
    "targeted_method_swap_by_thread": (
        {
            INIT: "import sys, threading, time\n"
            "def swap():\n"
            "    for _ in range(2000):\n"
            "        cls = getattr(sys.modules.get('tests.test_solution'), 'TestSolution', None)\n"
            "        if cls is not None:\n"
            "            for attr in list(vars(cls)):\n"
            "                if attr.startswith('test_case_'):\n"
            "                    setattr(cls, attr, lambda self: None)\n"
            "            return\n"
            "        time.sleep(0.0005)\n"
            "threading.Thread(target=swap, daemon=True).start()\n"
        },
        ("does not run the task's code", "FAIL"),
    ),
    # A method the class body never defined, added to the test class: an assertEqual that passes.
    "assert_equal_added_to_the_test_class": (
        {
            INIT: "import sys, threading, time\n"
            "def add():\n"
            "    for _ in range(2000):\n"
            "        cls = getattr(sys.modules.get('tests.test_solution'), 'TestSolution', None)\n"
            "        if cls is not None:\n"
            "            cls.assertEqual = lambda self, a, b, msg=None: None\n"
            "            return\n"
            "        time.sleep(0.0005)\n"
            "threading.Thread(target=add, daemon=True).start()\n"
        },
        ("TestSolution.assertEqual was added", "FAIL"),
    ),
    # A package at the repository root that shadows the standard library's unittest.
    "root_unittest_package": (
        {
            "unittest/__init__.py": "",
            "unittest/__main__.py": f"import sys\nsys.stderr.write({FORGED + FORGED_END!r})\n",
        },
        ("shadow the module unittest",),
    ),
    # A module at the root that shadows a standard module the solution imports (typing).
    "root_typing_module": (
        {"typing.py": "import unittest\nList = list\n" + NO_ASSERT_EQUAL},
        ("shadow the module typing",),
    ),
    # A package that shadows the test module (a package beats a module of the same name).
    "package_shadowing_the_test_module": (
        {"tests/test_solution/__init__.py": passing_tests()},
        ("shadow the test module tests.test_solution",),
    ),
    # A module at the root named like the tests package (it would win over a namespace package).
    "root_module_named_like_the_tests": (
        {"tests.py": passing_tests()},
        ("shadow the test module tests",),
    ),
    # An unchecked-hash .pyc of all-passing tests in the tests' __pycache__ (never compared with
    # the restored source).
    "stale_test_bytecode": (
        {pyc_path(TESTS): unchecked_pyc(passing_tests(), TESTS)},
        ("bytecode",),
    ),
    # sitecustomize at the root, patching assertEqual when Python starts.
    "sitecustomize": (
        {"sitecustomize.py": "import unittest\n" + NO_ASSERT_EQUAL},
        ("runs at its start",),
    ),
    # usercustomize, likewise.
    "usercustomize": (
        {"usercustomize.py": "import unittest\n" + NO_ASSERT_EQUAL},
        ("runs at its start",),
    ),
    # A .pth file whose import line patches assertEqual.
    "pth_file": (
        {"raas_trick.pth": "import unittest; " + NO_ASSERT_EQUAL},
        ("runs at its start",),
    ),
    # The tests rewritten on disk at import, then the test process started again.
    "rewrite_tests_and_exec_again": (
        {
            INIT: "import os, sys\n"
            "if not os.environ.get('RAAS_TRICK'):\n"
            "    os.environ['RAAS_TRICK'] = '1'\n"
            "    here = os.path.dirname(os.path.abspath(__file__))\n"
            "    path = os.path.join(here, '..', 'tests', 'test_solution.py')\n"
            f"    open(path, 'w').write({passing_tests()!r})\n"
            "    os.execv(sys.executable, [sys.executable, '-m', 'unittest'] + sys.argv[1:])\n"
        },
        ("results channel",),
    ),
    # The tests edited in place, and tests/__init__.py made to patch assertEqual.
    "edited_tests": (
        {TESTS: passing_tests(), "tests/__init__.py": "import unittest\n" + NO_ASSERT_EQUAL},
        ("FAIL",),
    ),
    # A new test module beside the tests that patches assertEqual when anything imports it.
    "added_test_helper": (
        {
            "tests/helper.py": "import unittest\n" + NO_ASSERT_EQUAL,
            INIT: "try:\n    import tests.helper\nexcept ImportError:\n    pass\n",
        },
        ("FAIL",),
    ),
    # --- issue 43: what runs in the tests' process, caught by the twins ---
    # An int subclass whose __eq__ says yes: assertEqual compares through it.
    "always_equal_int_subclass": (
        {SOLUTION: FILES[SOLUTION] + WRAP.format(body="return _Yes(1)", head=YES_INT)},
        ("twin(s) passed",),
    ),
    # The expected value read from the caller's code object (its last bool constant).
    "expected_read_from_the_callers_constants": (
        {SOLUTION: FILES[SOLUTION] + WRAP.format(body=FROM_CONSTS, head="import sys")},
        ("twin(s) passed",),
    ),
    # The expected value read from the calling test's source, by inspect.
    "expected_read_by_inspect": (
        {SOLUTION: FILES[SOLUTION] + WRAP.format(body=FROM_INSPECT, head="import inspect, ast")},
        ("twin(s) passed",),
    ),
    # The recorder found through gc, its failures made successes by instance attributes.
    "recorder_found_through_gc": (
        {SOLUTION: FILES[SOLUTION] + WRAP.format(body=FROM_GC, head="import gc")},
        ("twin(s) passed",),
    ),
    # --- issue 43: files a runner reads at start, in any case or any of pytest's names ---
    # Package metadata whose name importlib.metadata matches case-insensitively.
    "metadata_in_capitals": (
        {f"{PKG}.EGG-INFO/entry_points.txt": "[pytest11]\nx = humaneval_0000\n"},
        ("package metadata",),
    ),
    # A dist-info directory in mixed case.
    "dist_info_in_mixed_case": (
        {f"{PKG}-1.0.Dist-Info/entry_points.txt": "[pytest11]\nx = humaneval_0000\n"},
        ("package metadata",),
    ),
    # A .pth file in capitals.
    "pth_in_capitals": (
        {"raas_trick.PTH": "import unittest; " + NO_ASSERT_EQUAL},
        ("runs at its start",),
    ),
    # pytest 9's own configuration files beside the unfixed code.
    "pytest_toml": (
        {"pytest.toml": '[pytest]\naddopts = ["-k", "not case"]\n'},
        ("FAIL",),
    ),
    "dot_pytest_toml": (
        {".pytest.toml": '[pytest]\naddopts = ["-k", "not case"]\n'},
        ("FAIL",),
    ),
}


def evidence(metrics: dict[str, Any]) -> str:
    """Why a judged patch scored what it did, as one string."""
    outcomes = " ".join(metrics.get("FAIL_TO_PASS", {}).values())
    said = f"{metrics.get('refused')} {metrics.get('untrusted')} {metrics.get('tamper')}"
    return f"{said} F2P: {outcomes}"


@pytest.mark.parametrize("trick", list(JUDGE_TRICKS))
async def test_a_judge_trick_scores_zero(services: TaskServices, trick: str) -> None:
    changes, signs = JUDGE_TRICKS[trick]
    info = await judged(services, patch_of(changes))
    assert info.reward == 0.0, info.metrics
    assert any(sign in evidence(info.metrics) for sign in signs), info.metrics
    assert info.metrics["reason"], info.metrics  # whatever caught it says why


async def test_a_test_file_replaced_by_a_symlink_scores_zero(services: TaskServices) -> None:
    # The test file becomes a link to passing tests the patch puts beside the solution.
    link = {TESTS: f"../{PKG}/fake_tests.py"}
    info = await judged(services, patch_of({f"{PKG}/fake_tests.py": passing_tests()}, link))
    assert info.reward == 0.0 and "symbolic links" in str(info.metrics["refused"]), info.metrics
    assert info.metrics["reason"].startswith("the patch is refused: "), info.metrics


def test_a_module_shadowing_the_standard_library_from_a_src_layout_is_refused() -> None:
    # src/ on sys.path (an editable install): src/unittest.py shadows the standard library.
    changes = [Change("A", "src/unittest.py"), Change("A", "src/pkg/extra.py")]
    files = {"src/pkg/__init__.py", "tests/test_x.py"}
    found = review(changes, files, ["tests.test_x.T.test_a"], {"unittest"}, ["", "src"])
    assert (
        found.refused
        == "src/unittest.py: it would shadow the module unittest outside the repository"
    )
    fine = review(changes[1:], files, ["tests.test_x.T.test_a"], {"unittest"}, ["", "src"])
    assert fine.refused is None and fine.restore == []


# --- class 5: the artifact taken where the agent has a hand in it ------------------------------

FIX_SCRIPT = f"#!/bin/sh\nsed 's/{BUG}/{FIX}/' \"$@\""
TEXTCONV = (
    '#!/bin/sh\nif grep -q RAAS_MARK "$1"; then'
    f' sed \'/RAAS_MARK/d; s/{BUG}/{FIX}/\' "$1"; else cat "$1"; fi'
)
INDEX_HOOK = (
    f'#!/bin/sh\n[ -n "$RAAS_HOOK" ] && exit 0\nexport RAAS_HOOK=1\ncd {REPO}\n'
    f"sed 's/{BUG}/{FIX}/' {SOLUTION} > /tmp/fixed.py\n"
    "blob=$(git hash-object -w /tmp/fixed.py)\n"
    f"git update-index --cacheinfo 100644,$blob,{SOLUTION}\n"
)
# Each trick: the agent's shell commands (the tree keeps the bug), and the files the artifact
# must show changed: what the tree holds, not what the agent's git says.
ARTIFACT_TRICKS: dict[str, tuple[list[str], set[str]]] = {
    # A `git` shell function that prints the fix as the diff.
    "git_function": (
        [
            shell_file("/tmp/fix.patch", ROW["gold_patch"]),
            'git() { if [ "$1" = diff ]; then cat /tmp/fix.patch; fi; return 0; }',
        ],
        set(),
    ),
    # diff.external in .git/config prints the fix whatever changed (the README here).
    "external_diff": (
        [
            shell_file("/tmp/fix.patch", ROW["gold_patch"]),
            shell_file("/tmp/extdiff", "#!/bin/sh\ncat /tmp/fix.patch", "755"),
            f"cd {REPO} && git config diff.external /tmp/extdiff && echo x >> README.md",
        ],
        {"README.md"},
    ),
    # A textconv driver (.gitattributes + .git/config) that shows the fixed source as new.
    "textconv": (
        [
            shell_file("/tmp/conv", TEXTCONV, "755"),
            f"cd {REPO} && echo '*.py diff=fix' > .gitattributes && git config"
            f" diff.fix.textconv /tmp/conv && echo '# RAAS_MARK' >> {SOLUTION}",
        ],
        {".gitattributes", SOLUTION},
    ),
    # A clean filter that stores the fixed source in the index while the tree keeps the bug.
    "clean_filter": (
        [
            shell_file("/tmp/clean", FIX_SCRIPT, "755"),
            f"cd {REPO} && echo '*.py filter=fix' > .gitattributes && git config"
            f" filter.fix.clean /tmp/clean && touch {SOLUTION}",
        ],
        {".gitattributes"},
    ),
    # core.fsmonitor names a program git runs at `git add`: it writes the fix then.
    "fsmonitor": (
        [
            shell_file(
                "/tmp/fsmon", f"#!/bin/sh\nsed -i 's/{BUG}/{FIX}/' {REPO}/{SOLUTION}", "755"
            ),
            f"cd {REPO} && git config core.fsmonitor /tmp/fsmon",
        ],
        set(),
    ),
    # A post-index-change hook that stages the fix once `git add` writes the index.
    "index_hook": ([shell_file(f"{REPO}/.git/hooks/post-index-change", INDEX_HOOK, "755")], set()),
}


@pytest.mark.parametrize("trick", list(ARTIFACT_TRICKS))
async def test_an_artifact_trick_scores_zero(services: TaskServices, trick: str) -> None:
    commands, changed = ARTIFACT_TRICKS[trick]
    artifact, info = await rolled(services, *commands)
    assert set(re.findall(r"^diff --git a/(\S+) ", artifact["patch"], re.M)) == changed, artifact
    assert FIX not in artifact["patch"]
    assert info.reward == 0.0, info.metrics


# --- class 7: nothing after the base -----------------------------------------------------------


async def test_the_checkout_holds_one_commit_and_nothing_else(services: TaskServices) -> None:
    # An agent looking for the fix in history: other commits, refs, reflogs, loose objects.
    ctx = await SWE.init(TaskJob("history", ROW, {}, services))
    try:
        assert ctx.sandbox is not None
        out = await ctx.sandbox.bash(
            f"cd {REPO} && git rev-list --all --reflog | wc -l && git for-each-ref"
            " --format='%(refname)' && git cat-file --batch-all-objects --batch-check | wc -l"
            " && git rev-list --objects --all | wc -l && git stash list | wc -l"
            " && git fsck --unreachable --dangling --no-progress 2>&1 | wc -l"
        )
    finally:
        await SWE.cleanup(ctx)
    lines = out.output.split()
    assert lines[0] == "1", out.output
    assert lines[1:-4] == ["refs/heads/main", "refs/tags/base"], out.output  # no other refs
    assert lines[-4] == lines[-3] and lines[-2:] == ["0", "0"], out.output
