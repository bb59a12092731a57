"""Each task's reward in both directions, with scripted policies and real sandboxes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest

from raas.llm.models import load_tokenizer
from raas.pipeline import JobRequest, Pipeline, PipelineConfig, RequestRejected
from raas.sandbox import BwrapConfig
from raas.store.sqlite import ResultStore
from raas.tasks import InvalidInstance, TaskJob, TaskRegistry
from raas.tasks.code import CodeTask
from raas.tasks.datasets import humaneval_problems
from raas.tasks.harness import HarnessTask
from raas.tasks.lookup import LookupTask
from raas.tasks.math import MathTask
from raas.tasks.services import TaskServices
from raas.tasks.stem import StemTask
from raas.tasks.swe import TEST_COMMAND, SweTask
from tests.support.policies import ScriptedPolicy, call
from tests.support.probe import WAIT_S

Run = Callable[..., Any]


def registry() -> TaskRegistry:
    reg = TaskRegistry()
    for task in (CodeTask(), SweTask(), MathTask(), StemTask(), LookupTask()):
        reg.register(task)
    return reg


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """``await run(instance, script, **request) -> result``: one job through the pipeline."""

    runs = iter(range(1000))

    async def go(instance: dict[str, Any], script: list[str], **request: Any) -> dict[str, Any]:
        policy = ScriptedPolicy(load_tokenizer("smollm2"), {"job": script})
        services = TaskServices(llm=policy, sandbox_config=BwrapConfig())
        store = ResultStore(tmp_path / f"run{next(runs)}.db")
        await store.open()
        config = PipelineConfig(job_timeout_s=120, cancel_grace_s=1)
        pipeline = Pipeline(registry(), store, config, services=services)
        await pipeline.start()
        try:
            await pipeline.submit([JobRequest.of(instance, job_id="job", **request)])
            view = await pipeline.wait("job", WAIT_S * 6)
            assert view is not None and view.result is not None, view
            assert policy.released == ["job"] or view.result.stage_failed == "init"
            return view.result.model_dump(mode="json")
        finally:
            await pipeline.stop()
            await services.close()
            await store.close()

    return go


def humaneval_problem(task_id: str) -> dict[str, Any]:
    return next(p for p in humaneval_problems() if p["task_id"] == task_id)


def write_file(path: str, content: str) -> str:
    return call("bash", command=f"cat > {path} <<'RAAS_EOF'\n{content}\nRAAS_EOF")


async def test_code_reward_both_ways(run: Run) -> None:
    problem = humaneval_problem("HumanEval/0")
    instance = {
        "data_source": "code",
        "instance_id": "HumanEval/0",
        **{k: problem[k] for k in ("prompt", "entry_point", "test")},
    }
    right = problem["prompt"] + problem["canonical_solution"]
    wrong = problem["prompt"] + "    return False\n"
    good = await run(instance, [write_file("/workspace/solution.py", right), call("finish")])
    bad = await run(instance, [write_file("/workspace/solution.py", wrong), call("finish")])
    assert (good["state"], good["reward"]) == ("done", 1.0)
    assert (bad["state"], bad["reward"]) == ("done", 0.0)
    assert "AssertionError" in bad["metrics"]["test_output"]
    assert bad["metrics"]["reason"].startswith("tests failed: AssertionError")
    assert "reason" not in good["metrics"]
    assert good["metrics"]["artifact"]["solution"].strip() == right.strip()


async def test_code_a_solution_that_claims_success_and_exits_scores_zero(run: Run) -> None:
    """It prints the judge's old pass line and exits 0 before any test runs: its prints go
    nowhere (the judge's output is not the solution's), and its exit is the solution failing."""
    problem = humaneval_problem("HumanEval/2")
    instance = {
        "data_source": "code",
        "instance_id": "HumanEval/2",
        **{k: problem[k] for k in ("prompt", "entry_point", "test")},
    }
    cheat = problem["prompt"] + "    return None\n\nprint('ALL TESTS PASSED')\nraise SystemExit(0)"
    result = await run(instance, [write_file("/workspace/solution.py", cheat), call("finish")])
    assert (result["state"], result["reward"]) == ("done", 0.0)
    assert "SystemExit: 0" in result["metrics"]["test_output"]


CALC = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/__init__.py": "",
    "tests/test_ops.py": (
        "import unittest\nfrom calc.ops import add, mul\n\n\nclass TestOps(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    ),
}
SWE = {
    "data_source": "swe",
    "instance_id": "calc-1",
    "problem_statement": "add(2, 3) returns -1 instead of 5.",
    "snapshot": {"files": CALC},
    "test_command": "python3 -m unittest -v",
    "FAIL_TO_PASS": ["tests.test_ops.TestOps.test_add"],
    "PASS_TO_PASS": ["tests.test_ops.TestOps.test_mul"],
}


def sed(expr: str, path: str = "calc/ops.py") -> str:
    return call("bash", command=f"cd /workspace/repo && sed -i '{expr}' {path}")


async def test_swe_resolves_only_a_real_fix(run: Run) -> None:
    fixed = await run(SWE, [sed("s/a - b/a + b/"), call("finish")])
    assert (fixed["state"], fixed["reward"]) == ("done", 1.0)
    assert fixed["metrics"]["FAIL_TO_PASS"] == {"tests.test_ops.TestOps.test_add": "ok"}
    assert "+    return a + b" in fixed["metrics"]["artifact"]["patch"]
    breaks = await run(SWE, [sed("s/a - b/a + b/; s/a \\* b/a + b/"), call("finish")])
    assert breaks["reward"] == 0.0 and breaks["metrics"]["FAIL_TO_PASS"] == {
        "tests.test_ops.TestOps.test_add": "ok"
    }
    assert breaks["metrics"]["PASS_TO_PASS"] == {"tests.test_ops.TestOps.test_mul": "FAIL"}
    cheat = await run(
        SWE, [sed("s/assertEqual(add(2, 3), 5)/assertTrue(True)/", "tests/test_ops.py")]
    )
    assert cheat["reward"] == 0.0  # the original tests are put back before judging
    nothing = await run(SWE, [call("finish")])
    assert nothing["reward"] == 0.0 and nothing["metrics"]["patch_applied"] is False


async def test_a_swe_fix_after_running_the_tests_leaves_no_bytecode_in_the_patch(run: Run) -> None:
    tests = call("bash", command="cd /workspace/repo && python3 -m unittest 2>&1 | tail -1")
    fixed = await run(SWE, [sed("s/a - b/a + b/"), tests, call("finish")])
    patch = fixed["metrics"]["artifact"]["patch"]
    assert (fixed["reward"], fixed["metrics"]["patch_applied"]) == (1.0, True), fixed["metrics"]
    assert "+    return a + b" in patch and "pycache" not in patch and ".pyc" not in patch


async def test_swe_without_an_image_fails_at_init_saying_why(run: Run) -> None:
    real = {**SWE, "repo": "astropy/astropy", "base_commit": "abc123"}
    del real["snapshot"]
    result = await run(real, [])
    assert result["state"] == "failed" and result["stage_failed"] == "init"
    assert "needs its environment image" in result["error"]["message"]


async def test_math_reward_both_ways(run: Run) -> None:
    instance = {"data_source": "math", "problem": "What is 3/4 as a decimal?", "answer": "0.75"}
    by_finish = await run(instance, [call("finish", answer="3/4")])
    boxed = await run(instance, ["So the answer is \\boxed{\\frac{3}{4}}."])
    wrong = await run(instance, [call("finish", answer="0.7")])
    assert [r["reward"] for r in (by_finish, boxed, wrong)] == [1.0, 1.0, 0.0]
    assert boxed["trajectory"]["stop_reason"] == "no_tool_call"


async def test_math_with_ipython(run: Run) -> None:
    instance = {"data_source": "math", "problem": "Compute 123 * 456.", "answer": "56088"}
    result = await run(
        instance, [call("ipython", code="123 * 456"), call("finish", answer="56088")]
    )
    assert result["reward"] == 1.0
    assert "Out: 56088" in result["trajectory"]["messages"][3]["content"]


async def test_stem_reward_both_ways(run: Run) -> None:
    options = {"A": "joule", "B": "newton", "C": "watt", "D": "pascal"}
    choice = {
        "data_source": "stem",
        "question": "Unit of force?",
        "choices": options,
        "answer": "B",
    }
    numeric = {
        "data_source": "stem",
        "question": "v after 2 s at 3 m/s^2 from rest?",
        "answer": 6.0,
        "unit": "m/s",
    }
    results = [
        await run(choice, [call("finish", answer="B")]),
        await run(choice, [call("finish", answer="(A)")]),
        await run(numeric, [call("finish", answer="6.02 m/s")]),
        await run(numeric, [call("finish", answer="12 m/s")]),
        await run(numeric, [call("finish", answer="12 or 6 m/s")]),  # a hedge
        await run(numeric, ["So v = 3 * 2 = 6 m/s."]),  # a reply's end: its last number
    ]
    assert [r["reward"] for r in results] == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]


async def test_stem_finish_only_scores_the_finish_call_alone(run: Run) -> None:
    instance = {
        "data_source": "stem",
        "question": "What is 37 * 100?",
        "answer": 3700,
        "rel_tol": 0.0,
    }
    strict = {**instance, "finish_only": True}
    results = [
        await run(instance, ["37 * 100 = 3700"]),  # plain text: read from the reply's end
        await run(strict, ["37 * 100 = 3700"]),  # plain text: no answer at all
        await run(strict, [call("finish", answer="3700")]),
        await run(strict, [call("finish", answer="37000")]),
    ]
    assert [r["reward"] for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert results[1]["metrics"]["artifact"] == {"answer": None, "given": True}


LOOKUP = {
    "data_source": "lookup",
    "question": "What is the number in data/n.txt times 100?",
    "files": {"data/n.txt": "73182\n", "notes.txt": "nothing here\n"},
    "answer": 7318200,
}


async def test_answer_judges_say_why_below_a_pass_and_nothing_on_one() -> None:
    """Each answer task's judge, called on an artifact as its EVAL gives it (they run nothing,
    so no services): a wrong answer's ``reason`` names what was read and what was expected."""
    services = cast(TaskServices, None)
    math = {"data_source": "math", "problem": "p", "answer": "13"}
    choice = {"data_source": "stem", "question": "q", "choices": {"A": 1, "B": 2}, "answer": "B"}
    numeric = {"data_source": "stem", "question": "q", "answer": 6.0}
    cases: list[tuple[Any, dict[str, Any], dict[str, Any], str | None]] = [
        (MathTask(), math, {"answer": "13"}, None),
        (MathTask(), math, {"answer": "12"}, "answer read: 12, expected 13"),
        (MathTask(), math, {"answer": None}, "no answer found"),
        (StemTask(), choice, {"answer": "B"}, None),
        (StemTask(), choice, {"answer": "A"}, "answer read: A, expected B"),
        (StemTask(), choice, {"answer": "A or B"}, "no single choice letter found in the answer"),
        (StemTask(), numeric, {"answer": "6.01", "given": True}, None),
        (
            StemTask(),
            numeric,
            {"answer": "12 m/s", "given": True},
            "answer read: 12, expected 6 (relative tolerance 0.01)",
        ),
        (
            StemTask(),
            numeric,
            {"answer": "12 or 6", "given": True},
            "answer read: 12, 6, expected 6 (relative tolerance 0.01), and one value only",
        ),
        (StemTask(), numeric, {"answer": "six-ish", "given": False}, "no answer found"),
        (LookupTask(), LOOKUP, {"answer": "7318200"}, None),
        (LookupTask(), LOOKUP, {"answer": "73182"}, "answer read: 73182, expected 7318200"),
        (LookupTask(), LOOKUP, {"answer": None}, "no answer found"),
    ]
    for task, instance, artifact, reason in cases:
        info = await task.judge(instance, artifact, services)
        assert info.metrics.get("reason") == reason, (instance, artifact, info)
        assert (info.reward == 1.0) == (reason is None)


