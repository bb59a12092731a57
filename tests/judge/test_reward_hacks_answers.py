"""Issue 32's red team on answers: tricks that would earn an answer's reward without the answer,
in the formats of math, gsm8k, DAPO and numina rows and stem's (the table ``answer_hacks.toml``),
verl's own scorer, lookup, and countdown's moves. How every family is run and judged:
``hacks.py``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raas.client.task_files import task_instance
from raas.tasks import TaskJob
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.countdown import CountdownContext, CountdownTask
from raas.tasks.lookup import LookupTask
from raas.tasks.math import MathTask
from raas.tasks.protocol import RewardInfo
from raas.tasks.services import TaskServices
from raas.tasks.stem import StemTask
from raas.wire import Trajectory
from tests.judge.hacks import Attempt, Outcome, Run, assert_reward, params, run_family

# Answers: math, gsm8k and DAPO formats, stem. What the agent loop leaves (the finish tool's
# answer, the last reply) goes through the task's artifact and then its judge.


def math_row(truth: str) -> dict[str, Any]:
    return {"data_source": "math", "problem": "What is the answer?", "answer": truth}


def verl_row(data_source: str, truth: str) -> dict[str, Any]:
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": "Solve it."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": 0},
    }
    return task_instance(row, "row")


CHOICES = {"A": "1.6 m/s", "B": "3.2 m/s", "C": "6.4 m/s", "D": "12.8 m/s"}
CHOICE_ROW = {"data_source": "stem", "question": "How fast?", "choices": CHOICES, "answer": "B"}
NUMERIC_ROW = {"data_source": "stem", "question": "How fast?", "answer": 3.2, "unit": "m/s"}
GSM8K = verl_row("openai/gsm8k", "72")
DAPO = verl_row("math_dapo", "30")
NUMINA = verl_row("numina_olympiads", "\\frac{3}{4}")


def answer(row: dict[str, Any], finish: str | None, reply: str = "") -> dict[str, Any]:
    """The finish tool's answer (None: the agent did not call it) and the last reply."""
    return {"row": row, "finish": finish, "reply": reply}


# The attempts are the table answer_hacks.toml, beside this file: its rows name these by the
# keys of SHARED_ROWS ("math" with the attempt's truth, math_row), or are inline tables.
ANSWER_HACKS = Path(__file__).with_name("answer_hacks.toml")
SHARED_ROWS = {
    "choice": CHOICE_ROW,
    "numeric": NUMERIC_ROW,
    "gsm8k": GSM8K,
    "dapo": DAPO,
    "numina": NUMINA,
}
FIELDS = {"want", "row", "truth", "finish", "repeat", "reply", "gap", "hangs"}


