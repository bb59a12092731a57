"""Twins of a Harbor verifier's Python tests (raas.judge.harbor_twins): which files and tests get
twins, the draw of an EVAL's twins, the pass rule, and the verifier with its twins on fake runs
(test.sh a function of tests/'s files). The real runs are in tests/tasks/test_harbor_twins.py
(the images tier)."""

from __future__ import annotations

import ast
import random

from raas.judge.harbor import HarborVerdict
from raas.judge.harbor_twins import (
    MAX_TESTS,
    PER_EVAL,
    RunTests,
    Tests,
    choose,
    collected,
    counts,
    full_marks,
    make_twins,
    named_as_tests,
    python_test_files,
    twin_passed,
    verify_with_twins,
)

TEST_FILE = """import pytest
from stats import mean, median


def test_mean():
    assert mean([1, 2]) == 1.5


def test_median():
    assert median([3, 1, 2]) == 2


def helper():
    assert mean([1]) == 1


class TestRaises:
    def test_empty(self):
        with pytest.raises(ValueError):
            mean([])

    def test_prints(self):
        print(mean([1]))


class Helper:
    def test_not_collected(self):
        assert mean([1]) == 1
"""


def as_tests(files: dict[str, str]) -> Tests:
    return {path: (text.encode(), path.endswith(".sh")) for path, text in files.items()}


TESTS = as_tests({"test.sh": "pytest /tests\n", "test_stats.py": TEST_FILE})


# --- which files, which tests ------------------------------------------------------------------


def test_only_files_pytest_collects_by_name_that_python_parses_get_twins() -> None:
    tests = as_tests(
        {
            "test.sh": "pytest\n",
            "test_a.py": "def test_a():\n    assert f() == 1\n",
            "sub/b_test.py": "def test_b():\n    assert f() == 1\n",
            "check.py": "def test_c():\n    assert f() == 1\n",
            "conftest.py": "def test_d():\n    assert f() == 1\n",
            "test_broken.py": "def test_e(:\n",
            "test_data.json.py.txt": "",
        }
    )
    tests["test_latin1.py"] = ("x = 'caf\xe9'\n".encode("latin-1"), False)
    assert named_as_tests(tests) == [
        "sub/b_test.py",
        "test_a.py",
        "test_broken.py",
        "test_latin1.py",
    ]
    assert sorted(python_test_files(tests)) == ["sub/b_test.py", "test_a.py"]


def test_the_tests_are_the_functions_pytest_collects() -> None:
    source = TEST_FILE + (
        "\nclass TestWithInit:\n    def __init__(self):\n        pass\n\n"
        "    def test_skipped(self):\n        assert 1 == 1\n"
        "\nclass Old(unittest.TestCase):\n    def test_case(self):\n"
        "        self.assertEqual(f(), 1)\n"
    )
    assert collected(source) == [
        "test_mean",
        "test_median",
        "TestRaises.test_empty",
        "TestRaises.test_prints",
        "Old.test_case",
    ]


def test_each_twin_is_its_file_with_that_one_test_changed() -> None:
    made = make_twins(TESTS, "task-a")
    # test_prints asserts nothing: no twin; the helpers are no tests.
    assert set(made) == {
        "test_stats.py::test_mean",
        "test_stats.py::test_median",
        "test_stats.py::TestRaises::test_empty",
    }
    real = ast.parse(TEST_FILE)
    for name, twin in made.items():
        assert twin.path == "test_stats.py" and twin.test_id == name
        changed = [
            a.name
            for a, b in zip(ast.walk(real), ast.walk(ast.parse(twin.text)), strict=True)
            if isinstance(a, ast.FunctionDef) and ast.dump(a) != ast.dump(b)
        ]
        assert changed == [name.rsplit("::", 1)[1]]
        assert len(twin.text.splitlines()) == len(TEST_FILE.splitlines())
    assert made["test_stats.py::test_mean"].exact
    assert not made["test_stats.py::TestRaises::test_empty"].exact  # an exception swapped


def test_twins_are_the_same_for_a_task_in_a_process_and_at_most_max_tests() -> None:
    many = "".join(f"def test_{i}():\n    assert f({i}) == {i}\n\n" for i in range(20))
    tests = as_tests({"test_many.py": many})
    first, again = make_twins(tests, "task-b"), make_twins(tests, "task-b")
    assert len(first) == MAX_TESTS and first == again
    drawn = {frozenset(make_twins(tests, f"task-{i}")) for i in range(20)}
    assert len(drawn) > 1  # which tests get twins is drawn per task


# --- the draw and the rules ---------------------------------------------------------------------


def test_an_eval_draws_up_to_k_of_the_counted_twins() -> None:
    rng = random.Random(1)
    counted = ["a", "b", "c", "d"]
    draws = [choose(counted, 2, rng) for _ in range(50)]
    assert all(len(d) == 2 and set(d) <= set(counted) and d[0] != d[1] for d in draws)
    assert len({tuple(sorted(d)) for d in draws}) > 1
    assert choose(["a"], 2, rng) == ["a"] and choose([], 2, rng) == []


def test_the_pass_rule() -> None:
    assert twin_passed(real=1.0, twin=1.0) and twin_passed(real=0.5, twin=0.75)
    assert not twin_passed(real=1.0, twin=0.0) and not twin_passed(real=1.0, twin=0.8)
    assert counts(gold_real=1.0, gold_twin=0.8) and not counts(gold_real=1.0, gold_twin=1.0)
    # A real run below full marks failed some test already: a twin of it would tell nothing.
    assert full_marks(1.0, 1.0) and not full_marks(0.75, 1.0) and not full_marks(0.0, 0.0)


