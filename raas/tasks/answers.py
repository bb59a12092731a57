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
- ``exact_number(answer)``: the one number an answer holds, exactly as written (ids, counts).

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
  equals ``3`` (an assignment to a single variable is compared by its value, and a truth ``x=3``
  equals ``3``); ``2^{10}`` equals 1024 (a power is its value); ``1,000`` equals 1000;
  ``12 \\text{ cm}`` and ``12 cm`` equal 12. Decimals must agree to math_verify's
  ``float_rounding`` (6 places): 0.3333333 equals 1/3, 0.33 and 0.333 do not.
- A number followed by unit words ("12 m/s", "7 apples") is cut to the number, unless a number
  stands alone among those words, in digits or words ("48 or 49", "48 or forty-nine", "2 m 50
  cm": those are not units); ``\\$`` is dropped and a LaTeX thin space between digits
  (``1\\,000``) is removed. A text command (``\\text``, ``\\mbox``, ``\\mathrm``...) that holds
  words alone is a unit, which math_verify drops; one that holds a number is read as its text
  (``\\text{49 or 48}`` is "49 or 48", ``\\mbox{48}49`` is "48 49"), so that nothing math_verify
  drops holds a number.
- A percent sign (``25%``, ``25\\%``, "25 percent") is a unit like the others: the number is the
  value, in the answer and in the truth. math_verify would read ``25\\%`` as 25 and as 0.25, and
  ``2500\\%`` as 25: one answer matching two truths.
- A bare expression is read by the LaTeX extractor alone: where LaTeX cannot read it whole
  (``48 \\lor 49``), math_verify's plain-expression extractor would pick one number out of it.

One final value: an answer that holds two candidate values scores 0, whichever of them is right,
and so does one that holds a second number or choice anywhere math_verify would not read it as
part of the value. Values joined by "or", "and" or commas are read as the set they are (``{48,
49}``), which no single truth equals (a truth that is a set, such as the two solutions ``2,
-2``, may). A bare expression (and each box and math span) is refused where:

- two numbers stand side by side, with nothing between them that math_verify reads (blanks,
  TeX spacing such as ``\\quad``, a text command of words: "48 49", ``48 \\quad 49``, which
  LaTeX reads as their sum);
- a number is written in words ("48 + one"; math_verify reads no number words);
- a number lies in a subscript (``48_{49}``, ``x_{48} = 49``, ``x_1 = 3``, ``\\log_2 8``),
  unless a truth writes that subscript too (a base: ``1010_2``);
- a number lies in the argument of a command whose arguments math_verify does not read as the
  value (``\\phantom{49}``, ``\\tag{49}``, ``\\color{red}{49}``, ``\\overset{49}{48}``);
- an equation (``=``, ``==``, ``\\approx``, ``\\equiv``...) is not a value: math_verify reads an
  equation by its last side and ``\\approx`` by either, so every side but a variable first (one
  that holds no number: ``x = 3``, ``f(x) = 2x + 1``, an assignment) must be the same value
  (``\\frac{96}{2} = 48`` and ``a = 6 \\cdot 8 = 48`` are 48; ``47=48``, ``48 \\approx 49``,
  ``a=48=49``, ``2x + 1 = 5`` and ``48 = x`` are refused). Where a truth is an equation itself,
  math_verify compares the two, given no more sides than the truth's. An inequality between two
  values (``48 < 49``) is none.

A power is a value, compared by its value (``48^{49}`` is not 48). An answer in words or with
math delimiters must mention one value: every number (subscripts' and number words too), box
and math span in it the same ("The answer is 48. Or maybe 49.", "It is $49$, or perhaps $48$",
"48, or forty-nine" hold two), and it holds no LaTeX outside math delimiters, which
math_verify's prose reading does not read whole ("The answer is 48^{49}" was 48, "It is
3\\frac{1}{2}" 1/2). An answer math_verify reads as no math at all is one value for
holds_one_value only where it holds at most one number (``48 \\to 49`` holds two). A finish
tool's answer is judged whole unless a mark around it is all it holds (``\\boxed{49}
\\boxed{48}`` is two values, not the last box; so is ``\\boxed{48} or forty-nine``), while a
reply's text is judged by its last mark, as datasets' scorers do (a reply may correct itself),
and what that mark holds is judged whole (``#### 72 or 73`` is two values, not 72). Multiple
choice and numeric answers follow the same rule: a letter after a backslash (``B \\C``) is a
second choice (see parse_choice), and a one-value numeric answer counts every number in it, a
subscript's and number words too, a power by its value (see check_numeric).

Timeouts: math_verify guards ``parse`` and ``verify`` with ``signal.alarm``, which only works in the
main thread of the main interpreter. There ``check_math`` uses it (``timeout_s`` each). Anywhere
else it runs without the alarm and instead refuses (returns False) input longer than
``NO_TIMEOUT_MAX_CHARS`` or with shapes known to hang SymPy (a tower of powers, a large integer
power or factorial). Note that the alarm replaces any other SIGALRM timer while it runs.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache, partial
from typing import Any, Literal, NamedTuple

# math-verify warns on every call made off the main thread that its own timeout is off; the
# length guard below is what bounds those calls.
logging.getLogger("math_verify").setLevel(logging.ERROR)

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
    "parse_choice",
    "parse_number",
    "parse_numbers",
]

MAX_CHARS = 4000
"""check_math refuses a prediction or ground truth longer than this, whatever the thread."""
NO_TIMEOUT_MAX_CHARS = 300
"""check_math refuses longer input where it cannot use math_verify's alarm (not the main thread)."""
EQUATION_SIDES = 4
"""How many sides of an answer's equations (those that hold a number, beyond a variable) are
parsed to be compared, in all: ``a = 6 \\cdot 8 = 48`` asks 2; an answer that asks more is not
one value (each parse and each comparison may take ``timeout_s``)."""

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


def _names_a_value(text: str) -> bool:
    """Whether ``text`` names a value: a number (digits or words), a capital letter on its own
    (a choice; "A" as an article aside) or a letter written as a TeX command (``\\C``)."""
    return (
        _holds_number(text) or bool(_capitals(text)) or _COMMAND_LETTER_RE.search(text) is not None
    )


def final_answer(
    text: str | None, finish_answer: str | None, markers: Sequence[AnswerMarker] = ("boxed",)
) -> str | None:
    """The agent's final answer.

    The finish tool's answer when one was given and is not blank: if it is one of ``markers``
    around the answer, what that marks (so ``\\boxed{5}`` and ``$\\boxed{5}$`` give ``5``), else
    the answer itself, stripped. A mark is taken off only when the rest of the finish answer
    holds no other value (no number in digits or words, no capital letter on its own or letter
    after a backslash, no second mark): "The answer is 48. Or 49.", "\\boxed{48} or forty-nine",
    "\\boxed{B} \\C" and "\\boxed{3} \\boxed{4}" are judged whole, as the two values they hold.
    Otherwise the answer ``text`` marks (see marked_answer; by default the content of the last
    ``\\boxed{}``); otherwise None.
    """
    if finish_answer is not None and finish_answer.strip():
        given = finish_answer.strip()
        found = _marked(given, markers)
        if found is not None:
            marker, mark = found
            rest = given[: mark.start] + " " + given[mark.end :]
            if not _names_a_value(rest) and _MARKS[marker](rest) is None:
                return mark.content.strip()
        return given
    if text:
        return marked_answer(text, markers)
    return None


# ---------------------------------------------------------------------------------------------
# Math: symbolic equivalence with math_verify

_DELIMITED_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
# Text commands: their argument is text to math_verify (a unit, a word), not math.
_TEXT_COMMANDS = (
    "text|textbf|textit|textrm|textsf|texttt|textup|textnormal|mbox|hbox|"
    "mathrm|mathbf|mathit|mathsf|mathtt|operatorname"
)
_TEXT_ARG_RE = re.compile(rf"\\(?:{_TEXT_COMMANDS})\s*\{{([^{{}}]*)\}}")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_COMMAND_ARG_RE = re.compile(r"\\[A-Za-z]+(?:\s*\{[^{}]*\})?")
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
# What math_verify reads as nothing between two values: TeX's spacing, an empty group.
_BLANK_RE = re.compile(
    r"\\(?:[,:;! ]|quad|qquad|enspace|thinspace|medspace|thickspace|negthinspace|negmedspace"
    r"|negthickspace|space|nobreakspace|hfill|displaystyle|textstyle|newline)(?![A-Za-z])"
    r"|\\(?:hspace|hskip|kern|mkern|phantom|hphantom|vphantom)\*?\s*\{[^{}]*\}|~|\{\s*\}"
)
# Two numbers side by side ("48 49"), which LaTeX parsing reads as one (their sum).
_JUXTAPOSED_RE = re.compile(r"\d\s+[-+]?\.?\d")
# Between two numbers, more that math_verify reads as nothing (and then sums them: "48(49)",
# "{48}{49}", "48\left(49\right)", "48 \ldots 49" were each read as 97): delimiter sizes, dots,
# and brackets and groups that are no command's arguments.
_SIZING_RE = re.compile(
    r"\\(?:left|right|middle|[bB]igg?[lrm]?)(?![A-Za-z])\s*(?:\\?[()\[\]{}|.]|\\[A-Za-z]+)?"
)
_DOTS_RE = re.compile(r"\\(?:ldots|dots|cdots|vdots|ddots|dotsc|dotsb|dotsm)(?![A-Za-z])")
_ARGUMENTS_RE = re.compile(r"\\[A-Za-z]+(?:\s*(?:\{[^{}]*\}|\[[^\[\]]*\]))+")
# Math spans in text: $$...$$, $...$, \(...\), \[...\].
_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# Shapes that SymPy may evaluate for minutes: a power whose exponent holds another power, a power
# with a 4+ digit exponent, the factorial of a 3+ digit number.
_PATHOLOGICAL_RE = re.compile(
    r"\^\s*\{[^{}]*\^|\^\s*\(?\s*\d\s*\^|\^\s*\{?\s*\(?\s*\d{4,}|\*\*\s*\(?\s*\d{4,}|\*\*[^*]*\*\*|\d{3,}\s*!"
)
# Commands whose braced arguments math_verify reads as part of the value.
_EVALUATED = frozenset(
    ("frac", "dfrac", "tfrac", "cfrac", "sqrt", "binom", "dbinom", "tbinom", "boxed", "fbox")
    + ("overline", "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan")
    + ("sinh", "cosh", "tanh", "log", "ln", "lg", "exp", "begin", "end")
)
# A subscript: ``_{...}`` (one level of nested braces), ``_\cmd``, ``_x``.
_SUBSCRIPT_RE = re.compile(r"_\s*(\{(?:[^{}]|\{[^{}]*\})*\}|\\[A-Za-z]+|[^\s{\\])")
# Relations that math_verify reads as a value (an equation by its right-hand side, ``\approx`` by
# one of its sides): =, ==, :=, \approx, \equiv... (never <=, >=, != or \neq).
_EQUALS_RE = re.compile(
    r"(?<![<>!=:])==?(?!=)|:=|\\(?:approx|approxeq|thickapprox|equiv|simeq|cong|doteq"
    r"|coloneqq|eqqcolon)(?![A-Za-z])|[\u2248\u2261\u2243\u2245]"
)
# Relations that are never values: an inequality between two numbers (``48 < 49``) is neither.
_UNEQUAL_RE = re.compile(
    r"<=?|>=?|!=|\\(?:le|ge|leq|geq|lt|gt|ne|neq|leqslant|geqslant|nless|ngtr)(?![A-Za-z])"
    r"|[\u2264\u2265\u2260]"
)
# What separates the members of a set of answers ("x = 2 or x = 3", "x = 2, x = -2").
_MEMBERS_RE = re.compile(
    r"[,;]|\\(?:lor|land|vee|wedge|quad|qquad)(?![A-Za-z])|\b(?:or|and)\b"
    rf"|\\(?:{_TEXT_COMMANDS})\s*\{{[^{{}}]*\}}"
)
# LaTeX that prose outside math delimiters may not hold: math_verify's prose reading does not
# read it whole ("The answer is 2^{10}" gave 2, "3\frac{1}{2}" gave 1/2).
_LATEX_IN_PROSE_RE = re.compile(r"[\^_{}]|\\[A-Za-z]+")


def _is_prose(s: str) -> bool:
    """True when ``s`` reads as text: two or more words outside LaTeX commands and their
    arguments (``\\begin{pmatrix}``, ``\\mathbb{R}``)."""
    bare = _COMMAND_ARG_RE.sub(" ", _TEXT_ARG_RE.sub(" ", s))
    return len(_WORD_RE.findall(bare)) >= 2


def _unwrap_text(s: str) -> str:
    """``s`` with each text command that holds a number read as its text: ``\\text{49 or 48}``
    is "49 or 48", ``\\mbox{48}49`` is "48 49". Those holding words alone (units, "or") stay."""
    for _ in range(4):  # nested ones, from the inside
        unwrapped = _TEXT_ARG_RE.sub(
            lambda m: f" {m.group(1)} " if _holds_number(m.group(1)) else m.group(0), s
        )
        if unwrapped == s:
            break
        s = unwrapped
    return s


def _normalize(s: str) -> str:
    s = s.strip()
    s = s.replace("\\$", "")
    s = re.sub(r"(?<=\d)\\[,;: ](?=\d)", "", s)  # 1\,000 -> 1000
    s = s.replace("\\!", "")
    s = _PERCENT_RE.sub("", s)
    s = _unwrap_text(s)
    if not _DELIMITED_RE.search(s):
        m = _NUMBER_UNIT_RE.match(s)
        if m is not None:
            unit = m.group("unit")
            if ("/" in unit or _WORD_RE.search(unit)) and not _holds_lone_number(unit):
                s = m.group("num")
    return s.strip().rstrip(".").strip()


def _holds_lone_number(unit: str) -> bool:
    """Whether words after a number hold another number: "or 49", "or forty-nine", "m 50 cm"."""
    return _LONE_NUMBER_RE.search(unit) is not None or _NUMBER_WORDS_RE.search(unit) is not None


def _span_value(span: str) -> str | float:
    """What a math span stands for, to tell two spans apart: its number if it holds one, else
    its text."""
    numbers = parse_numbers(span)
    return numbers[0] if len(numbers) == 1 else " ".join(span.split())


# ---------------------------------------------------------------------------------------------
# One value: where a second value may hide, and why an answer is not one value


def _depths(s: str) -> list[int]:
    """The bracket depth at each index of ``s`` (escaped braces, ``\\{``, do not count)."""
    depths, depth, i = [0] * len(s), 0, 0
    while i < len(s):
        depths[i] = depth
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depths[i + 1] = depth
            i += 2
            continue
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth = max(0, depth - 1)
        i += 1
    return depths


def _split_top(s: str, rx: re.Pattern[str]) -> list[str]:
    """``s`` split where ``rx`` matches outside brackets."""
    depths = _depths(s)
    parts, last = [], 0
    for m in rx.finditer(s):
        if depths[m.start()] == 0:
            parts.append(s[last : m.start()])
            last = m.end()
    parts.append(s[last:])
    return parts


def _subscripts(s: str) -> set[str]:
    """The subscripts of ``s`` that hold a number, as written (blanks and outer braces off)."""
    found = set()
    for m in _SUBSCRIPT_RE.finditer(s):
        sub = "".join(m.group(1).split())
        if sub.startswith("{") and sub.endswith("}"):
            sub = sub[1:-1]
        if _holds_number(sub):
            found.add(sub)
    return found


def _side_by_side(s: str) -> bool:
    """Whether two numbers of bare expression ``s`` stand side by side, with nothing between them
    that math_verify reads: blanks, TeX spacing, a text command of words, a delimiter's size,
    dots, a bracket or a group that is no command's argument ("48 49", ``48 \\quad 49``,
    ``{48}{49}``, "48(49)": each read as the sum)."""
    view = _DOTS_RE.sub(" ", _SIZING_RE.sub(" ", _BLANK_RE.sub(" ", _TEXT_ARG_RE.sub(" ", s))))
    for _ in range(8):  # a command with its arguments is one token, from the innermost out
        inner = _ARGUMENTS_RE.sub(" # ", view)
        if inner == view:
            break
        view = inner
    return _JUXTAPOSED_RE.search(re.sub(r"[{}()\[\]]", " ", view)) is not None


def _unread_arguments(s: str) -> bool:
    """Whether a number of ``s`` lies in the argument of a command that math_verify does not read
    as math (``\\phantom{49}``, ``\\color{red}{49}``, ``\\overset{49}{48}``, ``\\tag{49}``)."""
    closes = _closing_braces(s)
    for m in _COMMAND_RE.finditer(s):
        if m.group()[1:] in _EVALUATED:
            continue
        i = m.end()
        while True:
            while i < len(s) and s[i] in " \t\n":
                i += 1
            if i < len(s) and s[i] == "[":
                end = s.find("]", i)
                if end < 0:
                    break
                arg, i = s[i + 1 : end], end + 1
            elif i < len(s) and s[i] == "{" and i in closes:
                arg, i = s[i + 1 : closes[i]], closes[i] + 1
            else:
                break
            if _holds_number(arg):
                return True
    return False


def _relation_sides(s: str) -> int:
    """How many sides the longest equation among the members of ``s`` has (1: none)."""
    return max(len(_split_top(member, _EQUALS_RE)) for member in _split_top(s, _MEMBERS_RE))


@dataclass
class _Check:
    """What judging one answer's shape knows: the truths, the timeout of each parse (None: no
    alarm), and how many sides of its equations may still be parsed to be compared (0: none,
    where parsing is not allowed), shared by its boxes and spans."""

    truths: Sequence[str]
    timeout: int | None
    sides_left: int = EQUATION_SIDES


def _equation_refusal(s: str, check: _Check) -> str | None:
    """Why the equations in bare expression ``s`` make it no value, or None.

    An equation is a value or a refusal, never its last side (math_verify reads ``47=48`` as 48,
    ``48 \\approx 49`` as 48): a side that holds no number is a variable, allowed first and once
    (``x = 3``, ``f(x) = 2x+1``: an assignment, the value of its other side); every other side
    must be the same value (``\\frac{96}{2} = 48``, ``a = 6 \\cdot 8 = 48``), or the answer is
    refused (``47=48``, ``a=48=49``, ``x_{48} = 49``, ``2x + 1 = 5``). Where a truth is itself an
    equation, math_verify compares the two equations, given no more sides than the truth's. An
    inequality between two values (``48 < 49``, ``48 \\neq 49``) is none; ``1 < x < 3`` is one.
    At most ``EQUATION_SIDES`` sides are compared in all (each is parsed, within ``timeout``):
    an answer that asks more is refused."""
    truth_sides = max((_relation_sides(_normalize(t)) for t in check.truths), default=1)
    for member in _split_top(s, _MEMBERS_RE):
        bounds = _split_top(member, _UNEQUAL_RE)
        if any(_holds_number(a) and _holds_number(b) for a, b in itertools.pairwise(bounds)):
            return "not one value: an inequality between two values"
        sides = [side.strip() for side in _split_top(member, _EQUALS_RE)]
        if len(sides) == 1:
            continue
        if truth_sides > 1:
            if len(sides) > truth_sides:
                return "not one value: a chain of equations"
            continue
        if any(not side for side in sides):
            return "not one value: an equation with an empty side"
        values = sides[1:] if not _holds_number(sides[0]) else sides
        if any(not _holds_number(side) for side in values):
            return "not one value: an equation of two variables"
        if len(values) == 1:
            continue
        check.sides_left -= len(values)  # each parse may time out: bounded in all
        if check.sides_left < 0:
            return "not one value: equations with more sides than can be compared"
        if not _sides_equal(values, check.timeout):
            return "not one value: an equation whose sides differ"
    return None


def _expression_refusal(s: str, check: _Check) -> str | None:
    """Why bare expression ``s`` (normalized) is not one value, as far as its text tells, or None.

    Every number in it is read by math_verify as a part of the value: none in number words, in
    the argument of a command that it does not read (``\\phantom``, ``\\tag``), in a subscript
    (``48_{49}``, ``x_{48}``; unless a truth has that subscript, a base such as ``1010_2``), or
    side by side with another (``48 49``, ``48 \\quad 49``: summed); and its equations are values
    (see _equation_refusal)."""
    if _NUMBER_WORDS_RE.search(s):
        return "not one value: a number in words"
    if _unread_arguments(s):
        return "not one value: a number where it is not read"
    truth_subscripts = set().union(*(_subscripts(_normalize(t)) for t in check.truths))
    if not _subscripts(s) <= truth_subscripts:
        return "not one value: a number in a subscript"
    if _side_by_side(s):
        return "not one value"
    return _equation_refusal(s, check)


def _text_refusal(s: str, check: _Check) -> str | None:
    """Why text with words or math delimiters (normalized) is not one value, or None.

    Each box and math span is one value, and must be one as a bare expression is; the text
    around them holds no LaTeX (math_verify's prose reading does not read it whole) and its
    numbers are values, those in number words and subscripts too; all of these must be the same
    value ("x = 48, so \\boxed{48}" is one; "The answer is 48. Or maybe 49." two)."""
    values: set[str | float] = set()
    rest = s
    spans: list[str] = []
    for start, end, content in reversed(_boxes(s)):
        spans.append(content)
        rest = rest[:start] + " " + rest[end:]
    for m in _SPAN_RE.finditer(rest):
        content = next(g for g in m.groups() if g is not None)
        if content.strip():
            spans.append(content)
    rest = _SPAN_RE.sub(" ", rest)
    for content in spans:
        refusal = _shape_refusal(content, check)
        if refusal is not None:
            return refusal
        values.add(_span_value(content))
    words = _BLANK_RE.sub(" ", _TEXT_ARG_RE.sub(" ", rest))
    if _LATEX_IN_PROSE_RE.search(words):
        return "not one value: LaTeX in words, outside math delimiters"
    numbers = _scan(rest, every=True)
    if any(math.isnan(v) for v in numbers):
        return "not one value: a value that cannot be read"
    values.update(numbers)
    return "not one value" if len(values) > 1 else None


def _refusal(
    answer: str, truths: Sequence[str], timeout: int | None, compare: bool = True
) -> str | None:
    """Why ``answer`` is not one value, or None (see the module docstring). ``compare``: whether
    the sides of an equation may be parsed and compared (else an equation of two values is
    refused)."""
    return _shape_refusal(answer, _Check(truths, timeout, EQUATION_SIDES if compare else 0))


def _shape_refusal(answer: str, check: _Check) -> str | None:
    s = _normalize(answer)
    if _DELIMITED_RE.search(s) or _is_prose(s):
        return _text_refusal(s, check)
    return _expression_refusal(s, check)


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
    of an equation). ``ground_truths`` also tell where a subscript is written the same way (a
    base) and whether an equation is compared as one. Never raises."""
    if answer is None or not answer.strip() or len(answer) > MAX_CHARS:
        return False
    timeout = max(1, int(timeout_s)) if _in_main_thread() else None
    unparsed = timeout is None and (
        len(answer) > NO_TIMEOUT_MAX_CHARS or _PATHOLOGICAL_RE.search(answer) is not None
    )
    try:
        if _refusal(answer, ground_truths, timeout, compare=not unparsed) is not None:
            return False
    except Exception:  # the rules are plain text work; should one fail, nothing is read
        return False
    if unparsed:
        return True  # not parsed off the main thread: its text is all that is known
    parsed = _guarded(partial(_parse, answer, timeout)) or []
    if not any(not isinstance(p, str) for p in parsed) and len(set(_scan(answer, True))) > 1:
        return False  # not read as math, and two numbers in it: "48 \to 49", "48 \mid 49"
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
    input costs at most about 6 x ``timeout_s`` a truth, and the sides of the prediction's
    equations (at most ``EQUATION_SIDES``, see holds_one_value) once more each, and their
    comparisons; elsewhere long or pathological input is refused instead.
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
    try:
        refusal = _refusal(prediction, truths, timeout)
    except Exception:  # the rules are plain text work; should one fail, nothing is read
        refusal = "unreadable"
    if refusal is not None:
        return MathVerdict(False, refusal)
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


def _sides_equal(sides: Sequence[str], timeout: int | None) -> bool:
    """Whether the sides of an equation are all the same value: each parsed once, each compared
    with the next (math_verify, within ``timeout`` each)."""
    from math_verify import verify

    parsed = []
    for side in sides:
        read = _guarded(partial(_parse, side, timeout))
        if not read:
            return False
        parsed.append(read)
    return all(
        bool(_guarded(partial(verify, a, b, timeout_seconds=timeout)))
        for a, b in itertools.pairwise(parsed)
    )


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
_STRIP_MARKUP_RE = re.compile(rf"\\(?:{_TEXT_COMMANDS}|boxed|fbox)\s*\{{([^{{}}]*)\}}")
# A letter written as a TeX command (``\B``, ``\c``): it names no answer, but a choice all the same.
_COMMAND_LETTER_RE = re.compile(r"\\([A-Za-z])(?![A-Za-z])")
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
        if _AFTER_NUMBER_RE.search(text[max(0, m.start() - 3) : m.start()]):
            continue  # (the 3 characters the pattern spans: a whole-text search costs n squared)
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
    and a capital right after a number ("10.5 A", "300 K") as a unit. Text commands are read as
    their text (``\\text{B} C`` names two letters), and a letter written as a TeX command
    (``\\C``) names its choice wherever it stands, so ``B \\C`` and ``\\boxed{B} \\C`` name two;
    alone (``\\B``) it is no answer.
    """
    if prediction is None or n_choices < 1:
        return None
    valid = set(_LETTERS[: min(n_choices, len(_LETTERS))])
    text = prediction
    for _ in range(3):
        text = _STRIP_MARKUP_RE.sub(r" \1 ", text)
    text = text.replace("*", " ").replace("$", " ").strip()
    # A letter after a backslash names a choice too: "B \C" names two. Alone it is no answer.
    hidden = {m.group(1).upper() for m in _COMMAND_LETTER_RE.finditer(text)} & valid
    text = _COMMAND_LETTER_RE.sub(" ", text).strip()
    letter = _named_letter(text, valid)
    return letter if letter is not None and hidden <= {letter} else None


