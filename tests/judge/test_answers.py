"""raas.judge.answers: extraction and checkers, and the bundled math and STEM sets."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from raas.judge.answers import (
    MathVerdict,
    check_choice,
    check_math,
    check_numeric,
    exact_number,
    extract_boxed,
    final_answer,
    holds_one_value,
    judge_math,
    marked_answer,
    numeric_reason,
    parse_choice,
    parse_number,
    parse_numbers,
)

DATA = Path(__file__).resolve().parents[2] / "raas" / "tasks" / "data"


def load(name: str) -> list[dict[str, Any]]:
    with open(DATA / name) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- extract_boxed / final_answer -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} done", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{a{b{c}}d}", "a{b{c}}d"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\fbox{7}", "7"),
        (r"\boxed { 3 }", "3"),
        (r"\boxed 5$", "5"),
        (r"\boxed{3} and then \boxed{4", "3"),  # an unclosed (truncated) box is skipped
        ("no box here", None),
        (r"\boxed{", None),
        (r"\boxedx{3}", None),
        ("", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def _box_by_definition(text: str) -> str | None:
    """extract_boxed as TeX reads it, box by box: from each box's brace, the first point where
    the braces balance (escaped ones aside); the last box that closes."""
    found = None
    for m in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])[ \t]*\{", text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found = text[m.end() : i].strip()
                break
            i += 1
    return found


def test_extract_boxed_agrees_with_the_definition_on_random_replies() -> None:
    pieces = ["{", "}", "\\", "\\boxed{", "\\fbox", " ", "a", "\\{", "\\}", "\\\\", "\t"]
    rng = random.Random(7)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if not re.search(r"\\boxed[ \t]*[^ \t{]", text):  # `\boxed 5` is another rule
            assert extract_boxed(text) == _box_by_definition(text), text


def test_a_reply_of_unclosed_boxes_still_gives_its_closed_one() -> None:
    """Each unclosed box once scanned to the reply's end: 20,000 of them took 74 s."""
    assert extract_boxed("\\boxed{" * 20_000 + "\\boxed{42}") == "42"


def test_final_answer() -> None:
    assert final_answer(r"work \boxed{3}", None) == "3"
    assert final_answer(r"work \boxed{3}", "5") == "5"  # the finish tool wins
    assert final_answer(None, r"\boxed{5}") == "5"
    assert final_answer("x", r"$\boxed{\frac{1}{2}}$") == r"\frac{1}{2}"
    assert final_answer("x", "  x = 4 ") == "x = 4"
    assert final_answer(r"\boxed{3}", "   ") == "3"  # a blank finish answer does not count
    assert final_answer("no box", None) is None
    assert final_answer(None, None) is None
    assert final_answer("", "") is None
    # A mark is taken off a finish answer only when it is all the answer holds.
    every = ("boxed", "gsm8k", "answer_line", "answer_is")
    assert final_answer(None, "The answer is 4.", every) == "4"
    assert final_answer(None, "The answer is 4. Or 5.", every) == "The answer is 4. Or 5."
    assert final_answer(None, r"\boxed{3} \boxed{4}") == r"\boxed{3} \boxed{4}"
    assert final_answer(r"\boxed{3}, no: \boxed{4}", None) == "4"  # a reply may correct itself


def test_marked_answers_are_whole() -> None:
    assert marked_answer("#### 72 or 73", ["gsm8k"]) == "72 or 73"
    assert marked_answer("#### 1,000", ["gsm8k"]) == "1000"
    assert marked_answer("#### 7,2", ["gsm8k"]) == "7,2"  # not a thousands separator
    assert marked_answer("#### 72 clips.", ["gsm8k"]) == "72 clips"


@pytest.mark.parametrize(
    ("answer", "one"),
    [
        ("48", True),
        (r"\frac{1}{2}", True),
        ("x = 48, so \\boxed{48}", True),
        ("The answer is 48.", True),
        ("48 or 49", False),
        ("48, 49", False),
        (r"48 \pm 1", False),
        ("48 49", False),
        ("The answer is 48. Or 49.", False),
        ("", False),
    ],
)
def test_holds_one_value(answer: str, one: bool) -> None:
    assert holds_one_value(answer) is one
    assert holds_one_value("48, 49", ["48, 49"])  # a set where the truth is one


