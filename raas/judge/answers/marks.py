"""The answer a reply marks, the ways datasets' prompts ask for it, and the agent's final answer."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from raas.judge.answers.choices import COMMAND_LETTER_RE, capital_letters
from raas.judge.answers.latex import extract_boxed, find_boxes
from raas.judge.answers.numbers import holds_number

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
    boxes = find_boxes(text)
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
        holds_number(text)
        or bool(capital_letters(text))
        or COMMAND_LETTER_RE.search(text) is not None
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
