"""Answer extraction and checking for math, multiple-choice and numeric (STEM) tasks.

Pure functions, no I/O:

- ``extract_boxed(text)``: the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``.
- ``marked_answer(text, markers)``: the answer a reply marks the way a dataset asks (``\\boxed{}``,
  GSM8K's ``#### 72``, DAPO's ``Answer: 72``, ``The answer is 72``), trying ``markers`` in order.
- ``final_answer(text, finish_answer, markers)``: the agent's final answer: the finish tool's
  answer (a marker around it removed) if given, else the marked answer in the text.
- ``check_math(prediction, ground_truth)``: symbolic equivalence with math_verify.
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
  ``1,000`` equals 1000; ``25\\%`` equals both 25 and 0.25 (math_verify accepts either reading
  of a percentage); ``12 \\text{ cm}`` and ``12 cm`` equal 12. Decimals must agree to math_verify's
  ``float_rounding`` (6 places): 0.3333333 equals 1/3, 0.33 and 0.333 do not.
- A number followed by unit words ("12 m/s", "7 apples") is cut to the number, ``\\$`` is dropped
  and a LaTeX thin space between digits (``1\\,000``) is removed.

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
from functools import lru_cache
from typing import Any, Literal

# math-verify warns on every call made off the main thread that its own timeout is off; the
# length guard below is what bounds those calls.
logging.getLogger("math_verify").setLevel(logging.ERROR)

__all__ = [
    "MARKERS",
    "MAX_CHARS",
    "NO_TIMEOUT_MAX_CHARS",
    "AnswerMarker",
    "check_choice",
    "check_math",
    "check_numeric",
    "extract_boxed",
    "final_answer",
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


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the balanced ``{...}`` opening at ``text[start]``, and the index after it."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character (\{, \}, \\) never opens or closes a group
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Every complete box in ``text``: (start, end, content)."""
    found: list[tuple[int, int, str]] = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            got = _braced(text, i)
            if got is not None:
                found.append((m.start(), got[1], got[0]))
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

# GSM8K: "#### 72" (the number; thousands separators and a dollar sign allowed).
_GSM8K_RE = re.compile(r"####\s*\$?\s*(-?[0-9][0-9.,]*)")
# DAPO / Minerva: "Answer: 72", the rest of the line.
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
# "The answer is 72", "the answers are 2 and 3".
_ANSWER_THAT_IS_RE = re.compile(r"\banswers?\s+(?:is|are)\s*:?\s*([^\n]+)", re.IGNORECASE)


def _last(rx: re.Pattern[str], text: str) -> str | None:
    found = rx.findall(text)
    return found[-1] if found else None


def _gsm8k(text: str) -> str | None:
    number = _last(_GSM8K_RE, text)
    if number is None:
        return None
    number = number.replace(",", "").rstrip(".")
    return number if number and number != "-" else None


def _answer_line(text: str) -> str | None:
    line = _last(_ANSWER_LINE_RE, text)
    if line is None:
        return None
    boxed = extract_boxed(line)
    line = boxed if boxed is not None else line.strip().strip("*_` ").strip()
    return line or None


def _answer_is(text: str) -> str | None:
    rest = _last(_ANSWER_THAT_IS_RE, text)
    if rest is None:
        return None
    rest = rest.strip().strip("*_` ")
    rest = re.split(r"\.\s", rest + " ", maxsplit=1)[0]  # to the end of the sentence
    return rest.strip().rstrip(".").strip() or None


MARKERS: dict[AnswerMarker, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "gsm8k": _gsm8k,
    "answer_line": _answer_line,
    "answer_is": _answer_is,
}
"""How each marker finds the answer in a reply: the last ``\\boxed{}``, the last ``#### 72``
(GSM8K), the last ``Answer: 72`` line (DAPO), the last ``The answer is 72`` (to the sentence's end).
"""


def marked_answer(text: str, markers: Sequence[AnswerMarker]) -> str | None:
    """The answer ``text`` marks with the first of ``markers`` that finds one, or None."""
    for marker in markers:
        found = MARKERS[marker](text)
        if found is not None and found.strip():
            return found.strip()
    return None