def test_judge_math_says_what_it_read() -> None:
    assert judge_math("48 or 49", ["48"]) == MathVerdict(False, "not one value: {48, 49}")
    assert judge_math("48 49", ["97"]) == MathVerdict(False, "not one value")
    assert judge_math("1/2", ["3", "0.5"]) == MathVerdict(True, "1/2", compared=True)
    assert judge_math(None, ["3"]) == MathVerdict(False, "no answer")
    assert judge_math("12", ["13"]) == MathVerdict(False, "12", compared=True)


def test_a_wrong_math_answer_says_why_and_a_right_one_says_nothing() -> None:
    assert judge_math("12", ["13"]).reason(["13"]) == "answer read: 12, expected 13"
    assert judge_math("2", ["3", " ", "4"]).reason(["3", " ", "4"]) == (
        "answer read: 2, expected one of 3, 4"
    )
    assert judge_math("48 or 49", ["48"]).reason(["48"]) == "answer not one value: {48, 49}"
    assert judge_math("", ["13"]).reason(["13"]) == "no answer found"
    assert judge_math("13", ["13"]).reason(["13"]) is None


# --- check_math -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("1/2", "1/2"),
        ("0.5", "1/2"),
        (r"\frac12", "1/2"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{1}{2}", "1/2"),
        ("2/4", "1/2"),
        ("x=3", "3"),
        ("x = 3", "3"),
        ("3", "x=3"),
        ("3.0", "3"),
        ("1,000", "1000"),
        (r"1\,000", "1000"),
        ("25%", "25"),
        (r"25\%", "25"),
        ("25", r"25\%"),  # a percent sign is a unit: the number is the value
        ("2 or -2", "2, -2"),  # both solutions, where both are the truth
        ("12 apples", "12"),
        ("12 m/s", "12"),
        (r"12 \text{ cm}", "12"),
        (r"\$12.50", "25/2"),
        ("The answer is 12.", "12"),
        (r"so it is \boxed{7/2}", "7/2"),
        (r"3\frac{1}{2}", "7/2"),
        ("-7/2", "-3.5"),
        (r"\sqrt{4}", "2"),
        ("3^2", "9"),
        ("0.3333333", "1/3"),
        ("5.", "5"),
    ],
)
def test_check_math_accepts(prediction: str, truth: str) -> None:
    assert check_math(prediction, truth)


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("2", "3"),
        ("-3", "3"),
        ("3/4", "4/3"),
        ("0.33", "1/3"),
        ("0.75", "3/5"),
        ("x = 2 or x = 3", "2"),  # two answers for one
        ("2, 3", "2"),
        ("2 or 3", "2"),  # not the first value and unit words
        ("2 and 3", "2"),
        ("2 apples or 3 pears", "2"),
        ("2 m 50 cm", "2"),
        (r"2 \lor 3", "3"),  # not a number picked out of what LaTeX cannot read
        ("2 3", "5"),  # side by side, not their sum
        ("It is $3$, or perhaps $2$", "2"),  # two spans in words
        ("The answer is 2. Or maybe 3.", "2"),
        (r"25\%", "0.25"),  # a percent is its number, never the fraction too
        ("0.25", r"25\%"),
        (r"2500\%", "25"),
        ("12 apples", "13"),
        ("", "1"),
        ("   ", "1"),
        (None, "1"),
        ("1", ""),
        ("not a number at all", "4"),
    ],
)
def test_check_math_rejects(prediction: str | None, truth: str) -> None:
    assert not check_math(prediction, truth)


def test_check_math_never_raises_and_times_out() -> None:
    # SymPy would evaluate these for minutes: math_verify's alarm cuts them off in the main thread.
    # A tiny budget against what never ends; the bound is generous (a loaded machine) and
    # still far below SymPy's minutes: what it tells apart is the alarm firing or not.
    start = time.monotonic()
    assert not check_math("9^{9^{9^{9}}}", "1", timeout_s=1)
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"the 1 s alarm did not cut the evaluation off: {elapsed:.0f} s"
    assert not check_math("(" * 500 + ")" * 499, "1", timeout_s=1)
    assert not check_math("x" * 10_000, "1")
    assert not check_math(r"\frac{1}{0}", "1")