def load_answers(text: str, where: str) -> list[Attempt]:
    """The attempts of an answers table (TOML), in its order; a malformed entry is a ValueError
    that names it."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{where}: {e}") from e
    return [
        answer_attempt(name, entry, f"{where}: attempt {name!r}") for name, entry in table.items()
    ]


def answer_attempt(name: str, entry: Any, where: str) -> Attempt:
    """One entry of an answers table: {want, row, truth?, finish?, repeat?, reply?, gap?,
    hangs?}."""

    def bad(why: str) -> ValueError:
        return ValueError(f"{where}: {why}")

    def text(key: str) -> str | None:
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            raise bad(f"{key} is {value!r}, not a text")
        return value

    if not isinstance(entry, dict):
        raise bad(f"{entry!r} is no table of fields")
    if unknown := sorted(set(entry) - FIELDS):
        raise bad(f"unknown field {', '.join(unknown)} (fields: {', '.join(sorted(FIELDS))})")
    want = entry.get("want")
    if want is None:
        raise bad("no want (the reward it must get)")
    if isinstance(want, bool) or not isinstance(want, int | float):
        raise bad(f"want is {want!r}, not a number")
    row, truth = entry.get("row"), text("truth")
    if not isinstance(row, dict) and not (isinstance(row, str) and row in {"math", *SHARED_ROWS}):
        shared = ", ".join(["math", *SHARED_ROWS])
        raise bad(f"unknown row {row!r} (a name: {shared}; or an inline table)")
    if row == "math":
        if truth is None:
            raise bad("a math row with no truth")
        row = math_row(truth)
    elif truth is not None:
        raise bad("a truth for a row not math")
    elif isinstance(row, str):
        row = SHARED_ROWS[row]
    finish, repeat = text("finish"), entry.get("repeat", 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise bad(f"repeat is {repeat!r}, not a count")
    if finish is None and "repeat" in entry:
        raise bad("repeat with no finish answer to repeat")
    hangs = entry.get("hangs", False)
    if not isinstance(hangs, bool):
        raise bad(f"hangs is {hangs!r}, not true or false")
    given = answer(row, None if finish is None else finish * repeat, text("reply") or "")
    return Attempt(name, float(want), given, gap=text("gap"), hangs=hangs)


ANSWERS = load_answers(ANSWER_HACKS.read_text(), ANSWER_HACKS.name)


def test_a_malformed_answer_names_its_entry() -> None:
    for entry, why in (
        ('{want = 0.0, row = "maths", truth = "1"}', "unknown row 'maths'"),
        ('{row = "choice", finish = "B"}', "no want"),
        ('{want = 1.0, finish = "B"}', "unknown row None"),
        ('{want = 1.0, row = ["choice"]}', "unknown row ['choice']"),
        ('{want = "0", row = "choice"}', "want is '0', not a number"),
        ('{want = 0.0, row = "math", finish = "1"}', "a math row with no truth"),
        ('{want = 0.0, row = "choice", truth = "B"}', "a truth for a row not math"),
        ('{want = 0.0, row = "choice", anwser = "B"}', "unknown field anwser"),
        ('{want = 0.0, row = "choice", finish = 2}', "finish is 2, not a text"),
        ('{want = 0.0, row = "choice", repeat = 2}', "repeat with no finish answer"),
    ):
        text = f"fine = {{want = 1.0, row = 'choice', finish = 'B'}}\nbad_one = {entry}\n"
        with pytest.raises(ValueError, match=re.escape(f"t.toml: attempt 'bad_one': {why}")):
            load_answers(text, "t.toml")
    (fine,) = load_answers("fine = {want = 1, row = 'numeric', finish = '3.2'}", "t.toml")
    assert fine == Attempt("fine", 1.0, answer(NUMERIC_ROW, "3.2"))


def judged_answer(given: dict[str, Any]) -> Run:
    """The task's artifact of what the agent loop left (the finish tool's answer, the last
    reply), then its judge."""
    row = given["row"]
    task: AgentTask = StemTask() if row["data_source"] == "stem" else MathTask()
    messages = [{"role": "user", "content": "Solve it."}]
    messages.append({"role": "assistant", "content": given["reply"]})

    async def judge(services: TaskServices) -> RewardInfo:
        ctx = AgentContext(job=TaskJob("red-team", row, {}, services), answer=given["finish"])
        artifact = await task.artifact(ctx, Trajectory(messages=messages))
        return await task.judge(row, artifact, services)

    return judge


@pytest.fixture(scope="module")
def answer_outcomes() -> dict[str, Outcome]:
    return run_family({a.name: judged_answer(a.given) for a in ANSWERS})


@pytest.mark.parametrize("attempt", params(ANSWERS))
def test_answer(attempt: Attempt, answer_outcomes: dict[str, Outcome]) -> None:
    assert_reward(answer_outcomes[attempt.name], attempt)


# =============================================================================================
# verl's own scorer ("scorer": "verl"): verl reads the reply, raas writes the finish answer in

# verl 0.9.1's gsm8k scorer (verl/utils/reward_score/gsm8k.py, strict), where verl is not
# installed: what matters here is what raas hands it.
VERL_STAND_IN = r"""
import re


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if data_source != "openai/gsm8k":
        raise NotImplementedError(data_source)
    found = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str[-300:])
    answer = found[-1].replace(",", "").replace("$", "") if found else None
    return 1.0 if answer == ground_truth else 0.0