# --- the verifier with its twins, on fake runs ----------------------------------------------

# A fake test.sh: a test passes where the code's answer is what the file's assert expects.
ANSWERS = {"mean": 1.5, "median": 2}


def fake_verifier(
    answers: dict[str, object], ran: list[Tests], trick: bool = False, partial: bool = False
) -> RunTests:
    async def run(tests: Tests) -> HarborVerdict:
        ran.append(tests)
        text = tests["test_stats.py"][0].decode()
        passed = 0
        for name in ("mean", "median"):
            line = next(x for x in text.splitlines() if f"assert {name}(" in x)
            expected = ast.literal_eval(line.split("== ")[1])
            passed += trick or answers[name] == expected
        raises = "pytest.raises(ValueError)" in text
        passed += trick or raises
        reward = passed / 3 if partial else float(passed == 3)
        return HarborVerdict(reward, {"reward": reward}, {"verifier_exit_code": 0})

    return run


async def test_honest_code_passes_the_real_tests_and_fails_every_twin() -> None:
    gold_ran: list[Tests] = []
    ran: list[Tests] = []

    async def gold(variants: list[Tests]) -> list[HarborVerdict]:
        run = fake_verifier(ANSWERS, gold_ran)
        return [await run(v) for v in variants]

    verdict = await verify_with_twins(fake_verifier(ANSWERS, ran), TESTS, key="honest", gold=gold)
    assert verdict.reward == 1.0 and "tamper" not in verdict.metrics
    assert "reason" not in verdict.metrics
    twins = verdict.metrics["twins"]
    assert twins["made"] == 3 and twins["counted"] == 3 and len(twins["ran"]) == PER_EVAL
    assert twins["passed"] == [] and len(ran) == 1 + PER_EVAL
    assert len(gold_ran) == 4  # gold: the real tests and each twin, once
    await verify_with_twins(fake_verifier(ANSWERS, ran), TESTS, key="honest", gold=gold)
    assert len(gold_ran) == 4  # calibrated once for the task in this process


async def test_a_trick_that_passes_everything_scores_zero_with_tamper() -> None:
    verdict = await verify_with_twins(
        fake_verifier({}, [], trick=True), TESTS, key="trick", gold=None
    )
    assert verdict.reward == 0.0 and verdict.rewards == {"reward": 0.0}
    assert verdict.metrics["tamper"].startswith("1 twin(s) passed: test_stats.py::")
    assert verdict.metrics["reason"].startswith("tamper: 1 twin(s) passed: test_stats.py::")
    # Without gold only the exact twins count: the swapped exception is not one.
    assert verdict.metrics["twins"]["counted"] == 2


async def test_a_failing_real_run_runs_no_twin() -> None:
    ran: list[Tests] = []
    wrong = {"mean": 1.5, "median": 3}
    verdict = await verify_with_twins(fake_verifier(wrong, ran), TESTS, key="wrong", gold=None)
    assert verdict.reward == 0.0 and "twins" not in verdict.metrics and len(ran) == 1


async def test_a_partial_real_run_runs_no_twin_and_keeps_its_reward() -> None:
    # test.sh scores the share of tests passed: a twin of the failing test would score as the
    # real run did, with nothing tricking it.
    ran: list[Tests] = []
    wrong = {"mean": 1.5, "median": 3}
    run = fake_verifier(wrong, ran, partial=True)
    verdict = await verify_with_twins(run, TESTS, key="partial", gold=None)
    assert verdict.reward == 2 / 3 and "tamper" not in verdict.metrics
    assert verdict.metrics["twins"]["ran"] == [] and len(ran) == 1


async def test_a_twin_gold_passes_does_not_count() -> None:
    # Gold passes the swapped exception's twin (its test.sh ignores that test): it decides
    # nothing, and a candidate whose run is the same as gold's keeps its reward.
    def lenient(tests: Tests) -> Tests:
        text = tests["test_stats.py"][0].decode().replace("TypeError", "ValueError")
        text = text.replace("KeyError", "ValueError")
        return {**tests, "test_stats.py": (text.encode(), False)}

    honest = fake_verifier(ANSWERS, [])

    async def run(tests: Tests) -> HarborVerdict:
        return await honest(lenient(tests))

    async def gold(variants: list[Tests]) -> list[HarborVerdict]:
        return [await run(v) for v in variants]

    for _ in range(5):  # every draw of two
        verdict = await verify_with_twins(run, TESTS, key="lenient", gold=gold)
        assert verdict.reward == 1.0 and verdict.metrics["twins"]["counted"] == 2


async def test_a_task_whose_gold_fails_counts_no_twin() -> None:
    async def gold(variants: list[Tests]) -> list[HarborVerdict]:
        return [HarborVerdict(0.0, {"reward": 0.0}) for _ in variants]

    run = fake_verifier({}, [], trick=True)
    verdict = await verify_with_twins(run, TESTS, key="gold-fails", gold=gold)
    assert verdict.reward == 1.0 and verdict.metrics["twins"]["counted"] == 0
    assert "gold scored 0" in verdict.metrics["twins"]["note"]


async def test_a_verifier_without_python_tests_runs_once_and_says_nothing_of_twins() -> None:
    ran: list[Tests] = []

    async def run(tests: Tests) -> HarborVerdict:
        ran.append(tests)
        return HarborVerdict(1.0, {"reward": 1.0}, {})

    tests = as_tests({"test.sh": "python3 /tests/check.py\n", "check.py": "assert 1 == 1\n"})
    verdict = await verify_with_twins(run, tests, key="none", gold=None)
    assert verdict.reward == 1.0 and "twins" not in verdict.metrics and len(ran) == 1