def test_check_math_in_a_thread() -> None:
    # No alarm outside the main thread: long or pathological input is refused instead.
    results: dict[str, bool] = {}

    def work() -> None:
        results["plain"] = check_math("0.5", "1/2")
        results["tower"] = check_math("9^{9^{9^{9}}}", "1")
        results["power"] = check_math("(x+1)^{100000}", "1")
        results["factorial"] = check_math("100000!", "1")
        results["long"] = check_math("1+" * 200 + "1", "201")

    t = threading.Thread(target=work)
    t.start()
    t.join(120)  # generous (a loaded machine); refused input ends in milliseconds
    assert not t.is_alive(), "the checks in a thread were still running after 120 s"
    assert results == {
        "plain": True,
        "tower": False,
        "power": False,
        "factorial": False,
        "long": False,
    }


# --- check_choice ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction",
    [
        "B",
        "b",
        "(B)",
        "B)",
        "B.",
        "**B**",
        r"\boxed{B}",
        r"\text{(B)}",
        "Answer: B",
        "answer: b",
        "the answer is B.",
        "The answer is (b).",
        "The correct option is B",
        "Option B",
        "B) 42 m/s",
        "B. 42 m/s",
        "A ball thrown up comes down; so the answer is B",  # "A" as an article
    ],
)
def test_check_choice_accepts(prediction: str) -> None:
    assert check_choice(prediction, "B", 4)
    assert parse_choice(prediction, 4) == "B"


@pytest.mark.parametrize(
    "prediction",
    [
        "C",
        "(c)",
        "A or B",
        "B and C",
        "(A) and (B)",
        "The answer is B, not A",
        "B or b? I'd say C",
        "Answer: b or c",  # a second letter in lowercase is offered too
        "(b) or c",
        "B, or maybe c",
        "B. C.",  # a second letter as the first one's "option text"
        "AB",
        "E",  # beyond the four options
        "the answer is a ball",  # "a" as an article names no option
        "",
        "   ",
        None,
        "42",
    ],
)
def test_check_choice_rejects(prediction: str | None) -> None:
    assert not check_choice(prediction, "B", 4)


def test_check_choice_range_and_correct_format() -> None:
    assert check_choice("E", "E", 5)
    assert not check_choice("E", "E", 4)
    assert check_choice("(b)", "(B)", 4)
    assert check_choice("d", "D", 4)


# --- check_numeric --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("42", 42),
        ("42.2", 42),  # within 1%
        ("v = 12.5 m/s", 12.5),
        ("-3.2 V", -3.2),
        ("\u22123.2 V", -3.2),
        ("1,234.5 J", 1234.5),
        ("1{,}234", 1234),
        (r"1\,234 m", 1234),
        ("6.02e23", 6.02e23),
        ("6.02E+23 mol", 6.02e23),
        (r"6.02 \times 10^{23}", 6.02e23),
        ("6.02 x 10^23 atoms", 6.02e23),
        ("6.02\u00b710\u00b2\u00b3", 6.02e23),
        (r"$2.5 \times 10^{-3}$ mol/L", 2.5e-3),
        (r"10^{-3}", 1e-3),
        ("9.8 m/s^2", 9.8),
        ("4 cm^3", 4),
        ("2.23 g/cm^3", 2.23),
        ("3/4", 0.75),
        (r"\frac{3}{4}", 0.75),
        ("first 12 km/h, in the end 3.3 m/s", 3.3),
        ("The mass of H2O is 18 g", 18),
        (r"\boxed{25.0}", 25),
        (".5", 0.5),
    ],
)
def test_check_numeric_accepts(prediction: str, truth: float) -> None:
    assert check_numeric(prediction, truth)


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("43", 42),
        ("3.2 V", -3.2),
        ("6.02e22", 6.02e23),
        ("12 m/s then 13 m/s", 12),  # the last number counts
        ("no number", 1.0),
        ("", 1.0),
        (None, 1.0),
        ("1e400", 1.0),
        ("9.8 m/s^2", 2),
    ],
)
def test_check_numeric_rejects(prediction: str | None, truth: float) -> None:
    assert not check_numeric(prediction, truth)


