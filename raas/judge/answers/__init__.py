"""Answer extraction and checking for math, multiple-choice and numeric (STEM) tasks.

Pure functions, no I/O, one module per kind of answer (``latex``: boxes; ``marks``: the answer a
reply marks; ``symbolic``: math with math_verify; ``choices``: a letter; ``numbers``: a number):

- ``extract_boxed(text)``: the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``.
- ``marked_answer(text, markers)``: the answer a reply marks the way a dataset asks (``\\boxed{}``,
  GSM8K's ``#### 72``, DAPO's ``Answer: 72``, ``The answer is 72``), trying ``markers`` in order.
- ``final_answer(text, finish_answer, markers)``: the agent's final answer: the finish tool's
  answer (a marker around it removed) if given, else the marked answer in the text.
- ``holds_one_value(answer)``: whether an answer holds one final value.
- ``judge_math(prediction, ground_truths)``, ``check_math(prediction, ground_truth)``: symbolic
  equivalence with math_verify, of an answer that holds one value.
- ``check_choice(prediction, correct, n_choices)``: a multiple-choice letter.
- ``check_numeric(prediction, truth, rel_tol, abs_tol, one_value)``: the last number in the
  prediction (with ``one_value``: every number in it), with a tolerance.
- ``numeric_reason(prediction, truth, rel_tol, one_value)``: why check_numeric said no.
- ``exact_number(answer)``: the one number an answer holds, exactly as written (ids, counts).

How check_math feeds math_verify, what one final value means and how its timeouts work: see
``raas.judge.answers.symbolic``.
"""

from raas.judge.answers.choices import check_choice, parse_choice
from raas.judge.answers.latex import extract_boxed
from raas.judge.answers.marks import MARKERS, AnswerMarker, final_answer, marked_answer
from raas.judge.answers.numbers import (
    check_numeric,
    exact_number,
    numeric_reason,
    parse_number,
    parse_numbers,
)
from raas.judge.answers.symbolic import (
    EQUATION_SIDES,
    MAX_CHARS,
    NO_TIMEOUT_MAX_CHARS,
    MathVerdict,
    check_math,
    holds_one_value,
    judge_math,
)

__all__ = [
    "EQUATION_SIDES",
    "MARKERS",
    "MAX_CHARS",
    "NO_TIMEOUT_MAX_CHARS",
    "AnswerMarker",
    "MathVerdict",
    "check_choice",
    "check_math",
    "check_numeric",
    "exact_number",
    "extract_boxed",
    "final_answer",
    "holds_one_value",
    "judge_math",
    "marked_answer",
    "numeric_reason",
    "parse_choice",
    "parse_number",
    "parse_numbers",
]