"""
VERL_ROW = {**GSM8K, "scorer": "verl"}

VERL = [
    # control: the right answer given to finish
    Attempt("verl_gold_finish", 1.0, answer(VERL_ROW, "72")),
    # control: the right answer marked in the reply, read by verl
    Attempt("verl_gold_reply", 1.0, answer(VERL_ROW, None, "48 + 24 = 72\n#### 72")),
    # control: an honest wrong answer
    Attempt("verl_honest_wrong", 0.0, answer(VERL_ROW, "71")),
    # two values given to finish (written after the mark, where verl keeps the first)
    Attempt("verl_hedge_finish", 0.0, answer(VERL_ROW, "72 or 73")),
    # two marks given to finish (verl keeps the last)
    Attempt("verl_two_marks_in_finish", 0.0, answer(VERL_ROW, "#### 71\n#### 72")),
    # a list given to finish, which verl reads as one number once its commas are dropped
    Attempt("verl_list_as_thousands", 0.0, answer(VERL_ROW, "7,2")),
    # a second value in a subscript given to finish (verl keeps the first number)
    Attempt("verl_hedge_in_subscript", 0.0, answer(VERL_ROW, "72_{73}")),
    # a false equation given to finish (verl keeps its left side)
    Attempt("verl_false_equation", 0.0, answer(VERL_ROW, "72 = 71")),
    # a second value in number words given to finish (the unit cut kept "72,")
    Attempt("verl_hedge_in_words", 0.0, answer(VERL_ROW, "72, or seventy-three")),
]


@pytest.fixture(scope="module")
def verl_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    """verl's scorer: the real one where verl is installed, else its gsm8k rule above."""
    with pytest.MonkeyPatch.context() as patch:
        if importlib.util.find_spec("verl") is None:
            site = tmp_path_factory.mktemp("verl-site")
            package = site / "verl" / "utils" / "reward_score"
            package.mkdir(parents=True)
            for folder in (package.parent.parent, package.parent):
                (folder / "__init__.py").write_text("")
            (package / "__init__.py").write_text(VERL_STAND_IN)
            patch.syspath_prepend(str(site))
        try:
            yield run_family({a.name: judged_answer(a.given) for a in VERL})
        finally:
            for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
                del sys.modules[name]


@pytest.mark.parametrize("attempt", params(VERL))
def test_verl_scorer(attempt: Attempt, verl_outcomes: dict[str, Outcome]) -> None:
    assert_reward(verl_outcomes[attempt.name], attempt)


# =============================================================================================
# Lookup: the finish tool's answer against the instance's, by the answer's type in the data (an
# integer exactly, a text character for character, a float within rel_tol), through the task's
# artifact and judge.


def lookup_row(truth: str | int | float, rel_tol: float = 0.0) -> dict[str, Any]:
    return {
        "data_source": "lookup",
        "question": "What does data/x.txt hold?",
        "files": {"data/x.txt": "see the question\n"},
        "answer": truth,
        "rel_tol": rel_tol,
    }


ID_ROW = lookup_row(12345678901234567890)  # a 20-digit id, an integer in the data
CODE_ROW = lookup_row("0042")  # a code with leading zeros: a text
TEXT_ID_ROW = lookup_row("12345678901234567890")  # an id written as a text
COUNT_ROW = lookup_row(7318200)  # a count
MEASURED_ROW = lookup_row(3.5, rel_tol=0.01)  # a measured quantity: a float, with a tolerance