def test_a_wrong_number_says_which_values_were_checked() -> None:
    """numeric_reason names what check_numeric compared: with ``one_value`` every value, those
    the last-number reading skips too (a subscript's), so a hedge is not shown as the truth."""
    assert numeric_reason("12 m/s", 6.0) == "answer read: 12, expected 6 (relative tolerance 0.01)"
    assert numeric_reason("3.2_{3.1}", 3.2, one_value=True) == (
        "answer read: 3.2, 3.1, expected 3.2 (relative tolerance 0.01), and one value only"
    )
    assert numeric_reason("(3.2)^{2}", 3.2, one_value=True) == (
        "answer read: an unreadable value, expected 3.2 (relative tolerance 0.01)"
    )
    assert numeric_reason("about six", 6.0) == "no answer found"
    # Digits enough to tell the two apart (six significant ones made both 1.23...e+06).
    assert numeric_reason("1234567", 1234000.0) == (
        "answer read: 1234567, expected 1234000 (relative tolerance 0.01)"
    )


def test_check_numeric_tolerances() -> None:
    assert check_numeric("101", 100, rel_tol=0.01)
    assert not check_numeric("102", 100, rel_tol=0.01)
    assert check_numeric("102", 100, rel_tol=0.05)
    assert not check_numeric("0.001", 0.0)
    assert check_numeric("0.001", 0.0, abs_tol=0.01)
    assert not check_numeric("1", math.nan)
    assert parse_number("1,23") == 23.0  # not a thousands separator: two numbers


@pytest.mark.parametrize(
    ("prediction", "right"),
    [
        ("3.1 or 3.2", False),  # a hedge: its last number is right, the answer is not
        ("between 3 and 3.2", False),
        ("3.2 m/s^2", True),  # the exponent is no second value
        ("3.2 m/s (3.19 m/s)", True),  # within the tolerance
        (r"3.2 \times 10^{0} J", True),
    ],
)
def test_check_numeric_one_value(prediction: str, right: bool) -> None:
    assert check_numeric(prediction, 3.2, one_value=True) is right
    assert check_numeric(prediction, 3.2)  # read by its last number, each is right


# --- one value: where a second value may hide (issue 43) -----------------------------------------


