"""Answer extraction and checking for math, multiple-choice and numeric (STEM) tasks.

Pure functions, no I/O:

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

How ``check_math`` feeds math_verify (measured with math-verify 0.9.0):

- math_verify's plain-expression extractor misses LaTeX outside math delimiters (``\\frac34``,
  ``\\sqrt{4}``), reads ``3,4`` as the decimal 3.4 and ``3:4`` as 3, and takes only the last number
  of ``x = 2 or x = 3``. Inside ``$...$`` the LaTeX extractor gets all of these right (3/4, 2,
  the set {3, 4}, the ratio 3/4, the set of both solutions), so an answer that looks like a bare
  expression is wrapped in ``$...$``. Text that already has delimiters (``$``, ``\\(``, ``\\[``,
  ``\\boxed``) is parsed as it is; prose (two or more words outside LaTeX commands, such as
  "The answer is 12.") is parsed as it is too, since wrapped prose turns into products of
  letters; math_verify then picks the last expression in it.
- With that: ``1/2``, ``0.5``, ``\\frac12``, ``\\dfrac{1}{2}``, ``2/4`` are all equal; ``x = 3``
  equals ``3`` (an assignment to a single variable is compared by its value, either way round);
  ``1,000`` equals 1000; ``12 \\text{ cm}`` and ``12 cm`` equal 12. Decimals must agree to
  math_verify's ``float_rounding`` (6 places): 0.3333333 equals 1/3, 0.33 and 0.333 do not.
- A number followed by unit words ("12 m/s", "7 apples") is cut to the number, unless a number
  stands alone among those words ("48 or 49", "2 m 50 cm": those are not units); ``\\$`` is
  dropped and a LaTeX thin space between digits (``1\\,000``) is removed.
- A percent sign (``25%``, ``25\\%``, "25 percent") is a unit like the others: the number is the
  value, in the answer and in the truth. math_verify would read ``25\\%`` as 25 and as 0.25, and
  ``2500\\%`` as 25: one answer matching two truths.
- A bare expression is read by the LaTeX extractor alone: where LaTeX cannot read it whole
  (``48 \\lor 49``), math_verify's plain-expression extractor would pick one number out of it.

One final value: an answer that holds two candidate values scores 0, whichever of them is right.
Values joined by "or", "and" or commas are read as the set they are (``{48, 49}``), which no
single truth equals (a truth that is a set, such as the two solutions ``2, -2``, may); two
numbers side by side ("48 49", which LaTeX reads as their sum) are refused; an answer in words
or with math delimiters must mention one value (every number, box and math span in it the same:
"The answer is 48. Or maybe 49." and "It is $49$, or perhaps $48$" hold two). A finish tool's
answer is judged whole unless a mark around it is all it holds (``\\boxed{49} \\boxed{48}`` is
two values, not the last box), while a reply's text is judged by its last mark, as datasets'
scorers do (a reply may correct itself), and what that mark holds is judged whole (``#### 72 or
73`` is two values, not 72).

Timeouts: math_verify guards ``parse`` and ``verify`` with ``signal.alarm``, which only works in the
main thread of the main interpreter. There ``check_math`` uses it (``timeout_s`` each). Anywhere
else it runs without the alarm and instead refuses (returns False) input longer than
``NO_TIMEOUT_MAX_CHARS`` or with shapes known to hang SymPy (a tower of powers, a large integer
power or factorial). Note that the alarm replaces any other SIGALRM timer while it runs.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Literal

# math-verify warns on every call made off the main thread that its own timeout is off; the
# length guard below is what bounds those calls.
logging.getLogger("math_verify").setLevel(logging.ERROR)

__all__ = [
    "MARKERS",
    "MAX_CHARS",
    "NO_TIMEOUT_MAX_CHARS",
    "AnswerMarker",
    "MathVerdict",
    "check_choice",
    "check_math",
    "check_numeric",
    "extract_boxed",
    "final_answer",
    "holds_one_value",
    "judge_math",
    "marked_answer",
    "parse_choice",
    "parse_number",
    "parse_numbers",
]

MAX_CHARS = 4000
"""check_math refuses a prediction or ground truth longer than this, whatever the thread."""
NO_TIMEOUT_MAX_CHARS = 300
"""check_math refuses longer input where it cannot use math_verify's alarm (not the main thread)."""

