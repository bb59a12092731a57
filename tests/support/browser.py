"""A real browser for the dashboard's tests: Debian's headless Chromium, one process a page.

``--virtual-time-budget`` runs the page's timers on a virtual clock that stands still while a
fetch is pending, so ``--dump-dom`` gives the DOM once the page has read its data and drawn it
(no sleeping, no polling from the test); the page also marks itself ``data-loaded``. The DOM is
parsed with the standard library into a small tree to query by attribute.

What a one-shot dump cannot do (a person typing, a file downloaded) a ``Tab`` does: a page
driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no port, no websocket
library), which waits in the page for what it is told to wait for (a check run on each change
of the DOM) and for the browser's own events (a download's end), never for a time.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

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


# In the page: resolves with the check's value once it is truthy, checked now and on every change
# of the DOM; rejects past the deadline (a safety net, not a wait).
WAIT_IN_PAGE = """(check, ms) => new Promise((resolve, reject) => {
  let timer = null;
  const observer = new MutationObserver(() => test());
  const test = () => {
    let value;
    try { value = check(); } catch (e) { value = null; }
    if (value) { observer.disconnect(); clearTimeout(timer); resolve(value); }
  };
  const all = { subtree: true, childList: true, attributes: true, characterData: true };
  observer.observe(document, all);
  timer = setTimeout(() => {
    observer.disconnect();
    reject(new Error(`never true: ${check}`));
  }, ms);
  test();
})"""


def _high(fd: int) -> int:
    """``fd`` moved to 10 or above (close-on-exec): the child's 3 and 4 are not clobbered."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Tab:
    """One page of a headless Chromium, driven over the DevTools protocol on a pipe."""

    def __init__(self, binary: str, profile: Path, downloads: Path, size: tuple[int, int]) -> None:
        self.downloads = downloads
        cmd_r, self._cmd = map(_high, os.pipe())
        self._out, out_w = map(_high, os.pipe())
        # Chromium reads the protocol from fd 3 and writes it to fd 4.
        redirect = f'exec "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
        flags = [*FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}"]
        self._proc = subprocess.Popen(
            ["bash", "-c", redirect, binary, binary, *flags, "--remote-debugging-pipe"],
            pass_fds=(cmd_r, out_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._ids = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._session: str | None = None
        target = self.call("Target.createTarget", {"url": "about:blank"}, page=False)
        attached = self.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, page=False
        )
        self._session = attached["sessionId"]
        downloads.mkdir(parents=True, exist_ok=True)
        self.call(
            "Browser.setDownloadBehavior",
            {"behavior": "allowAndName", "downloadPath": str(downloads), "eventsEnabled": True},
            page=False,
        )
        self.call("Page.enable")

    def __enter__(self) -> Tab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):  # it may go before it answers
            self.call("Browser.close", page=False)
        try:
            self._proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._cmd, self._out):
            os.close(fd)

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "the browser said nothing before the deadline"
            ready, _, _ = select.select([self._out], [], [], left)
            if ready:
                chunk = os.read(self._out, 1 << 16)
                assert chunk, "the browser closed its end of the pipe"
                self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(self, method: str, params: dict[str, Any] | None = None, page: bool = True) -> Any:
        """The result of a command to the page (``page``) or to the browser."""
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params or {}}
        if page:
            message["sessionId"] = self._session
        os.write(self._cmd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + DEADLINE_S
        while True:
            answer = self._message(deadline)
            if answer.get("id") == self._ids:
                assert "error" not in answer, f"{method}: {answer['error']}"
                return answer.get("result", {})
            if "method" in answer:
                self._events.append(answer)

    def event(
        self, method: str, match: Callable[[dict[str, Any]], bool] = lambda _: True
    ) -> dict[str, Any]:
        """The parameters of the first event ``method`` that ``match`` takes (those come and
        gone included), once it comes."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            for i, e in enumerate(self._events):
                if e["method"] == method and match(e.get("params", {})):
                    del self._events[: i + 1]
                    params: dict[str, Any] = e.get("params", {})
                    return params
            message = self._message(deadline)
            if "method" in message:
                self._events.append(message)

    def go(self, url: str) -> None:
        """Load ``url`` (its redirects followed), until its load event."""
        self._events.clear()
        self.call("Page.navigate", {"url": url})
        self.event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise: what it resolves to)."""
        answer = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
        )
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    def wait_for(self, check: str) -> Any:
        """The value of the JavaScript expression ``check`` once it is truthy (tested on each
        change of the DOM)."""
        return self.evaluate(f"({WAIT_IN_PAGE})(() => ({check}), {int(DEADLINE_S * 1000)})")

    def type(self, selector: str, text: str) -> None:
        """Type ``text`` into the element of ``selector``, a key at a time."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        for char in text:
            self.call("Input.insertText", {"text": char})

    def download(self, click: str) -> tuple[Path, str]:
        """The file that clicking the element of the selector ``click`` downloads, and the name
        the page gave it."""
        self.evaluate(f"document.querySelector({json.dumps(click)}).click()")
        began = self.event("Browser.downloadWillBegin")
        done = self.event(
            "Browser.downloadProgress",
            lambda p: p["guid"] == began["guid"] and p["state"] != "inProgress",
        )
        assert done["state"] == "completed", done
        return self.downloads / began["guid"], began["suggestedFilename"]

    def screenshot(self, path: Path) -> Path:
        shot = self.call("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


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

    def tab(self, size: tuple[int, int] = (1400, 1000)) -> Tab:
        """A page to drive (``with browser.tab() as tab``), in a fresh profile."""
        self.runs += 1
        run = self.workdir / f"tab-{self.runs}"
        return Tab(self.binary, run / "profile", run / "downloads", size)

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