@pytest.mark.parametrize(
    ("prediction", "truth", "why"),
    [
        ("\\text{49 or 48}", "48", "{48, 49}"),  # a text command is read as its text
        ("\\mbox{48}49", "48", "not one value"),  # ... "48 49", side by side
        ("48 \\text{ or maybe } 49", "48", "not one value"),  # words between: side by side
        ("48_{49}", "48", "subscript"),  # math_verify drops a number's subscript
        ("x_{48} = 49", "49", "subscript"),
        ("x_1 = 3", "3", "subscript"),  # an index is a number too
        ("\\log_2 8", "3", "subscript"),
        ("48, or forty-nine", "48", "not one value"),  # number words are numbers
        ("forty eight or 49", "49", "not one value"),
        ("48 + one", "49", "in words"),
        ("47=48", "48", "sides differ"),  # an equation is a value or nothing, not its last side
        ("48 = 49", "49", "sides differ"),
        ("a=48=49", "49", "sides differ"),
        ("a = 49 = 48", "48", "sides differ"),
        ("48 \\approx 49", "48", "sides differ"),  # math_verify reads it as 48
        ("48 \\equiv 49", "49", "sides differ"),
        ("48 == 49", "49", "sides differ"),
        ("2x + 1 = 5", "5", "sides differ"),  # an equation to solve, not its solution
        ("48 = x", "48", "two variables"),  # read by its right side, x
        ("x = y = 48", "48", "two variables"),
        ("= 48", "48", "empty side"),
        ("1=1=1=1=1=1", "1", "more sides than can be compared"),  # each side a parse: bounded
        ("It is $1 = 1 = 1$, or $1 = 1 = 1$", "1", "more sides than can be compared"),  # in all
        ("48 < 49", "49", "inequality"),
        ("48 \\neq 49", "49", "inequality"),
        ("\\phantom{49}48", "97", "where it is not read"),  # read as 97
        ("48\\tag{49}", "48", "where it is not read"),
        ("\\color{red}{49}48", "48", "where it is not read"),
        ("\\underbrace{48}_{49}", "48", "where it is not read"),
        ("48 \\quad 49", "97", "not one value"),  # TeX spacing: read as the sum
        ("48 \\; 49", "97", "not one value"),
        ("48(49)", "97", "not one value"),  # read as the sum too
        ("{48}{49}", "97", "not one value"),
        ("48\\left(49\\right)", "97", "not one value"),
        ("48 \\ldots 49", "97", "not one value"),
        ("It is 48^{49}", "48", "LaTeX in words"),  # prose reads a power by its base
        ("It is 48_{49}", "48", "LaTeX in words"),
        ("It is 3\\frac{1}{2}", "1/2", "LaTeX in words"),  # ... and 3\frac{1}{2} as 1/2
        ("It is $47 = 48$", "48", "sides differ"),  # a span is checked as an answer is
        ("It is $48_{49}$", "48", "subscript"),
        ("\\boxed{48}_{49}", "48", "LaTeX in words"),
        ("\\boxed{48} \\text{ or forty-nine}", "48", "not one value"),
        ("So 48, or 1e400", "48", "cannot be read"),
    ],
)
def test_a_second_value_anywhere_is_not_one_value(prediction: str, truth: str, why: str) -> None:
    verdict = judge_math(prediction, [truth])
    assert not verdict.correct
    assert verdict.read.startswith("not one value") and why in verdict.read, verdict
    assert not holds_one_value(prediction, [truth])


