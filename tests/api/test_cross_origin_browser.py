"""A server without an API key against web pages, in headless Chromium: a page on another
origin (a second local server, another port) posts forms and no-cors fetches to the routes that
change something, and a page of a name that points at 127.0.0.1 (DNS rebinding, here by
Chromium's resolver rules) reads the API as its own. The server is unaffected: it still accepts
jobs, keeps its backend and its running job, and its log shows each request refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from raas.launch import ServerProcess
from tests.cli.test_server import wait_for_state
from tests.support.browser import Browser
from tests.support.llm_servers import ServerThread

BACKEND = "http://127.0.0.1:9"
# Every way a page reaches a route without the browser asking the server first: forms (one
# of them text/plain, holding JSON) and no-cors fetches, a typeless Blob of JSON among them.
ATTACK = """<!doctype html>
<html><body>
<iframe name="f0"></iframe><iframe name="f1"></iframe><iframe name="f2"></iframe>
<form id="stop" method="post" action="{raas}/stop" target="f0"></form>
<form id="clear" method="post" action="{raas}/clear_llm_server" target="f1" enctype="text/plain">
  <input name='{{"job_id": "' value='held"}}'>
</form>
<form id="cancel" method="post" action="{raas}/v1/rollouts/held/cancel" target="f2"></form>
<script>
for (const id of ["stop", "clear", "cancel"]) document.getElementById(id).submit();
const raas = "{raas}";
const instance = {{data_source: "gated", gate: "{gate}"}};
const job = JSON.stringify({{instance: instance, job_id: "planted"}});
Promise.allSettled([
  fetch(raas + "/stop", {{method: "POST", mode: "no-cors"}}),
  fetch(raas + "/clear_llm_server", {{method: "POST", mode: "no-cors"}}),
  fetch(raas + "/v1/rollouts/held/cancel", {{method: "POST", mode: "no-cors"}}),
  fetch(raas + "/v1/rollouts", {{method: "POST", mode: "no-cors", body: new Blob([job])}}),
]).then((shots) => {{ document.body.dataset.sent = shots.length; }});
</script>
</body></html>
"""


@dataclass
class Keyless:
    server: ServerProcess
    gate: Path

    @property
    def url(self) -> str:
        return self.server.url

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=30).json()

    def refused(self) -> list[str]:
        """The requests the access log shows answered 403, as ``METHOD PATH``."""
        text = self.server.log_path.read_text()
        return re.findall(r'"(POST [^ ]+) HTTP/1\.1" 403', text)


@pytest.fixture
def keyless(start_server: Any, tmp_path: Path) -> Iterator[Keyless]:
    """``raas serve`` without a key, with a backend and a job that runs until the test ends."""
    server = start_server(tmp_path / "raas.db")
    gate = tmp_path / "gate"
    job = {"instance": {"data_source": "gated", "gate": str(gate)}, "job_id": "held"}
    assert httpx.post(f"{server.url}/v1/rollouts", json=job).status_code == 202
    assert httpx.post(f"{server.url}/v1/backends", json={"url": BACKEND}).status_code == 201
    wait_for_state(server.url, "held", "run")
    yield Keyless(server, gate)
    gate.touch()


@pytest.fixture
def browser(tmp_path: Path) -> Browser:
    return Browser(tmp_path / "chromium")


def test_a_page_on_another_origin_cannot_stop_clear_or_cancel(
    keyless: Keyless, browser: Browser
) -> None:
    page = ATTACK.format(raas=keyless.url, gate=keyless.gate)
    site = FastAPI()
    site.add_api_route("/", lambda: HTMLResponse(page), methods=["GET"])
    attacker = ServerThread(site).start()
    try:
        dom = browser.dom(attacker.url + "/")
    finally:
        attacker.stop()
    assert dom.one("body").attrs.get("data-sent") == "4"  # the page ran to its end
    status = keyless.get("/v1/status")
    assert status["accepting"] and status["llm_servers"] == [BACKEND]
    assert keyless.get("/v1/rollouts/held")["state"] == "run"
    assert httpx.get(keyless.url + "/v1/rollouts/planted").status_code == 404
    # Each form and fetch reached the server and was refused there.
    assert sorted(keyless.refused()) == sorted(
        ["POST /stop", "POST /clear_llm_server", "POST /v1/rollouts/held/cancel"] * 2
        + ["POST /v1/rollouts"]
    )


def test_a_rebound_name_reads_nothing(keyless: Keyless, browser: Browser) -> None:
    """evil.example resolves to 127.0.0.1, so its page is same-origin with the server under
    that name: what the browser loads from there is what the page's script could read."""
    port = keyless.url.rsplit(":", 1)[1]
    rules = ("--host-resolver-rules=MAP evil.example 127.0.0.1",)
    dom = browser.dom(f"http://evil.example:{port}/v1/rollouts:running", flags=rules)
    assert "not a name of this server" in dom.text and "held" not in dom.text
    # The same browser, by the server's own name, reads it.
    own = browser.dom(f"http://localhost:{port}/v1/rollouts:running")
    assert '"job_id":"held"' in own.text
