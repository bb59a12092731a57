"""A real browser for the dashboard's tests: Debian's headless Chromium, one process a page.

``--virtual-time-budget`` runs the page's timers on a virtual clock that stands still while a
fetch is pending, so ``--dump-dom`` gives the DOM once the page has read its data and drawn it
(no sleeping, no polling from the test); the page also marks itself ``data-loaded``. The DOM is
parsed with the standard library into a small tree to query by attribute.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)
DEADLINE_S = 60.0  # a safety net for a browser that hangs, never an assertion on speed
VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "the dashboard's browser tests need Chromium: run scripts/install-system-deps.sh"
        " (Debian's chromium package)",
        pytrace=False,
    )


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def all(self, tag: str | None = None, **attrs: str | None) -> list[Node]:
        """Elements with ``tag`` and each attribute (``data_job`` is ``data-job``) equal to the
        value given, or present when the value is None."""

        def match(n: Node) -> bool:
            for key, value in attrs.items():
                name = key.replace("_", "-")
                if name not in n.attrs or (value is not None and n.attrs[name] != value):
                    return False
            return tag is None or n.tag == tag

        return [n for n in self.walk() if match(n)]

    def one(self, tag: str | None = None, **attrs: str | None) -> Node:
        found = self.all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} elements {tag or ''} {attrs}"
        return found[0]

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root


class Browser:
    """Loads pages in headless Chromium, each in a fresh profile (no cookie carried over)."""

    def __init__(self, workdir: Path) -> None:
        self.binary = chromium()
        self.workdir = workdir
        self.runs = 0

    def _run(self, url: str, *args: str) -> str:
        self.runs += 1
        profile = self.workdir / f"chromium-profile-{self.runs}"
        proc = subprocess.run(
            [self.binary, *FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    def dom(
        self,
        url: str,
        budget_ms: int = 3000,
        size: tuple[int, int] = (1400, 1000),
        flags: tuple[str, ...] = (),
    ) -> Node:
        """The page's DOM once its data has loaded (after ``budget_ms`` of virtual time);
        ``flags`` go to Chromium as well."""
        out = self._run(
            url,
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            *flags,
        )
        return parse(out)

    def screenshot(
        self, url: str, path: Path, size: tuple[int, int] = (1400, 1600), budget_ms: int = 3000
    ) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._run(
            url,
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={path}",
        )
        assert path.stat().st_size > 0
        return path