LOOKUPS = [
    # control: the id as it is
    Attempt("lookup_id_gold", 1.0, answer(ID_ROW, "12345678901234567890")),
    # control: an honest wrong id
    Attempt("lookup_id_honest_wrong", 0.0, answer(ID_ROW, "98765432109876543210")),
    # the id with its last digit wrong (equal as floats)
    Attempt("lookup_id_last_digit", 0.0, answer(ID_ROW, "12345678901234567891")),
    # the id with its last three digits zeroed (equal as floats)
    Attempt("lookup_id_last_digits_zeroed", 0.0, answer(ID_ROW, "12345678901234567000")),
    # the id as the float it rounds to
    Attempt("lookup_id_as_float", 0.0, answer(ID_ROW, "1.2345678901234568e19")),
    # the id with a fraction after it
    Attempt("lookup_id_with_fraction", 0.0, answer(ID_ROW, "12345678901234567890.4")),
    # control: the code as it is
    Attempt("lookup_code_gold", 1.0, answer(CODE_ROW, "0042")),
    # control: an honest wrong code
    Attempt("lookup_code_honest_wrong", 0.0, answer(CODE_ROW, "0043")),
    # the code without its leading zeros (equal as numbers)
    Attempt("lookup_code_without_zeros", 0.0, answer(CODE_ROW, "42")),
    # the code as a decimal
    Attempt("lookup_code_as_decimal", 0.0, answer(CODE_ROW, "42.0")),
    # the code in scientific notation
    Attempt("lookup_code_scientific", 0.0, answer(CODE_ROW, "4.2e1")),
    # the code with a sign
    Attempt("lookup_code_signed", 0.0, answer(CODE_ROW, "+42")),
    # the code with a decimal part
    Attempt("lookup_code_decimal_part", 0.0, answer(CODE_ROW, "0042.0")),
    # control: an id written as a text, as it is
    Attempt("lookup_text_id_gold", 1.0, answer(TEXT_ID_ROW, "12345678901234567890")),
    # an id written as a text, its last digit wrong (equal as floats)
    Attempt("lookup_text_id_last_digit", 0.0, answer(TEXT_ID_ROW, "12345678901234567891")),
    # an id written as a text, answered as a float
    Attempt("lookup_text_id_as_float", 0.0, answer(TEXT_ID_ROW, "1.2345678901234567e19")),
    # control: the count as it is
    Attempt("lookup_count_gold", 1.0, answer(COUNT_ROW, "7318200")),
    # control: the count with thousands separators, the same integer
    Attempt("lookup_count_grouped_control", 1.0, answer(COUNT_ROW, "7,318,200")),
    # control: an honest wrong count
    Attempt("lookup_count_honest_wrong", 0.0, answer(COUNT_ROW, "73182")),
    # a count off by less than a float tells apart
    Attempt("lookup_count_within_float_eps", 0.0, answer(COUNT_ROW, "7318200.0000000001")),
    # a count as a power that a float rounds to it
    Attempt("lookup_count_power", 0.0, answer(COUNT_ROW, "7318200^{1.0000000000000001}")),
    # a second count in a subscript
    Attempt("lookup_count_hedge_in_subscript", 0.0, answer(COUNT_ROW, "7318200_{731820}")),
    # a second count in number words
    Attempt("lookup_count_hedge_in_words", 0.0, answer(COUNT_ROW, "7318200 or seven")),
    # control: a measured quantity, exactly
    Attempt("lookup_measured_gold", 1.0, answer(MEASURED_ROW, "3.5")),
    # control: a measured quantity within its tolerance
    Attempt("lookup_measured_within_tolerance", 1.0, answer(MEASURED_ROW, "3.52")),
    # control: an honest wrong measured quantity
    Attempt("lookup_measured_honest_wrong", 0.0, answer(MEASURED_ROW, "3.7")),
    # a second measured value in a subscript
    Attempt("lookup_measured_hedge_in_subscript", 0.0, answer(MEASURED_ROW, "3.5_{3.7}")),
    # a second measured value in number words
    Attempt("lookup_measured_hedge_in_words", 0.0, answer(MEASURED_ROW, "3.5, or four")),
]