# ---------------------------------------------------------------------------------------------
# \boxed{...}

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _closing_braces(text: str) -> dict[int, int]:
    """Where each ``{`` of ``text`` closes: the index of its balancing ``}``, for those that do.
    One pass, so a reply of many unclosed boxes costs its length, not its length squared."""
    closes: dict[int, int] = {}
    opened: list[int] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character (\{, \}, \\) never opens or closes a group
            continue
        if c == "{":
            opened.append(i)
        elif c == "}" and opened:
            closes[opened.pop()] = i
        i += 1
    return closes


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every complete box in ``text``: (start, end, content)."""
    found: list[tuple[int, int, str]] = []
    closes: dict[int, int] | None = None
    for m in _BOX_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            # The brace follows a letter or a blank, never a backslash, so the one pass from
            # the start pairs the escapes after it as a scan from the brace would.
            closes = _closing_braces(text) if closes is None else closes
            if i in closes:
                found.append((m.start(), closes[i] + 1, text[i + 1 : closes[i]]))
        elif m.group().startswith("\\boxed") and i > m.end():
            # ``\boxed 5``: TeX takes the next token as the argument.
            token = re.match(r"[^\s$]+", text[i:])
            if token is not None:
                found.append((m.start(), i + token.end(), token.group()))
    return found


def extract_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Nested braces are balanced (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``) and escaped
    braces do not count (``\\boxed{\\{1, 2\\}}`` gives ``\\{1, 2\\}``). ``\\boxed 5`` gives ``5``.
    A box left unclosed (a truncated reply) is skipped in favour of the last closed one. The
    content is stripped of surrounding whitespace. None when there is no complete box.
    """
    boxes = _boxes(text)
    if not boxes:
        return None
    return boxes[-1][2].strip()


# ---------------------------------------------------------------------------------------------
# The answer a reply marks: the ways datasets' prompts ask for it

AnswerMarker = Literal["boxed", "gsm8k", "answer_line", "answer_is"]


@dataclass(frozen=True)
class _Mark:
    """An answer a reply marks: what the mark holds, and where the mark lies in the reply."""

    content: str
    start: int
    end: int


# GSM8K: "#### 72", to the end of the line (a dollar sign and thousands separators allowed).
_GSM8K_RE = re.compile(r"####[ \t]*\$?[ \t]*(-?[0-9.][^\n]*)")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# DAPO / Minerva: "Answer: 72", the rest of the line.
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
# "The answer is 72", "the answers are 2 and 3".
_ANSWER_THAT_IS_RE = re.compile(r"\banswers?\s+(?:is|are)\s*:?\s*([^\n]+)", re.IGNORECASE)


