"""Multiple-choice answers: the one letter a reply names."""

from __future__ import annotations

import re

from raas.judge.answers.latex import TEXT_COMMANDS

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_STRIP_MARKUP_RE = re.compile(rf"\\(?:{TEXT_COMMANDS}|boxed|fbox)\s*\{{([^{{}}]*)\}}")
# A letter written as a TeX command (``\B``, ``\c``): it names no answer, but a choice all the same.
COMMAND_LETTER_RE = re.compile(r"\\([A-Za-z])(?![A-Za-z])")
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


def capital_letters(text: str) -> set[str]:
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
    hidden = {m.group(1).upper() for m in COMMAND_LETTER_RE.finditer(text)} & valid
    text = COMMAND_LETTER_RE.sub(" ", text).strip()
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
        others = (_explicit_letters(text) | capital_letters(rest)) & valid
        return letter if letter in valid and others <= {letter} else None

    named = (_explicit_letters(text) | capital_letters(text)) & valid
    if len(named) != 1:
        return None
    return named.pop()


def check_choice(prediction: str | None, correct: str, n_choices: int) -> bool:
    """Whether ``prediction`` names the letter ``correct`` and no other (see parse_choice)."""
    letter = parse_choice(prediction, n_choices)
    return letter is not None and letter == correct.strip().strip("()").upper()