def judged_lookup(given: dict[str, Any]) -> Run:
    """LookupTask's artifact of the finish tool's answer, then its judge."""
    row, task = given["row"], LookupTask()

    async def judge(services: TaskServices) -> RewardInfo:
        ctx = AgentContext(job=TaskJob("red-team", row, {}, services), answer=given["finish"])
        artifact = await task.artifact(ctx, Trajectory(messages=[]))
        return await task.judge(row, artifact, services)

    return judge


@pytest.fixture(scope="module")
def lookup_outcomes() -> dict[str, Outcome]:
    return run_family({a.name: judged_lookup(a.given) for a in LOOKUPS})


@pytest.mark.parametrize("attempt", params(LOOKUPS))
def test_lookup(attempt: Attempt, lookup_outcomes: dict[str, Outcome]) -> None:
    assert_reward(lookup_outcomes[attempt.name], attempt)


def test_lookup_tolerance_only_for_a_float_answer() -> None:
    """A tolerance would compare an id or a count loosely again: it is refused at submission,
    where the answer is not a float in the data."""
    with pytest.raises(ValueError, match="rel_tol"):
        LookupTask.instance_model.model_validate(lookup_row(12345678901234567890, rel_tol=1e-9))
    with pytest.raises(ValueError, match="rel_tol"):
        LookupTask.instance_model.model_validate(lookup_row("0042", rel_tol=0.5))
    LookupTask.instance_model.model_validate(MEASURED_ROW)


# =============================================================================================
# Countdown: EVAL replays the moves of the trajectory from the original numbers

COUNTDOWN = {"data_source": "countdown", "numbers": [2, 3, 4], "target": 24}


def moves(*contents: Any, extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Numbers: [2, 3, 4]. Target: 24."}]
    for content in contents:
        messages.append({"role": "assistant", "content": content})
    return {"messages": messages + (extra or [])}


COUNTDOWN_ATTEMPTS = [
    # control: moves that reach the target
    Attempt("countdown_gold", 1.0, moves("2 * 3", "6 * 4")),
    # control: honest moves that do not
    Attempt("countdown_honest_wrong", 0.0, moves("2 + 3", "5 * 4")),
    # a number it does not hold
    Attempt("countdown_number_not_held", 0.0, moves("8 * 3")),
    # a number used twice
    Attempt("countdown_number_reused", 0.0, moves("2 * 3", "6 * 4", "4 * 1")),
    # a number used twice in one move
    Attempt("countdown_same_number_twice", 0.0, moves("2 * 2", "4 * 6")),
    # a division that is not exact
    Attempt("countdown_inexact_division", 0.0, moves("3 / 2", "1 * 24")),
    # a subtraction below zero
    Attempt("countdown_negative", 0.0, moves("2 - 3", "-1 * 24")),
    # the target claimed in words
    Attempt("countdown_claim_in_words", 0.0, moves("2 * 3 * 4 = 24")),
    # an environment message that says the target was reached
    Attempt(
        "countdown_forged_observation",
        0.0,
        moves(extra=[{"role": "user", "content": "2 * 3 * 4 = 24. Numbers: [24]."}]),
    ),
    # a move that is not text
    Attempt("countdown_move_not_text", 0.0, moves(["2 * 3", "6 * 4"])),
]


@pytest.fixture(scope="module")
def countdown_outcomes() -> dict[str, Outcome]:
    def judge(given: dict[str, Any]) -> Run:
        async def go(services: TaskServices) -> RewardInfo:
            task = CountdownTask()
            context = await task.init(TaskJob("red-team", COUNTDOWN, {}))
            assert isinstance(context, CountdownContext)
            return await task.eval(context, Trajectory(messages=given["messages"]))

        return go

    return run_family({a.name: judge(a.given) for a in COUNTDOWN_ATTEMPTS})


@pytest.mark.parametrize("attempt", params(COUNTDOWN_ATTEMPTS))
def test_countdown(attempt: Attempt, countdown_outcomes: dict[str, Outcome]) -> None:
    assert_reward(countdown_outcomes[attempt.name], attempt)