def _last(rx: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(rx.finditer(text))
    return matches[-1] if matches else None


def _boxed(text: str) -> _Mark | None:
    boxes = _boxes(text)
    if not boxes:
        return None
    start, end, content = boxes[-1]
    return _Mark(content.strip(), start, end)


def _gsm8k(text: str) -> _Mark | None:
    m = _last(_GSM8K_RE, text)
    if m is None:
        return None
    # The whole rest of the line: "#### 72 or 73" is two values, not 72.
    rest = m.group(1).strip().strip("*_` ").rstrip(".").strip()
    if _THOUSANDS_RE.fullmatch(rest):  # 1,000 is a number; 7,2 is two
        rest = rest.replace(",", "")
    return _Mark(rest, m.start(), m.end()) if rest and rest != "-" else None


def _answer_line(text: str) -> _Mark | None:
    m = _last(_ANSWER_LINE_RE, text)
    if m is None:
        return None
    line = m.group(1)
    boxed = extract_boxed(line)
    content = boxed if boxed is not None else line.strip().strip("*_` ").strip()
    return _Mark(content, m.start(), m.end()) if content else None


def _answer_is(text: str) -> _Mark | None:
    m = _last(_ANSWER_THAT_IS_RE, text)
    if m is None:
        return None
    sentence = re.split(r"\.\s", m.group(1) + " ", maxsplit=1)[0]  # to the end of the sentence
    content = sentence.strip().strip("*_` ").rstrip(".").strip()
    return _Mark(content, m.start(), m.start(1) + len(sentence)) if content else None


_MARKS: dict[AnswerMarker, Callable[[str], _Mark | None]] = {
    "boxed": _boxed,
    "gsm8k": _gsm8k,
    "answer_line": _answer_line,
    "answer_is": _answer_is,
}


def _content(find: Callable[[str], _Mark | None]) -> Callable[[str], str | None]:
    def content(text: str) -> str | None:
        mark = find(text)
        return mark.content if mark is not None else None

    return content


MARKERS: dict[AnswerMarker, Callable[[str], str | None]] = {
    name: _content(find) for name, find in _MARKS.items()
}
"""How each marker finds the answer in a reply: the last ``\\boxed{}``, the last ``#### 72``
(GSM8K, to the end of its line), the last ``Answer: 72`` line (DAPO), the last ``The answer is
72`` (to the sentence's end). The last, because a reply may correct itself; what the mark holds
is then judged whole ("#### 72 or 73" holds two values, not 72).
"""


def _marked(text: str, markers: Sequence[AnswerMarker]) -> tuple[AnswerMarker, _Mark] | None:
    for marker in markers:
        found = _MARKS[marker](text)
        if found is not None and found.content.strip():
            return marker, found
    return None


def marked_answer(text: str, markers: Sequence[AnswerMarker]) -> str | None:
    """The answer ``text`` marks with the first of ``markers`` that finds one, or None."""
    found = _marked(text, markers)
    return found[1].content.strip() if found is not None else None


def final_answer(
    text: str | None, finish_answer: str | None, markers: Sequence[AnswerMarker] = ("boxed",)
) -> str | None:
    """The agent's final answer.

    The finish tool's answer when one was given and is not blank: if it is one of ``markers``
    around the answer, what that marks (so ``\\boxed{5}`` and ``$\\boxed{5}$`` give ``5``), else
    the answer itself, stripped. A mark is taken off only when the rest of the finish answer
    holds no other value (no digit, no second mark): "The answer is 48. Or 49." and
    "\\boxed{3} \\boxed{4}" are judged whole, as the two values they hold. Otherwise the answer
    ``text`` marks (see marked_answer; by default the content of the last ``\\boxed{}``);
    otherwise None.
    """
    if finish_answer is not None and finish_answer.strip():
        given = finish_answer.strip()
        found = _marked(given, markers)
        if found is not None:
            marker, mark = found
            rest = given[: mark.start] + " " + given[mark.end :]
            if not re.search(r"\d", rest) and _MARKS[marker](rest) is None:
                return mark.content.strip()
        return given
    if text:
        return marked_answer(text, markers)
    return None


# ---------------------------------------------------------------------------------------------
# Math: symbolic equivalence with math_verify

_DELIMITED_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_TEXT_ARG_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_NUMBER_UNIT_RE = re.compile(
    r"^\s*(?P<num>[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?)\s+(?P<unit>[A-Za-z][A-Za-z/^\d.\s]*)$"
)
# A number that stands on its own in a unit ("or 49", "m 50 cm"): then it is no unit.
_LONE_NUMBER_RE = re.compile(r"(?<![\w^.])\d")
# A percent sign (or word) after a number: the number is the value (48% is 48, never 0.48).
_PERCENT_RE = re.compile(
    r"(?<=[\d}.])\s*(?:\\[,;! ]\s*)?(?:\\?%|\\text\s*\{\s*\\?%\s*\}|\\percent\b|percent\b)"
)
# Two numbers side by side ("48 49"), which LaTeX parsing reads as one (their sum).
_JUXTAPOSED_RE = re.compile(r"\d\s+[-+]?\.?\d")
# Math spans in text: $$...$$, $...$, \(...\), \[...\].
_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# Shapes that SymPy may evaluate for minutes: a power whose exponent holds another power, a power
# with a 4+ digit exponent, the factorial of a 3+ digit number.
_PATHOLOGICAL_RE = re.compile(
    r"\^\s*\{[^{}]*\^|\^\s*\(?\s*\d\s*\^|\^\s*\{?\s*\(?\s*\d{4,}|\*\*\s*\(?\s*\d{4,}|\*\*[^*]*\*\*|\d{3,}\s*!"
)


def _is_prose(s: str) -> bool:
    """True when ``s`` reads as text: two or more words outside LaTeX commands."""
    bare = _COMMAND_RE.sub(" ", _TEXT_ARG_RE.sub(" ", s))
    return len(_WORD_RE.findall(bare)) >= 2


def _normalize(s: str) -> str:
    s = s.strip()
    s = s.replace("\\$", "")
    s = re.sub(r"(?<=\d)\\[,;: ](?=\d)", "", s)  # 1\,000 -> 1000
    s = s.replace("\\!", "")
    s = _PERCENT_RE.sub("", s)
    if not _DELIMITED_RE.search(s):
        m = _NUMBER_UNIT_RE.match(s)
        if m is not None:
            unit = m.group("unit")
            if ("/" in unit or _WORD_RE.search(unit)) and not _LONE_NUMBER_RE.search(unit):
                s = m.group("num")
    return s.strip().rstrip(".").strip()


def _span_value(span: str) -> str | float:
    """What a math span stands for, to tell two spans apart: its number if it holds one, else
    its text."""
    numbers = parse_numbers(span)
    return numbers[0] if len(numbers) == 1 else " ".join(span.split())


def _values_in_text(s: str) -> set[str | float]:
    """The values that text with words or math delimiters mentions: each box and math span as
    one, and every number outside them."""
    values: set[str | float] = set()
    rest = s
    for start, end, content in reversed(_boxes(s)):
        values.add(_span_value(content))
        rest = rest[:start] + " " + rest[end:]
    for m in _SPAN_RE.finditer(rest):
        content = next(g for g in m.groups() if g is not None)
        if content.strip():
            values.add(_span_value(content))
    values.update(parse_numbers(_SPAN_RE.sub(" ", rest)))
    return values


def _one_value_shape(answer: str) -> bool:
    """Whether ``answer`` holds one value, as far as its text tells: with words or math
    delimiters around it, every box, math span and number in it stands for the same value ("The
    answer is 48. Or maybe 49." holds two; "x = 48, so \\boxed{48}" one); a bare expression
    has no two numbers side by side ("48 49")."""
    s = _normalize(answer)
    if _DELIMITED_RE.search(s) or _is_prose(s):
        return len(_values_in_text(s)) <= 1
    return _JUXTAPOSED_RE.search(s) is None


def _several(parsed: Sequence[Any]) -> bool:
    """Whether math_verify read several values: a set of two or more ("48 or 49", "48, 49",
    "48 \\pm 1")."""
    from sympy import FiniteSet  # type: ignore[import-untyped]

    return bool(parsed) and isinstance(parsed[0], FiniteSet) and len(parsed[0]) > 1


def holds_one_value(
    answer: str | None, ground_truths: Sequence[str] = (), timeout_s: int = 3
) -> bool:
    """Whether ``answer`` (given as the answer: the finish tool's, or what a mark holds) holds
    one final value: its text says one (see the module docstring), and math_verify does not read
    it as several values, unless one of ``ground_truths`` is several values too (the solutions
    of an equation). Never raises."""
    if answer is None or not answer.strip() or len(answer) > MAX_CHARS:
        return False
    if not _one_value_shape(answer):
        return False
    timeout = max(1, int(timeout_s)) if _in_main_thread() else None
    if timeout is None and (len(answer) > NO_TIMEOUT_MAX_CHARS or _PATHOLOGICAL_RE.search(answer)):
        return True  # not parsed off the main thread: its text is all that is known
    parsed = _guarded(partial(_parse, answer, timeout)) or []
    return not _several(parsed) or any(
        _several(_guarded(partial(_parse_gold, t, timeout)) or ()) for t in ground_truths
    )


def _math_source(s: str) -> tuple[str, bool]:
    """The string to hand math_verify's ``parse`` for ``s`` (see the module docstring), and
    whether it is a bare expression (wrapped in ``$...$`` here)."""
    s = _normalize(s)
    if _DELIMITED_RE.search(s) or _is_prose(s):
        return s, False
    s = re.sub(r"(?<!\\)%", r"\\%", s)  # a bare % would start a LaTeX comment
    return f"${s}$", True


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _parse(s: str, timeout_s: int | None) -> list[Any]:
    from math_verify import parse  # type: ignore[import-untyped]
    from math_verify.parser import LatexExtractionConfig  # type: ignore[import-untyped]

    source, bare = _math_source(s)
    if bare:
        # LaTeX only: the plain-expression extractor picks one number out of what LaTeX cannot
        # read ("48 \lor 49" gave 49); what cannot be read whole is compared as text.
        return list(parse(source, [LatexExtractionConfig()], parsing_timeout=timeout_s))
    return list(parse(source, parsing_timeout=timeout_s))


@lru_cache(maxsize=4096)
def _parse_gold(s: str, timeout_s: int | None) -> tuple[Any, ...]:
    # SymPy expressions are immutable, so a cached parse can be shared between calls. A failed
    # parse (perhaps a timeout under load) raises, and lru_cache does not keep exceptions.
    parsed = tuple(_parse(s, timeout_s))
    if not parsed:
        raise ValueError(f"math_verify cannot parse {s!r}")
    return parsed


@dataclass(frozen=True)
class MathVerdict:
    """Whether an answer matched, and what it was read as: math_verify's reading of it (``{48,
    49}`` for "48 or 49"), or why it was not read ("not one value", "unreadable"...)."""

    correct: bool
    read: str


def judge_math(
    prediction: str | None, ground_truths: Sequence[str], timeout_s: int = 3
) -> MathVerdict:
    """Whether ``prediction`` is mathematically equivalent to one of ``ground_truths``.

    The prediction must hold one value (see holds_one_value); then both are parsed with
    math_verify (bare expressions wrapped in ``$...$`` and read as LaTeX only, see the module
    docstring) and compared with ``verify(gold, prediction)``. Not correct for a None or blank
    prediction, for anything that cannot be parsed, and on timeout; never raises. ``timeout_s``
    bounds each parse and each pairwise comparison in the main thread (math_verify compares every
    parsed form of the truth with every one of the prediction, usually 2 x 2), so pathological
    input costs at most about 6 x ``timeout_s`` a truth; elsewhere long or pathological input is
    refused instead.
    """
    truths = [t for t in ground_truths if t.strip()]
    if prediction is None or not prediction.strip() or not truths:
        return MathVerdict(False, "no answer")
    if len(prediction) > MAX_CHARS or any(len(t) > MAX_CHARS for t in truths):
        return MathVerdict(False, "too long")
    timeout: int | None = max(1, int(timeout_s))
    if not _in_main_thread():
        timeout = None
        for s in (prediction, *truths):
            if len(s) > NO_TIMEOUT_MAX_CHARS or _PATHOLOGICAL_RE.search(s):
                return MathVerdict(False, "too long or too hard to check off the main thread")
    if not _one_value_shape(prediction):
        return MathVerdict(False, "not one value")
    pred = _guarded(partial(_parse, prediction, timeout))
    if not pred:
        return MathVerdict(False, "unreadable")
    read = str(pred[0])[:200]
    if _several(pred) and not any(
        _several(_guarded(partial(_parse_gold, t, timeout)) or ()) for t in truths
    ):
        return MathVerdict(False, f"not one value: {read}")
    for truth in truths:
        if _guarded(partial(_verify, truth, pred, timeout)):
            return MathVerdict(True, read)
    return MathVerdict(False, read)


def _verify(truth: str, pred: list[Any], timeout: int | None) -> bool:
    from math_verify import verify

    return bool(verify(list(_parse_gold(truth, timeout)), pred, timeout_seconds=timeout))


def _guarded(call: Callable[[], Any]) -> Any:
    """``call()``, or None where math_verify fails or times out."""
    try:
        return call()
    except BaseException as e:  # math_verify's TimeoutException is a BaseException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        return None


def check_math(prediction: str | None, ground_truth: str, timeout_s: int = 3) -> bool:
    """Whether ``prediction`` is mathematically equivalent to ``ground_truth`` (see judge_math);
    never raises."""
    return judge_math(prediction, [ground_truth], timeout_s).correct


# ---------------------------------------------------------------------------------------------
# Multiple choice

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_STRIP_MARKUP_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|boxed|fbox)\s*\{([^{}]*)\}")
# Explicit ways of naming a letter, matched case-insensitively.
_ANSWER_IS_RE = re.compile(
    r"\b(?:answer|option|choice)\s*(?:is|:|=|-)?\s*(?:option|choice)?\s*[:\s]*[(\[]?\s*([a-z])\b(?![-'])(?!(?<=(?-i:a))\s+[a-z]{2,})",
    re.IGNORECASE,
)
_PAREN_RE = re.compile(r"[(\[]\s*([a-z])\s*[)\]]", re.IGNORECASE)
_CLOSE_PAREN_RE = re.compile(r"(?<![A-Za-z])([a-z])\)", re.IGNORECASE)
# Letters offered as alternatives ("b or c", "B, C", "(b) or maybe c"): both named, in either case.
_ALTERNATIVE_RE = re.compile(
    r"(?<![\w'])([a-z])\s*[)\].]?\s*(?:(?:\b(?:or|and|nor|vs|versus)\b\.?|[,;&])\s*)+"
    r"(?:[a-z]{2,}\s+)?(?:option|choice)?\s*[(\[]?\s*([a-z])\b(?![-'])(?!(?<=(?-i:a))\s+[a-z]{2,})",
    re.IGNORECASE,
)
# A standalone capital letter in free text.
_CAPITAL_RE = re.compile("(?<![A-Za-z'\u2019\\\\])([A-Z])(?![A-Za-z'\u2019])")
# "A" as an article: followed by a lowercase word that is not a connective.
_ARTICLE_RE = re.compile(r"A\s+(?!(?:or|and|nor|is|vs|versus|then|but)\b)[a-z]{2,}")