def final_answer(
    text: str | None, finish_answer: str | None, markers: Sequence[AnswerMarker] = ("boxed",)
) -> str | None:
    """The agent's final answer.

    The finish tool's answer when one was given and is not blank: if it carries one of
    ``markers``, what that marks (so ``\\boxed{5}`` and ``$\\boxed{5}$`` give ``5``), else the
    answer itself, stripped. Otherwise the answer ``text`` marks (see marked_answer; by default
    the content of the last ``\\boxed{}``); otherwise None.
    """
    if finish_answer is not None and finish_answer.strip():
        return marked_answer(finish_answer, markers) or finish_answer.strip()
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
    if not _DELIMITED_RE.search(s):
        m = _NUMBER_UNIT_RE.match(s)
        if m is not None:
            unit = m.group("unit")
            if "/" in unit or _WORD_RE.search(unit):
                s = m.group("num")
    return s.strip().rstrip(".").strip()


def _math_source(s: str) -> str:
    """The string to hand math_verify's ``parse`` for ``s`` (see the module docstring)."""
    s = _normalize(s)
    if _DELIMITED_RE.search(s) or _is_prose(s):
        return s
    s = re.sub(r"(?<!\\)%", r"\\%", s)  # a bare % would start a LaTeX comment
    return f"${s}$"


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _parse(source: str, timeout_s: int | None) -> list[Any]:
    from math_verify import parse  # type: ignore[import-untyped]

    parsed = parse(source, parsing_timeout=timeout_s)
    if not parsed and source.startswith("$") and source.endswith("$"):
        parsed = parse(source[1:-1], parsing_timeout=timeout_s)
    return list(parsed)


@lru_cache(maxsize=4096)
def _parse_gold(source: str, timeout_s: int | None) -> tuple[Any, ...]:
    # SymPy expressions are immutable, so a cached parse can be shared between calls. A failed
    # parse (perhaps a timeout under load) raises, and lru_cache does not keep exceptions.
    parsed = tuple(_parse(source, timeout_s))
    if not parsed:
        raise ValueError(f"math_verify cannot parse {source!r}")
    return parsed


def check_math(prediction: str | None, ground_truth: str, timeout_s: int = 3) -> bool:
    """Whether ``prediction`` is mathematically equivalent to ``ground_truth``.

    Both are parsed with math_verify (bare expressions wrapped in ``$...$``, see the module
    docstring) and compared with ``verify(gold, prediction)``. False for a None or blank
    prediction, for anything that cannot be parsed, and on timeout; never raises. ``timeout_s``
    bounds each parse and each pairwise comparison in the main thread (math_verify compares every
    parsed form of the truth with every one of the prediction, usually 2 x 2), so pathological
    input costs at most about 6 x ``timeout_s``; elsewhere long or pathological input is refused
    instead.
    """
    try:
        if prediction is None or not prediction.strip() or not ground_truth.strip():
            return False
        if len(prediction) > MAX_CHARS or len(ground_truth) > MAX_CHARS:
            return False
        timeout: int | None = max(1, int(timeout_s))
        if not _in_main_thread():
            timeout = None
            for s in (prediction, ground_truth):
                if len(s) > NO_TIMEOUT_MAX_CHARS or _PATHOLOGICAL_RE.search(s):
                    return False
        from math_verify import verify

        gold = list(_parse_gold(_math_source(ground_truth), timeout))
        pred = _parse(_math_source(prediction), timeout)
        if not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except BaseException as e:  # math_verify's TimeoutException is a BaseException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        return False


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
    return found


def parse_choice(prediction: str | None, n_choices: int) -> str | None:
    """The one option letter that ``prediction`` names, upper case, or None.

    Accepted: a bare letter (``B``, ``b``, ``B.``, ``(B)``, ``B)``, ``**B**``, ``\\boxed{B}``),
    ``Answer: B``, ``The answer is (b).``, ``Option B``, a letter followed by the option's text
    (``B) 42 m/s``, ``(B) 42``). None when no letter of the first ``n_choices`` is named, or when
    two different letters are (``A or B``, ``(A) and (C)``, ``The answer is B, not A``). In free
    text only capital letters count; "A" followed by a lowercase word is read as the article, and
    a capital right after a number ("10.5 A", "300 K") as a unit.
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
        # "B) 42 m/s": the rest is the option's text, whose capitals ("10 A") may be units; only
        # another explicitly named letter ("(B) or (C)") makes it ambiguous.
        letter = lead.group(1).upper()
        others = _explicit_letters(text[lead.end() :]) & valid
        return letter if letter in valid and others <= {letter} else None

    explicit = _explicit_letters(text) & valid
    capitals: set[str] = set()
    for m in _CAPITAL_RE.finditer(text):
        if m.group(1) == "A" and _ARTICLE_RE.match(text, m.start()):
            continue
        if _AFTER_NUMBER_RE.search(text, 0, m.start()):
            continue  # "10.5 A", "300 K": a unit
        capitals.add(m.group(1))
    capitals &= valid

    named = explicit | capitals
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