@pytest.mark.parametrize(
    ("prediction", "truth"),
    [
        ("2^{10}", "1024"),  # a power is a value: its value is compared
        ("48^{1}", "48"),
        ("{2}^{10}", "1024"),
        ("\\frac{1}{2}", "0.5"),
        ("\\sqrt[3]{8}", "2"),
        ("\\binom{5}{2}", "10"),
        ("\\left(\\frac{1}{2}\\right)^{2}", "1/4"),
        ("(x + 1)(x + 2)", "x^2 + 3x + 2"),
        ("[1, 2]", "[1, 2]"),
        ("12 \\text{ cm}", "12"),  # a text command holding words alone is a unit
        ("12 \\text{ cm}^2", "12"),
        ("\\text{48}", "48"),  # ... one holding the number is read as its text
        ("\\mathbf{48}", "48"),
        ("x = 3", "3"),  # an assignment to a single variable is its value
        ("f(x) = 2x + 1", "2x+1"),
        ("\\theta = 30^\\circ", "30"),
        ("x \\approx 48", "48"),
        ("48 = 48", "48"),  # a true equation of numbers is its value
        ("\\frac{96}{2} = 48", "48"),
        ("a = 6 \\cdot 8 = 48", "48"),  # a chain whose sides are one value
        ("y = 2x + 1", "y = 2x + 1"),  # an equation where the truth is one
        ("1010_2", "1010_2"),  # a subscript written as the truth writes it: a base
        ("x = 2 \\text{ or } x = -2", "2, -2"),  # both solutions, where both are the truth
        ("1,000", "1000"),
        ("The answer is 48.", "48"),
        ("x = 48, so \\boxed{48}", "48"),
        ("It is $\\frac{1}{2}$, i.e. $0.5$", "1/2"),
        ("The answer is $2^{10}$.", "1024"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
        ("1 < x < 3", "1 < x < 3"),  # an inequality with one value a side
    ],
)
def test_honest_forms_are_one_value(prediction: str, truth: str) -> None:
    assert judge_math(prediction, [truth]).correct, judge_math(prediction, [truth])
    assert holds_one_value(prediction, [truth])


def test_a_subscript_counts_as_the_truth_writes_it() -> None:
    assert check_math("1010_2", "1010_2")
    assert not check_math("1010_3", "1010_2")  # math_verify read both as 1010
    assert not check_math("1010_2", "1010")
    assert not holds_one_value("72_{73}")  # no truth: any number in a subscript is a second


def test_an_equation_is_compared_as_one_only_up_to_the_truths_sides() -> None:
    assert check_math("y = 2x + 1", "y = 2x + 1")
    # A chain read by its first and last sides (math_verify's assignment) holds a third.
    assert (
        judge_math("y = 3 = 2x + 1", ["y = 2x + 1"]).read == "not one value: a chain of equations"
    )


@pytest.mark.parametrize(
    ("answer", "one"),
    [
        ("48 \\to 49", False),  # not read as math, and two numbers in it
        ("48 \\mid 49", False),
        ("48\\\\49", False),
        ("48 \\newline 49", False),
        ("72, or seventy-three", False),  # the unit cut kept "72,"
        ("\\text{Evelyn}", True),  # a text answer, no number
        ("\\text{(C)}", True),
        ("48 \\text{ apples}", True),
    ],
)
def test_holds_one_value_where_math_verify_reads_no_value(answer: str, one: bool) -> None:
    assert holds_one_value(answer) is one


def test_number_words_are_whole_phrases() -> None:
    # A hedge in words is two numbers; a word that holds a number's letters is none.
    assert not check_numeric("3.2, or three", 3.2, one_value=True)
    assert not check_numeric("3.2 (one of them)", 3.2, one_value=True)
    assert check_numeric("3.2 for someone, often, and none", 3.2, one_value=True)
    assert check_numeric("three thousand two hundred", 3200, rel_tol=0, one_value=True)
    assert check_numeric("forty-two", 42, rel_tol=0, one_value=True)
    assert not check_numeric("one and two", 3, rel_tol=0, one_value=True)  # two numbers
    assert exact_number("two hundred and five") == 205
    assert parse_numbers("forty-two") == []  # the last-number reading reads digits alone


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("2^{10}", [1024.0]),  # a power is its value, never its base
        ("2**10", [1024.0]),
        ("4\u00b2", [16.0]),
        ("\\frac{3}{4}^{2}", [0.5625]),
        ("30^\\circ", [30.0]),  # degrees, no power
        ("(3)^2", []),  # a bracket's power is not read, nor its base
        ("3.2 m/s, (3)^2", [3.2]),
        ("2^{x}", []),
        ("9.8 m/s^2", [9.8]),  # a unit's exponent is no value
        ("(m/s)^2 3", [3.0]),
        ("x_1 = 3", [3.0]),  # the last-number reading skips subscripts
        ("1e400", []),
    ],
)
def test_parse_numbers_reads_powers_as_values(text: str, numbers: list[float]) -> None:
    assert parse_numbers(text) == pytest.approx(numbers)


@pytest.mark.parametrize(
    ("prediction", "right"),
    [
        ("3.2^{2}", False),  # 10.24, not its base
        ("(3.2)^{2}", False),
        ("3.2^{x}", False),
        ("3.2_{3.1}", False),  # a subscript counts where one value is asked
        ("v_{3.1} = 3.2", False),
        ("v_0 = 3.2", False),
        ("3.2 \\text{ or } 3.1", False),
        ("3.2 or 1e400", False),  # a value beyond a float is no value, not nothing
        ("3.2^{1}", True),
        ("\\sqrt{10.24}", False),  # read as 10.24: roots are not computed here
        ("3.2 \\text{ m/s}^{2}", True),
        ("v = 3.2 m/s", True),
    ],
)
def test_check_numeric_one_value_counts_every_number(prediction: str, right: bool) -> None:
    assert check_numeric(prediction, 3.2, one_value=True) is right