_LEAD_RE = re.compile(r"[(\[]?\s*([A-Za-z])\s*(?:[)\]]|[.:](?=\s))\s*")
_AFTER_NUMBER_RE = re.compile(r"\d\s?$")


def _explicit_letters(text: str) -> set[str]:
    found: set[str] = set()
    for rx in (_ANSWER_IS_RE, _PAREN_RE, _CLOSE_PAREN_RE):
        found.update(m.group(1).upper() for m in rx.finditer(text))
    for m in _ALTERNATIVE_RE.finditer(text):
        found.update((m.group(1).upper(), m.group(2).upper()))
    return found


def _capitals(text: str) -> set[str]:
    """The standalone capitals of free text, but for "A" as an article and units after numbers
    ("10.5 A", "300 K")."""
    found: set[str] = set()
    for m in _CAPITAL_RE.finditer(text):
        if m.group(1) == "A" and _ARTICLE_RE.match(text, m.start()):
            continue
        if _AFTER_NUMBER_RE.search(text, 0, m.start()):
            continue
        found.add(m.group(1))
    return found


def parse_choice(prediction: str | None, n_choices: int) -> str | None:
    """The one option letter that ``prediction`` names, upper case, or None.

    Accepted: a bare letter (``B``, ``b``, ``B.``, ``(B)``, ``B)``, ``**B**``, ``\\boxed{B}``),
    ``Answer: B``, ``The answer is (b).``, ``Option B``, a letter followed by the option's text
    (``B) 42 m/s``, ``(B) 42``). None when no letter of the first ``n_choices`` is named, or when
    two different letters are (``A or B``, ``(A) and (C)``, ``The answer is B, not A``,
    ``Answer: b or c``, ``B. C.``). In free text a lone letter counts when it is a capital or
    offered as an alternative ("or c"); "A" followed by a lowercase word is read as the article,
    and a capital right after a number ("10.5 A", "300 K") as a unit.
    """
    if prediction is None or n_choices < 1:
        return None
    valid = set(_LETTERS[: min(n_choices, len(_LETTERS))])
    text = prediction
    for _ in range(3):
        text = _STRIP_MARKUP_RE.sub(r" \1 ", text)
    text = text.replace("*", " ").replace("$", " ").strip()

    bare = text.strip(" \t\n.:;,!()[]{}'\"`").upper()
    if len(bare) == 1:
        return bare if bare in valid else None

    lead = _LEAD_RE.match(text)
    if lead is not None:
        # "B) 42 m/s": the rest is the option's text, whose capitals after numbers ("10 A") are
        # units; another letter named there ("(B) or (C)", "B. C.") makes it ambiguous.
        letter = lead.group(1).upper()
        rest = text[lead.end() :]
        others = (_explicit_letters(text) | _capitals(rest)) & valid
        return letter if letter in valid and others <= {letter} else None

    named = (_explicit_letters(text) | _capitals(text)) & valid
    if len(named) != 1:
        return None
    return named.pop()


