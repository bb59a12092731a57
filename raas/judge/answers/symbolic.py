"""Math answers: symbolic equivalence with math_verify, of an answer that holds one value.

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

import itertools
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from raas.judge.answers.latex import TEXT_COMMANDS, closing_braces, find_boxes
from raas.judge.answers.numbers import NUMBER_WORDS_RE, holds_number, parse_numbers, scan_numbers
from raas.judge.reasons import one_of, wrong_answer

# math-verify warns on every call made off the main thread that its own timeout is off; the
# length guard below is what bounds those calls.
logging.getLogger("math_verify").setLevel(logging.ERROR)

MAX_CHARS = 4000
"""check_math refuses a prediction or ground truth longer than this, whatever the thread."""
NO_ANSWER = "no answer"
"""A MathVerdict's ``read`` where there was no answer (None, or blank)."""
NO_TIMEOUT_MAX_CHARS = 300
"""check_math refuses longer input where it cannot use math_verify's alarm (not the main thread)."""
EQUATION_SIDES = 4
"""How many sides of an answer's equations (those that hold a number, beyond a variable) are
parsed to be compared, in all: ``a = 6 \\cdot 8 = 48`` asks 2; an answer that asks more is not
one value (each parse and each comparison may take ``timeout_s``)."""

_DELIMITED_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_TEXT_ARG_RE = re.compile(rf"\\(?:{TEXT_COMMANDS})\s*\{{([^{{}}]*)\}}")
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
    rf"|\\(?:{TEXT_COMMANDS})\s*\{{[^{{}}]*\}}"
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
            lambda m: f" {m.group(1)} " if holds_number(m.group(1)) else m.group(0), s
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
    return _LONE_NUMBER_RE.search(unit) is not None or NUMBER_WORDS_RE.search(unit) is not None


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
        if holds_number(sub):
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
    closes = closing_braces(s)
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
            if holds_number(arg):
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
        if any(holds_number(a) and holds_number(b) for a, b in itertools.pairwise(bounds)):
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
        values = sides[1:] if not holds_number(sides[0]) else sides
        if any(not holds_number(side) for side in values):
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
    if NUMBER_WORDS_RE.search(s):
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
    for start, end, content in reversed(find_boxes(s)):
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
    numbers = scan_numbers(rest, every=True)
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
    if not any(not isinstance(p, str) for p in parsed) and len(set(scan_numbers(answer, True))) > 1:
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
    49}`` for "48 or 49"), or why it was not read ("not one value", "unreadable"...);
    ``compared``: whether it was read and compared with the truth (else ``read`` says why not)."""

    correct: bool
    read: str
    compared: bool = False

    def reason(self, ground_truths: Sequence[str]) -> str | None:
        """Why the answer is wrong, for a result's ``metrics.reason``; None where it is right."""
        if self.correct:
            return None
        if not self.compared:
            return wrong_answer(None, "") if self.read == NO_ANSWER else f"answer {self.read}"
        return wrong_answer(self.read, one_of([t for t in ground_truths if t.strip()]))


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
        return MathVerdict(False, NO_ANSWER)
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
            return MathVerdict(True, read, compared=True)
    return MathVerdict(False, read, compared=True)


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
