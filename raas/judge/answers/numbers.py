"""Numeric answers: the numbers a reply holds (digits, fractions, powers, number words), and
checking one against a truth with a tolerance."""

from __future__ import annotations

import bisect
import itertools
import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

from raas.judge.reasons import wrong_answer

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
NUMBER_WORDS_RE = re.compile(
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


def holds_number(text: str) -> bool:
    """Whether ``text`` holds a number: a digit or a number word."""
    return bool(re.search(r"\d", text)) or NUMBER_WORDS_RE.search(text) is not None


def _to_float(s: str) -> float:
    return float(s.replace(",", ""))


def _exponent(exp: str) -> float:
    """The value of a power's exponent as written after ``^``, or NaN where it is no number."""
    inner = exp.strip()
    if inner[:1] in "{(" and inner[-1:] in "})":
        inner = inner[1:-1]
    if not inner.strip() or re.search(r"[A-Za-z]", re.sub(r"\\[dt]?frac", "", inner)):
        return math.nan
    values = scan_numbers(inner, every=False)
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
    """The values of ``prediction``, in order (see parse_numbers and scan_numbers)."""
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
        for m in NUMBER_WORDS_RE.finditer(text):
            value = _words_value(m.group())
            found.append(_Reading(m.start(), float(value), None, value))
    found.sort(key=lambda reading: reading.start)
    return found


def scan_numbers(prediction: str | None, every: bool) -> list[float]:
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
    return [v for v in scan_numbers(prediction, every=False) if not math.isnan(v)]


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
    checked = checked_values(prediction, one_value)
    if not checked:
        return False
    return all(
        not math.isnan(v) and math.isclose(v, truth, rel_tol=rel_tol, abs_tol=abs_tol)
        for v in checked
    )


def numeric_reason(
    prediction: str | None,
    truth: float,
    rel_tol: float = 1e-2,
    one_value: bool = False,
) -> str:
    """Why check_numeric (with the same arguments) says no, for a result's ``metrics.reason``:
    the values it checked (every one with ``one_value``, else the last) and the truth."""
    checked = checked_values(prediction, one_value)
    if not checked:
        return wrong_answer(None, truth)
    # 12 digits: `:g`'s six showed 1234567 against 1234000 as 1.23457e+06 and 1.234e+06.
    read = ", ".join("an unreadable value" if math.isnan(v) else f"{v:.12g}" for v in checked)
    several = ", and one value only" if len(checked) > 1 else ""
    return wrong_answer(read, f"{truth:.12g} (relative tolerance {rel_tol:g}){several}")


def checked_values(prediction: str | None, one_value: bool) -> list[float]:
    """The values check_numeric compares with the truth: every one with ``one_value``, else
    the last."""
    values = scan_numbers(prediction, every=one_value)
    return values if one_value else values[-1:]