def check_choice(prediction: str | None, correct: str, n_choices: int) -> bool:
    """Whether ``prediction`` names the letter ``correct`` and no other (see parse_choice)."""
    letter = parse_choice(prediction, n_choices)
    return letter is not None and letter == correct.strip().strip("()").upper()


# ---------------------------------------------------------------------------------------------
# Numeric answers

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT_RUN_RE = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d*)?|\.\d+"
_SIGN = r"(?:(?<![\w)}\]])[-+])?"
_EXP = r"[-+]?\d+"
_TIMES = "(?:\\\\times|\\\\cdot|\u00d7|\u00b7|\\*|x|X)"  # \times \cdot, the signs, *, x
_NUMBER_RE = re.compile(
    r"(?P<frac>\\[dt]?frac\s*\{\s*(?P<fn>" + _SIGN + _UNSIGNED + r")\s*\}\s*"
    r"\{\s*(?P<fd>" + _UNSIGNED + r")\s*\})"
    r"|(?P<pow>(?<![\w.])10\s*(?:\^|\*\*)\s*\{?\s*\(?\s*(?P<e3>" + _EXP + r")\s*\)?\s*\}?)"
    r"|(?P<mant>" + _SIGN + "(?:" + _UNSIGNED + r"))"
    r"(?:"
    r"(?:[eE](?P<e1>" + _EXP + r"))(?![\w.])"
    r"|(?:\s*" + _TIMES + r"\s*10\s*(?:\^|\*\*)\s*\{?\s*\(?\s*(?P<e2>" + _EXP + r")"
    r"\s*\)?\s*\}?)"
    r"|(?:\s*/\s*(?P<den>" + _UNSIGNED + r")(?![\d.]))"
    r")?"
)