def test_long_answers_cost_their_length() -> None:
    """The finish tool's answer has no length cap before these: powers of brackets, capitals
    after numbers and numbers were each found with a scan of all the text before them."""
    start = time.monotonic()
    assert not check_numeric("(" * 25_000 + ")^2" * 25_000, 1.0, one_value=True)
    assert parse_numbers("(1)^2 " * 20_000) == []
    assert parse_choice("B C " * 25_000, 4) is None
    assert final_answer(None, "\\boxed{B}" + " 1 C" * 25_000) != "B"
    assert exact_number("1 " * 50_000) is None
    # Linear scans take milliseconds, quadratic ones many minutes: a generous bound (a loaded
    # machine) tells them apart.
    elapsed = time.monotonic() - start
    assert elapsed < 60, f"long answers took {elapsed:.0f} s: a scan is quadratic"


def test_check_numeric_last_number_is_a_power_whole() -> None:
    assert not check_numeric("so v = 3.2^{2}", 3.2)
    assert check_numeric("so v = 3.2^{2}", 10.24)
    assert not check_numeric("so v = (3.2)^{2}", 3.2)
    assert check_numeric("v_1 = 2 then v_2 = 3.2", 3.2)  # subscripts skipped in this reading


@pytest.mark.parametrize(
    "prediction",
    [
        "B \\C",  # a letter after a backslash names a choice
        "\\A B",
        "(B) \\D",
        "B) 42 m/s \\C",
        "\\boxed{B} \\C",
        "B \\mbox{or} \\C",
        "\\textit{B} C",  # text commands read as their text
        "\\mathsf{B}\\mathsf{C}",
        "\\B",  # alone it is no answer
        "$\\B$",
        "B \\c",  # in lower case too
    ],
)
def test_check_choice_sees_letters_after_backslashes(prediction: str) -> None:
    assert parse_choice(prediction, 4) is None
    assert not check_choice(prediction, "B", 4)


@pytest.mark.parametrize(
    "prediction",
    [
        "\\boxed{B}",
        "\\textbf{B}",
        "\\mbox{B}",
        "(B)",
        "$B$",
        "\\(B\\)",
        "The answer is B.",
        "\\B B",
    ],
)
def test_check_choice_backslash_controls(prediction: str) -> None:
    assert parse_choice(prediction, 4) == "B"
    assert parse_choice("B \\N", 4) == "B"  # a letter beyond the choices names none


def test_final_answer_takes_a_mark_off_only_where_the_rest_names_nothing() -> None:
    every = ("boxed", "gsm8k", "answer_line", "answer_is")
    for whole in ("\\boxed{B} \\C", "\\boxed{B} or C", "\\boxed{48} or forty-nine"):
        assert final_answer(None, whole, every) == whole
    assert final_answer(None, "So it is \\boxed{48}.", every) == "48"
    assert final_answer(None, "Final Answer: \\boxed{B}", every) == "B"
    assert final_answer(None, "A careful count gives \\boxed{B}", every) == "B"  # an article