async def test_lookup_reward_both_ways(run: Run) -> None:
    """The number is only in the sandbox's file: the bash observation shows it, and the finish
    answer alone is judged, one value."""
    read = call("bash", command="cat data/n.txt")
    results = [
        await run(LOOKUP, [read, call("finish", answer="7318200")]),
        await run(LOOKUP, [read, call("finish", answer="73182")]),  # read, not computed
        await run(LOOKUP, [read, call("finish", answer="7318200 or 731820")]),  # a hedge
        await run(LOOKUP, [read, "It is 7318200."]),  # plain text: no answer
    ]
    assert [r["reward"] for r in results] == [1.0, 0.0, 0.0, 0.0]
    observation = results[0]["trajectory"]["messages"][3]
    assert observation["role"] == "tool" and observation["content"].startswith("73182\n")
    assert results[0]["metrics"]["answer_in_prompt"] is False
    leaky = {**LOOKUP, "question": "What is 73182 * 100 (7318200)?"}
    result = await run(leaky, [call("finish", answer="7318200")])
    assert result["reward"] == 1.0 and result["metrics"]["answer_in_prompt"] is True


async def test_lookup_files_are_the_only_trace_of_the_task_in_the_sandbox(run: Run) -> None:
    """A policy that searches the sandbox for the answer, or for the number the question is
    about anywhere but the files it was given, finds nothing: the instance itself (its answer
    field) never enters the sandbox."""
    search = (
        "grep -rls -e '7318[2]' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev"
        " --exclude-dir=usr --exclude-dir=lib --exclude-dir=lib64 --exclude-dir=bin"
        " --exclude-dir=sbin --exclude-dir=etc --exclude-dir=opt 2>/dev/null | grep -v data/n.txt;"
        " cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'"
        " | grep -c '7318[2]'"
    )
    result = await run(LOOKUP, [call("bash", command=search), call("finish", answer="0")])
    observation = result["trajectory"]["messages"][3]["content"]
    assert observation.splitlines()[0] == "0", observation  # no path, no process holds it
    assert result["reward"] == 0.0


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        ({"data_source": "code", "prompt": "def f():", "test": "x"}, "instance.entry_point"),
        (
            {"data_source": "swe", "problem_statement": "x", "FAIL_TO_PASS": ["t"]},
            "instance.snapshot",
        ),
        (
            {
                "data_source": "swe",
                "problem_statement": "x",
                "snapshot": {"files": {}},
                "FAIL_TO_PASS": "t",
            },
            "instance.FAIL_TO_PASS",
        ),
        ({**SWE, "FAIL_TO_PASS": ["tests.t.T.test_a", 3]}, "instance.FAIL_TO_PASS.1"),
        ({**SWE, "snapshot": {"files": {"a.py": None}}}, "instance.snapshot.files.a.py"),
        ({**SWE, "FAIL_TO_PASS": []}, "instance.FAIL_TO_PASS"),
        ({"data_source": "math", "problem": "1+1"}, "instance.answer"),
        ({"data_source": "math", "prompt": 5, "answer": "2"}, "instance.prompt"),
        ({"data_source": "math", "problem": "1+1", "answer": [2]}, "instance.answer"),
        ({"data_source": "stem", "question": "q", "answer": "about six"}, "instance.answer"),
        ({"data_source": "stem", "question": "q", "answer": 6, "rel_tol": -1}, "instance.rel_tol"),
        (
            {"data_source": "stem", "question": "q", "answer": 6, "finish_only": 1},
            "instance.finish_only",
        ),
        (
            {"data_source": "code", "prompt": "def f():", "entry_point": 3, "test": "x"},
            "instance.entry_point",
        ),
        (
            {"data_source": "stem", "question": "q", "answer": "E", "choices": {"A": "a"}},
            "instance.answer",
        ),
        ({**LOOKUP, "files": {"../n.txt": "1"}}, "instance.files.../n.txt.[key]"),
        ({**LOOKUP, "files": {}}, "instance.files"),
        ({**LOOKUP, "answer": " "}, "instance.answer"),
        ({"data_source": "math", "problem": "1+1", "answer": "2", "sampling_params": 1}, None),
    ],
)
async def test_malformed_instances_name_the_field(
    tmp_path: Path, instance: dict[str, Any], field: str | None
) -> None:
    instance = {k: v for k, v in instance.items() if k != "sampling_params"}
    handler = registry().get(instance["data_source"])
    job = TaskJob("j", instance, {"temprature": 1} if field is None else {})
    with pytest.raises(InvalidInstance) as exc:
        handler.validate(job)  # type: ignore[attr-defined]
    assert exc.value.field == (field or "sampling_params.temprature")
    with pytest.raises(InvalidInstance):  # INIT checks too: a failed result naming the field
        await handler.init(job)
    store = ResultStore(tmp_path / "m.db")
    await store.open()
    pipeline = Pipeline(registry(), store, PipelineConfig())
    with pytest.raises(RequestRejected):
        await pipeline.submit([JobRequest.of(instance, sampling_params=job.sampling_params)])
    await store.close()


