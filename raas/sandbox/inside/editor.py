"""A file editor for agents: view, create, str_replace, insert, undo."""

from __future__ import annotations

import os

SNIPPET_LINES = 4
# Marks, in the undo history, that the file did not exist before (undo deletes it).
CREATED = "\0created"
MAX_VIEW_CHARS = 200_000


class ToolError(Exception):
    """A mistake of the caller's (the agent's), explained so that it can correct it."""


def numbered(text: str, first_line: int = 1) -> str:
    lines = text.split("\n")
    width = len(str(first_line + len(lines) - 1))
    return "\n".join(
        "{:>{w}}\t{}".format(first_line + i, line, w=width) for i, line in enumerate(lines)
    )


class Editor:
    def __init__(self, root: str) -> None:
        self.root = root
        self.history: dict[str, list[str]] = {}

    def resolve(self, path: str) -> str:
        if not path:
            raise ToolError("path is empty")
        return os.path.normpath(path if os.path.isabs(path) else os.path.join(self.root, path))

    def run(self, command: str, path: str, **args: object) -> str:
        handler = getattr(self, "do_" + command, None)
        if handler is None:
            raise ToolError(
                f"unknown editor command {command!r}; use view, create, str_replace, insert or"
                " undo_edit"
            )
        return handler(self.resolve(path), **args)  # type: ignore[no-any-return]

    def _read(self, path: str) -> str:
        if not os.path.exists(path):
            raise ToolError(f"{path} does not exist")
        if os.path.isdir(path):
            raise ToolError(f"{path} is a directory")
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _write(self, path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def _remember(self, path: str, text: str) -> None:
        self.history.setdefault(path, []).append(text)

    def do_view(self, path: str, view_range: list[int] | None = None) -> str:
        if os.path.isdir(path):
            return self._list(path)
        text = self._read(path)
        if view_range is None:
            if len(text) > MAX_VIEW_CHARS:
                raise ToolError(
                    f"{path} has {len(text)} characters; view a range of lines with view_range"
                )
            return numbered(text)
        lines = text.split("\n")
        if len(view_range) != 2:
            raise ToolError("view_range is [first_line, last_line] (last_line -1: to the end)")
        first, last = int(view_range[0]), int(view_range[1])
        last = len(lines) if last == -1 else last
        if not 1 <= first <= len(lines) or last < first or last > len(lines):
            raise ToolError(
                f"view_range {view_range} is outside the file's lines 1 to {len(lines)}"
            )
        return numbered("\n".join(lines[first - 1 : last]), first)

    def _list(self, path: str) -> str:
        out = []
        base_depth = path.rstrip("/").count("/")
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if dirpath.count("/") - base_depth >= 2:
                dirnames[:] = []
            for name in sorted(dirnames):
                out.append(os.path.join(dirpath, name) + "/")
            for name in sorted(filenames):
                if not name.startswith("."):
                    out.append(os.path.join(dirpath, name))
        return "\n".join(sorted(out))

    def do_create(self, path: str, file_text: str = "") -> str:
        if os.path.exists(path):
            raise ToolError(f"{path} already exists; edit it with str_replace or insert")
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._write(path, file_text)
        self._remember(path, CREATED)
        return f"created {path}"

    def do_str_replace(self, path: str, old_str: str = "", new_str: str = "") -> str:
        text = self._read(path)
        if not old_str:
            raise ToolError("old_str is empty")
        count = text.count(old_str)
        if count == 0:
            raise ToolError(f"old_str does not occur in {path}; nothing was replaced")
        if count > 1:
            lines = []
            start = 0
            while True:
                at = text.find(old_str, start)
                if at < 0:
                    break
                lines.append(text.count("\n", 0, at) + 1)
                start = at + 1
            raise ToolError(
                "old_str occurs {} times in {} (at lines {}); nothing was replaced: include"
                " more context to make it unique".format(
                    count, path, ", ".join(str(n) for n in lines)
                )
            )
        self._remember(path, text)
        at = text.index(old_str)
        new_text = text.replace(old_str, new_str, 1)
        self._write(path, new_text)
        first = max(text.count("\n", 0, at) + 1 - SNIPPET_LINES, 1)
        last = text.count("\n", 0, at) + 1 + new_str.count("\n") + SNIPPET_LINES
        snippet = "\n".join(new_text.split("\n")[first - 1 : last])
        return "edited {}; lines {} to {} now read:\n{}".format(
            path, first, min(last, new_text.count("\n") + 1), numbered(snippet, first)
        )

    def do_insert(self, path: str, insert_line: int = 0, new_str: str = "") -> str:
        text = self._read(path)
        lines = text.split("\n")
        if not 0 <= int(insert_line) <= len(lines):
            raise ToolError(f"insert_line {insert_line} is outside 0 to {len(lines)}")
        self._remember(path, text)
        n = int(insert_line)
        new_lines = lines[:n] + new_str.split("\n") + lines[n:]
        self._write(path, "\n".join(new_lines))
        first = max(n + 1 - SNIPPET_LINES, 1)
        last = n + new_str.count("\n") + 1 + SNIPPET_LINES
        snippet = "\n".join(new_lines[first - 1 : last])
        return f"inserted after line {n} of {path}:\n{numbered(snippet, first)}"

    def do_undo_edit(self, path: str) -> str:
        history = self.history.get(path)
        if not history:
            raise ToolError(f"no edit of {path} to undo")
        previous = history.pop()
        if previous == CREATED:
            os.unlink(path)
            return f"undid the creation of {path}"
        self._write(path, previous)
        return f"restored {path} to its state before the last edit"