@pytest.mark.parametrize(
    ("answer", "exact"),
    [
        ("12345678901234567891", 12345678901234567891),  # never through a float
        ("7,318,200", 7318200),
        ("7318200.0", 7318200),
        ("1.5e3", 1500),
        ("0.1", Fraction(1, 10)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{6}{3}", 2),
        ("The product is 7318200.", 7318200),
        ("forty-two", 42),
        ("0042", 42),  # a number's value; a code is compared as text by its task
        ("2^{10}", None),  # a power is not written as a number
        ("42 or 43", None),
        ("42_{43}", None),
        ("42 or forty-three", None),
        ("1e999999", None),
        ("", None),
        (None, None),
    ],
)
def test_exact_number(answer: str | None, exact: Fraction | int | None) -> None:
    assert exact_number(answer) == exact
    if exact is not None:
        assert exact_number(answer) != exact + Fraction(1, 10**30)


# --- the bundled sets -----------------------------------------------------------------------------

MATH = load("math_bundle.jsonl")
STEM = load("stem_bundle.jsonl")


def test_math_bundle_shape() -> None:
    assert len(MATH) == 200
    ids = [r["instance_id"] for r in MATH]
    assert ids == [f"math-gen-{i:04d}" for i in range(1, 201)]
    assert len({r["problem"] for r in MATH}) == 200
    levels = {r["level"] for r in MATH}
    assert levels == {"arithmetic", "algebra"}
    for r in MATH:
        assert set(r) == {"data_source", "instance_id", "problem", "answer", "level", "kind"}
        assert r["data_source"] == "math"
        assert re.fullmatch(r"-?\d+(/\d+)?", r["answer"]), r
        f = Fraction(r["answer"])
        assert str(f) == r["answer"]  # in lowest terms


def equivalent_forms(answer: str) -> list[str]:
    f = Fraction(answer)
    forms = [f"\\boxed{{{answer}}}", f"The answer is {answer}.", f"x = {answer}"]
    if f.denominator == 1:
        forms.append(f"{f.numerator}.0")
    else:
        sign = "-" if f < 0 else ""
        forms.append(f"{sign}\\frac{{{abs(f.numerator)}}}{{{f.denominator}}}")
        forms.append(f"{2 * f.numerator}/{2 * f.denominator}")
        d = f.denominator
        while d % 2 == 0:
            d //= 2
        while d % 5 == 0:
            d //= 5
        if d == 1:  # a terminating decimal
            forms.append(f"{float(f):.10g}")
    return forms


@pytest.mark.parametrize("row", MATH, ids=[r["instance_id"] for r in MATH])
def test_math_bundle_answers_check(row: dict[str, Any]) -> None:
    answer = row["answer"]
    assert check_math(answer, answer)
    for form in equivalent_forms(answer):
        assert check_math(form, answer), form


def test_math_bundle_wrong_answers_rejected() -> None:
    rng = random.Random(0)
    for row in rng.sample(MATH, 40):
        f = Fraction(row["answer"])
        for wrong in (f + 1, -f if f else Fraction(1), f * 2 if f else Fraction(2)):
            assert not check_math(str(wrong), row["answer"]), (row, wrong)


def test_stem_bundle_shape() -> None:
    assert len(STEM) == 120
    assert [r["instance_id"] for r in STEM] == [f"stem-gen-{i:04d}" for i in range(1, 121)]
    kinds = [r["kind"] for r in STEM]
    assert kinds.count("choice") == kinds.count("numeric") == 60
    for r in STEM:
        assert r["data_source"] == "stem"
        assert r["question"]
        if r["kind"] == "choice":
            assert set(r["choices"]) == set("ABCD")
            assert r["answer"] in r["choices"]
            values = [parse_number(v) for v in r["choices"].values()]
            assert all(v is not None and v > 0 for v in values), r
            # No two options within 5% of each other: exactly one can be right.
            vs = sorted(v for v in values if v is not None)
            assert all(b > a * 1.05 for a, b in itertools.pairwise(vs)), r
        else:
            assert isinstance(r["answer"], float) and math.isfinite(r["answer"])
            assert r["unit"] and r["rel_tol"] == 0.01


@pytest.mark.parametrize("row", STEM, ids=[r["instance_id"] for r in STEM])
def test_stem_bundle_answers_check(row: dict[str, Any]) -> None:
    if row["kind"] == "choice":
        letter, n = row["answer"], len(row["choices"])
        assert check_choice(letter, letter, n)
        assert check_choice(f"The answer is ({letter.lower()}).", letter, n)
        assert check_choice(f"{letter}) {row['choices'][letter]}", letter, n)
        for other in sorted(set(row["choices"]) - {letter}):
            assert not check_choice(other, letter, n)
            assert not check_choice(f"{letter} or {other}", letter, n)
    else:
        value, unit, tol = row["answer"], row["unit"], row["rel_tol"]
        assert check_numeric(f"{value} {unit}", value, rel_tol=tol)
        assert check_numeric(f"{value:.4e}", value, rel_tol=tol)
        mant, exp = f"{value:.4e}".split("e")
        assert check_numeric(f"{mant} \\times 10^{{{int(exp)}}} \\text{{ {unit}}}", value, tol)
        assert check_numeric(f"The answer is {value * 1.005:.6g} {unit}.", value, rel_tol=tol)
        assert not check_numeric(f"{value * 1.05:.6g} {unit}", value, rel_tol=tol)
        assert not check_numeric(f"{value / 10:.6g} {unit}", value, rel_tol=tol)