def _named_letter(text: str, valid: set[str]) -> str | None:
    """The one letter of ``valid`` that ``text`` (markup off) names, or None (see parse_choice)."""
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


# A power of the number just read: ``2^{10}``, ``2^10``, ``2**10``, ``2^{-1/2}`` (``^\circ`` is a
# degree sign, no power).
_POWER_RE = re.compile(
    r"\s*(?:\^|\*\*)\s*(?P<exp>\{(?:[^{}]|\{[^{}]*\})*\}|\([^()]*\)|[-+]?\d+(?:\.\d+)?|\\[A-Za-z]+|\S)"
)
_DEGREES_RE = re.compile(r"\{?\s*\\circ\s*\}?")
# A power of a bracket: ``(3)^2``, ``\frac{3}{4}^{2}`` (a unit's, ``(m/s)^2``, holds no digit).
_BRACKET_POWER_RE = re.compile(r"[)}\]]\s*(?:\^|\*\*)")
_OPENERS = {")": "(", "}": "{", "]": "["}

# Number words: cardinals, as a well-formed phrase ("forty-nine", "two hundred and five", "three
# thousand"); "one and two" is two numbers, not three.
_UNIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_TEEN_WORDS = (
    *("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen"),
)
_TEN_WORDS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_WORD_VALUES: dict[str, int] = {
    **{w: i for i, w in enumerate(_UNIT_WORDS)},
    **{w: 10 + i for i, w in enumerate(_TEEN_WORDS)},
    **{w: 20 + 10 * i for i, w in enumerate(_TEN_WORDS)},
}
_SCALE_VALUES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_W_UNIT = "(?:" + "|".join(_UNIT_WORDS[1:]) + ")"
_W_TEN = "(?:" + "|".join(_TEN_WORDS) + ")"
_W_TEEN = "(?:" + "|".join(_TEEN_WORDS) + ")"
_W_SMALL = rf"(?:{_W_TEN}(?:\s*-\s*|\s+)?{_W_UNIT}|{_W_TEN}|{_W_TEEN}|{_W_UNIT})"
_W_GROUP = rf"(?:(?:{_W_SMALL}\s+)?hundred(?:\s+(?:and\s+)?{_W_SMALL})?|{_W_SMALL})"
_W_SCALE = "(?:thousand|million|billion|trillion)"
_NUMBER_WORDS_RE = re.compile(
    rf"\b(?:zero|(?:{_W_GROUP}\s+)?{_W_SCALE}(?:,?\s+{_W_GROUP}\s+{_W_SCALE})*"
    rf"(?:,?\s+(?:and\s+)?{_W_GROUP})?|{_W_GROUP})\b",
    re.IGNORECASE,
)