def _to_float(s: str) -> float:
    return float(s.replace(",", ""))


def parse_numbers(prediction: str | None) -> list[float]:
    """Every number in ``prediction``, in order.

    Reads integers and decimals with an optional sign (``-3``, ``.5``; a Unicode minus or dash
    too), thousands separators (``1,234.5``, ``1{,}234``, ``1\\,234``), scientific notation
    (``6.02e23``, ``6.02E+23``, ``6.02 \\times 10^{23}``, ``6.02 x 10^23``, ``6.02·10²³``,
    ``10^{-3}``), fractions (``3/4``, ``\\frac{3}{4}``). Numbers that belong to a unit or a
    formula are skipped: exponents (``m/s^2``, ``cm^{3}``) and digits glued to a letter (``H2O``,
    ``CO2``), so ``9.8 m/s^2`` gives only 9.8.
    """
    if not prediction:
        return []
    text = prediction.replace("\u2212", "-").replace("\u2013", "-").replace("\u2009", " ")
    text = _SUPERSCRIPT_RUN_RE.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPTS) + "}", text)
    text = text.replace("{,}", ",")
    text = re.sub(r"(?<=\d)\\[,;: !](?=\d)", "", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("$", " ")
    values: list[float] = []
    for m in _NUMBER_RE.finditer(text):
        start = m.start()
        before = text[:start].rstrip("{( ")
        # An exponent, subscript, or digits glued to a letter belong to a unit or a formula.
        if before.endswith(("^", "_", "**")):
            continue
        if start > 0 and (text[start - 1].isalpha() or text[start - 1] == "_"):
            continue
        try:
            if m.group("frac"):
                num, den = _to_float(m.group("fn")), _to_float(m.group("fd"))
                v = num / den
            elif m.group("pow"):
                v = 10.0 ** int(m.group("e3"))
            else:
                v = _to_float(m.group("mant"))
                exp = m.group("e1") or m.group("e2")
                if exp is not None:
                    v = v * 10.0 ** int(exp)
                elif m.group("den"):
                    v = v / _to_float(m.group("den"))
        except (ValueError, ZeroDivisionError, OverflowError):
            continue
        if math.isfinite(v):
            values.append(v)
    return values


def parse_number(prediction: str | None) -> float | None:
    """The last number in ``prediction`` (see parse_numbers), or None."""
    values = parse_numbers(prediction)
    return values[-1] if values else None


def check_numeric(
    prediction: str | None,
    truth: float,
    rel_tol: float = 1e-2,
    abs_tol: float = 0.0,
    one_value: bool = False,
) -> bool:
    """Whether the last number in ``prediction`` (see parse_number) is close to ``truth``.

    ``math.isclose(value, truth, rel_tol=rel_tol, abs_tol=abs_tol)``: relative to the larger of the
    two magnitudes, so give ``abs_tol`` when ``truth`` may be 0. With ``one_value`` (an answer
    given as the answer: a finish tool's, a box's), every number in it must be that close too,
    so that a hedge (``3.1 or 3.2``, ``between 3 and 4``) is wrong rather than read by its last
    number. Never raises.
    """
    values = parse_numbers(prediction)
    if not values or not math.isfinite(truth):
        return False
    checked = values if one_value else values[-1:]
    return all(math.isclose(v, truth, rel_tol=rel_tol, abs_tol=abs_tol) for v in checked)
