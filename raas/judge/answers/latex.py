"""LaTeX that every answer checker reads the same way: ``\\boxed{...}`` and text commands."""

from __future__ import annotations

import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def closing_braces(text: str) -> dict[int, int]:
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


def find_boxes(text: str) -> list[tuple[int, int, str]]:
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
            closes = closing_braces(text) if closes is None else closes
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
    boxes = find_boxes(text)
    if not boxes:
        return None
    return boxes[-1][2].strip()


# Text commands: their argument is text to math_verify (a unit, a word), not math.
TEXT_COMMANDS = (
    "text|textbf|textit|textrm|textsf|texttt|textup|textnormal|mbox|hbox|"
    "mathrm|mathbf|mathit|mathsf|mathtt|operatorname"
)