def _words_value(phrase: str) -> int:
    total, current = 0, 0
    for word in re.findall(r"[a-z]+", phrase.lower()):
        if word == "hundred":
            current = (current or 1) * 100
        elif word in _SCALE_VALUES:
            total += (current or 1) * _SCALE_VALUES[word]
            current = 0
        elif word in _WORD_VALUES:
            current += _WORD_VALUES[word]
    return total + current


def _holds_number(text: str) -> bool:
    """Whether ``text`` holds a number: a digit or a number word."""
    return bool(re.search(r"\d", text)) or _NUMBER_WORDS_RE.search(text) is not None


def _to_float(s: str) -> float:
    return float(s.replace(",", ""))


def _exponent(exp: str) -> float:
    """The value of a power's exponent as written after ``^``, or NaN where it is no number."""
    inner = exp.strip()
    if inner[:1] in "{(" and inner[-1:] in "})":
        inner = inner[1:-1]
    if not inner.strip() or re.search(r"[A-Za-z]", re.sub(r"\\[dt]?frac", "", inner)):
        return math.nan
    values = _scan(inner, every=False)
    return values[0] if len(values) == 1 else math.nan


def _power(base: float, exp: str) -> float:
    if _DEGREES_RE.fullmatch(exp.strip()):
        return base  # 30^\circ: degrees
    e = _exponent(exp)
    try:
        v = math.pow(base, e)
    except (ValueError, OverflowError, ZeroDivisionError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _openings(text: str) -> dict[int, int]:
    """Where each bracket of ``text`` that closes opens: {closing index: opening index}. One
    pass, a stack for each kind of bracket."""
    stacks: dict[str, list[int]] = {"(": [], "{": [], "[": []}
    pairs: dict[int, int] = {}
    for i, c in enumerate(text):
        if c in stacks:
            stacks[c].append(i)
        elif c in _OPENERS and stacks[_OPENERS[c]]:
            pairs[i] = stacks[_OPENERS[c]].pop()
    return pairs


def _before(text: str, start: int) -> str:
    """The two characters before ``start`` once blanks, ``{`` and ``(`` are skipped: what a
    number at ``start`` is the exponent or the subscript of, if anything."""
    i = start
    while i > 0 and text[i - 1] in "{( ":
        i -= 1
    return text[max(0, i - 2) : i]


class _Reading(NamedTuple):
    """A value read from text: where it starts, its value (NaN: it cannot be read), and what it
    was read from (its match, or the value of its number words) for an exact reading."""

    start: int
    value: float
    match: re.Match[str] | None = None
    words: int | None = None
    powered: bool = False

    def exact(self) -> Fraction | None:
        """The value exactly as written where it is a plain number (never through a float)."""
        if math.isnan(self.value) or self.powered:
            return None
        if self.words is not None:
            return Fraction(self.words)
        return _exact(self.match) if self.match is not None else None


def _exact(m: re.Match[str]) -> Fraction | None:
    """The number ``_NUMBER_RE`` matched, exactly as written, or None."""

    def number(s: str) -> Fraction:
        return Fraction(Decimal(s.replace(",", "")))

    def ten_to(e: str) -> Fraction:
        if abs(int(e)) > 400:
            raise OverflowError(e)
        return Fraction(10) ** int(e)

    try:
        if m.group("frac"):
            return number(m.group("fn")) / number(m.group("fd"))
        if m.group("pow"):
            return ten_to(m.group("e3"))
        v = number(m.group("mant"))
        exp = m.group("e1") or m.group("e2")
        if exp is not None:
            return v * ten_to(exp)
        if m.group("den"):
            return v / number(m.group("den"))
        return v
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation is an ArithmeticError
        return None


def _readings(prediction: str | None, every: bool) -> list[_Reading]:
    """The values of ``prediction``, in order (see parse_numbers and _scan)."""
    if not prediction:
        return []
    text = prediction.replace("\u2212", "-").replace("\u2013", "-").replace("\u2009", " ")
    text = _SUPERSCRIPT_RUN_RE.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPTS) + "}", text)
    text = text.replace("{,}", ",")
    text = re.sub(r"(?<=\d)\\[,;: !](?=\d)", "", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("$", " ")
    found: list[_Reading] = []
    powered: set[int] = set()  # where numbers read with their power end
    for m in _NUMBER_RE.finditer(text):
        start = m.start()
        before = _before(text, start)
        # An exponent belongs to its power (read with it) or to a unit (m/s^2, cm^{3}).
        if before.endswith(("^", "**")):
            continue
        if before.endswith("_"):
            if not every:  # a subscript: an index (x_1), a base (1010_2), a formula (H_2O)
                continue
        elif start > 0 and text[start - 1].isalpha():
            continue  # digits glued to a letter (H2O, CO2, cm3) belong to a formula or a unit
        try:
            if m.group("frac"):
                v = _to_float(m.group("fn")) / _to_float(m.group("fd"))
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
            v = math.nan
        power = _POWER_RE.match(text, m.end())
        if power is not None:
            v = _power(v, power.group("exp"))  # 2^{10} is 1024, never 2
            powered.add(m.end())
        v = v if math.isfinite(v) else math.nan
        found.append(_Reading(start, v, m, None, power is not None))
    unread: list[tuple[int, int]] = []  # brackets raised to a power: (opening, closing)
    pairs: dict[int, int] | None = None
    digits: list[int] = []  # how many digits text holds before each index
    for m in _BRACKET_POWER_RE.finditer(text):
        # The power of a bracketed number is not read: its value is unknown, and the numbers in
        # the bracket are not it either.
        if m.start() + 1 in powered:
            continue  # \frac{3}{4}^{2}: the fraction's power, read with it
        if pairs is None:
            pairs = _openings(text)
            digits = list(itertools.accumulate((c.isdigit() for c in text), initial=0))
        opened = pairs.get(m.start())
        if opened is not None and digits[m.start()] > digits[opened]:
            unread.append((opened, m.start()))
            found.append(_Reading(m.start(), math.nan))
    if unread:
        # Brackets nest or follow one another, never cross: sorted by opening, the closing of
        # any that holds a position is the largest among those opened before it.
        unread.sort()
        spans, reach = [], -1
        for opened, closed in unread:
            if opened > reach:
                spans.append([opened, closed])
            else:
                spans[-1][1] = max(spans[-1][1], closed)
            reach = max(reach, closed)
        starts = [span[0] for span in spans]

        def inside(r: _Reading) -> bool:
            k = bisect.bisect_right(starts, r.start) - 1
            return k >= 0 and r.start < spans[k][1] and not math.isnan(r.value)

        found = [r for r in found if not inside(r)]
    if every:
        for m in _NUMBER_WORDS_RE.finditer(text):
            value = _words_value(m.group())
            found.append(_Reading(m.start(), float(value), None, value))
    found.sort(key=lambda reading: reading.start)
    return found


def _scan(prediction: str | None, every: bool) -> list[float]:
    """The values of ``prediction``, in order, NaN for one that cannot be read (see parse_numbers).

    With ``every`` (an answer given as the answer, which must hold one value), numbers that the
    last-number reading leaves out count too: a subscript's (``48_{49}``, ``x_{3}``) and number
    words ("forty-nine")."""
    return [reading.value for reading in _readings(prediction, every)]


def exact_number(answer: str | None) -> Fraction | None:
    """The one number that ``answer`` (given as the answer) holds, exactly as written: never
    through a float, so ``12345678901234567891`` is that integer and ``0.1`` is 1/10. Read as
    parse_numbers reads (``7,318,200``, ``1.5e3``, ``3/4``), with every number counted as
    check_numeric's ``one_value`` counts them (a subscript's, number words). None when it holds no
    number, more than one, or one not written as a plain number (a power, ``2^{10}``). Never
    raises."""
    readings = _readings(answer, every=True)
    return readings[0].exact() if len(readings) == 1 else None


def parse_numbers(prediction: str | None) -> list[float]:
    """Every number in ``prediction``, in order.

    Reads integers and decimals with an optional sign (``-3``, ``.5``; a Unicode minus or dash
    too), thousands separators (``1,234.5``, ``1{,}234``, ``1\\,234``), scientific notation
    (``6.02e23``, ``6.02E+23``, ``6.02 \\times 10^{23}``, ``6.02 x 10^23``, ``6.02·10²³``,
    ``10^{-3}``), fractions (``3/4``, ``\\frac{3}{4}``). A power of a number is its value
    (``2^{10}`` is 1024, ``4²`` is 16, ``30^\\circ`` is 30 degrees), never its base; a power whose
    exponent is no number (``2^{x}``), or of a bracket (``(3)^2``), or a value beyond a float, is
    not read. Numbers that belong to a unit, an index or a formula are skipped: a unit's exponent
    (``m/s^2``, ``cm^{3}``), subscripts (``x_1``) and digits glued to a letter (``H2O``, ``CO2``),
    so ``9.8 m/s^2`` gives only 9.8.
    """
    return [v for v in _scan(prediction, every=False) if not math.isnan(v)]


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
    given as the answer: a finish tool's, a box's), every value in it must be that close too,
    so that a hedge (``3.1 or 3.2``, ``between 3 and 4``) is wrong rather than read by its last
    number; there every number counts, those the last-number reading skips too: a subscript's
    (``3.2_{3.1}``, ``x_{3.1} = 3.2``) and number words ("3.2, or three"). A value that cannot
    be read (a power whose exponent is no number, ``(3.2)^{2}``, ``1e400``) makes it wrong, the
    last one too in the last-number reading: a power is its value or nothing, never its base.
    Never raises.
    """
    if not math.isfinite(truth):
        return False
    values = _scan(prediction, every=one_value)
    if not values:
        return False
    checked = values if one_value else values[-1:]
    return all(
        not math.isnan(v) and math.isclose(v, truth, rel_tol=rel_tol, abs_tol=abs_tol)
        for v in checked
    )