async def test_the_time_budget_ends_a_long_rollout(run: Run) -> None:
    instance = {"data_source": "math", "problem": "Wait.", "answer": "1"}
    # The budget covers INIT (a sandbox start, 2 s at most seen on a loaded machine: 10 s, so
    # that INIT never takes it all) and the first turn; each call outlasts what is left of it.
    script = [call("ipython", code=f"import time; time.sleep(3600); {i}") for i in range(20)]
    result = await run(instance, script, timeout_s=10)
    assert result["state"] == "timeout", result
    assert result["stage_failed"] == "run", f"INIT took the whole 10 s: {result['timing']}"
    turns = result["trajectory"]["turns"]
    assert 1 <= len(turns) < 20 and len(result["trajectory"]["response_ids"]) > 0


def test_swe_tells_the_model_the_command_the_judge_runs() -> None:
    """The instance's own test_command is not what EVAL runs, so the model is not told it."""
    text = SweTask().messages({**SWE, "test_command": "pytest -x tests"})[1]["content"]
    assert f"`{TEST_COMMAND}`" in text and "pytest" not in text


# -- what the OpenAPI document says an instance needs -------------------------------------------

HUMANEVAL = {"prompt": "def f():\n", "entry_point": "f", "test": "def check(f): pass"}
CONTEST = {"reward_model": {"ground_truth": {"cases": [{"stdin": "1", "expected": "1"}]}}}
SNAPSHOT = {"problem_statement": "p", "FAIL_TO_PASS": ["t"], "snapshot": {"files": {}}}
IMAGE_ROW = {"problem_statement": "p", "FAIL_TO_PASS": ["t"], "repo": "r", "base_commit": "c"}
SCHEMA_CASES: list[tuple[Any, dict[str, Any], bool]] = [
    (MathTask, {"problem": "1+1", "answer": 2}, True),
    (MathTask, {"problem": "", "question": "q", "answer": "2"}, True),
    (MathTask, {"prompt": [{"role": "user"}], "reward_model": {"ground_truth": ["3"]}}, True),
    (MathTask, {"answer": 2}, False),
    (MathTask, {"problem": "x", "answer": ""}, False),
    (MathTask, {"prompt": [], "ground_truth": 1}, False),
    (MathTask, {"problem": "x", "answer": {"a": 1}}, False),
    (StemTask, {"question": "q", "answer": "1.5"}, True),
    (StemTask, {"question": "q", "answer": 3}, True),
    (StemTask, {"question": "q", "answer": "B", "choices": {"A": 1, "B": 2}}, True),
    (StemTask, {"question": "q", "answer": "T"}, False),
    (StemTask, {"question": "q", "answer": "1e999"}, False),
    (StemTask, {"question": "q", "answer": "C", "choices": {"A": 1}}, False),
    (StemTask, {"question": "q", "answer": "B", "choices": None}, False),
    (CodeTask, HUMANEVAL, True),
    (CodeTask, {"prompt": [{"role": "user", "content": "x"}], **CONTEST}, True),
    (CodeTask, {"prompt": "p"}, False),
    (CodeTask, {"prompt": [], **CONTEST}, False),
    (SweTask, SNAPSHOT, True),
    (SweTask, {**IMAGE_ROW, "instance_id": "a__b-1"}, True),
    (SweTask, {**IMAGE_ROW, "image_name": "img:1"}, True),
    (SweTask, IMAGE_ROW, False),  # no image
    (SweTask, {**IMAGE_ROW, "repo": "", "instance_id": "a__b-1"}, False),
    (SweTask, {"problem_statement": "p", "FAIL_TO_PASS": ["t"]}, False),
    (LookupTask, {"question": "q", "files": {"a/b.txt": "1"}, "answer": 1}, True),
    (LookupTask, {"prompt": [{"role": "user"}], "files": {"a": ""}, "answer": "x"}, True),
    (LookupTask, {"question": "", "files": {"a": "1"}, "answer": 1}, False),
    (LookupTask, {"question": "q", "files": {"a/../b": "1"}, "answer": 1}, False),
    (LookupTask, {"question": "q", "files": {".env": "1"}, "answer": 1}, False),
    (LookupTask, {"question": "q", "files": {"a": "1"}, "answer": "  "}, False),
    (LookupTask, {"question": "q", "files": {"a": 1}, "answer": 1}, False),
    # A tolerance only with a measured quantity (the fuzz tier found the document silent on it).
    (LookupTask, {"question": "q", "files": {"a": "1"}, "answer": 3.5, "rel_tol": 0.01}, True),
    (LookupTask, {"question": "q", "files": {"a": "1"}, "answer": "x", "rel_tol": 0}, True),
    (LookupTask, {"question": "q", "files": {"a": "1"}, "answer": "z", "rel_tol": 0.5}, False),
    (LookupTask, {"question": "q", "files": {"a": "1"}, "answer": 7, "rel_tol": 0.5}, False),
    (HarnessTask, {"judge": "math", "problem": "x", "answer": 1}, True),
    (HarnessTask, {"judge": "code", **HUMANEVAL}, True),
    (HarnessTask, {"judge": "math"}, False),
    (HarnessTask, {"judge": "code", "problem": "x", "answer": 1}, False),
]


@pytest.mark.parametrize(("task", "instance", "valid"), SCHEMA_CASES)
def test_an_instance_schema_says_what_the_task_takes(
    task: Any, instance: dict[str, Any], valid: bool
) -> None:
    """The schema the document gives an instance (its cross-field rules too) agrees with the
    task's own check, so a client, or a fuzzer, can tell a valid instance from the document."""
    schema = task.instance_model.model_json_schema()
    documented = jsonschema.Draft202012Validator(schema).is_valid(instance)
    try:
        task().validate(TaskJob("j", {"data_source": task.name, **instance}, {}))
        accepted = True
    except InvalidInstance:
        accepted = False
    assert (documented, accepted) == (valid, valid)
