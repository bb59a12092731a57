"""The HTTP server bounded against a client that opens connections and never finishes a request:
a head must arrive in time, open connections are capped below the file limit, the soft file limit
is raised to the hard one at start, and the API key stays off the command line (issue 44, class
6). Each test starts a real ``raas serve`` and asserts on what it does, never on its speed."""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from raas.api.connections import MAX_DEFAULT_CONNECTIONS, TooManyConnections, connection_cap
from raas.cli import main
from raas.deploy.slurm import SlurmOptionError, serve_values
from raas.helpers.children import terminate
from raas.helpers.ports import free_port
from raas.helpers.readiness import exited, wait_until_answers

CAP = 8
HEAD_TIMEOUT_S = 1.0
DEADLINE_S = 60.0  # generous: the machine may be busy; what matters is that it happens
KEY = "bounds-test-key-9f3c2e"
_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
START_SOFT = min(1024, HARD // 2)  # what the servers are started with, below the hard limit


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_S)


def _low_soft_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (START_SOFT, HARD))


def start(tmp: Path, name: str, *args: str) -> Server:
    """``raas serve`` as a child whose soft file limit starts at START_SOFT."""
    port = free_port()
    log = tmp / f"{name}.log"
    argv = [sys.executable, "-m", "raas", "serve", "--db", str(tmp / f"{name}.db")]
    argv += ["--port", str(port), "--log-level", "warning", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_API_KEY")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_low_soft_limit
        )
    wait_until_answers(f"http://127.0.0.1:{port}/healthz", DEADLINE_S, exited(proc, log, name))
    return Server(proc, port)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that keeps CAP connections, with a head timeout long enough never to act here."""
    tmp = tmp_path_factory.mktemp("capped")
    server = start(tmp, "capped", "--max-connections", str(CAP), "--head-timeout-s", "600")
    yield server
    terminate(server.proc, 30)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with its key in a file and a short head timeout."""
    tmp = tmp_path_factory.mktemp("keyed")
    key_file = tmp / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    server = start(
        tmp, "keyed", "--api-key-file", str(key_file), "--head-timeout-s", str(HEAD_TIMEOUT_S)
    )
    yield server
    terminate(server.proc, 30)


def closed_by_server(sock: socket.socket) -> bool:
    """Has the server closed ``sock``? (Call when it is readable: an answer is read past.)"""
    try:
        return sock.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


# A head dripped a byte at a time: its start, then a header's value that never ends.
DRIPPED_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: "
_dripped: dict[socket.socket, int] = {}


def drip(socks: list[socket.socket]) -> None:
    """One more byte of a valid head on each of ``socks``."""
    for sock in socks:
        sent = _dripped.get(sock, 0)
        with contextlib.suppress(OSError):  # closed by the server: the next select sees it
            sock.send(DRIPPED_HEAD[sent : sent + 1] or b"a")
        _dripped[sock] = sent + 1


def wait_closed(socks: list[socket.socket], want: int, dripping: bool) -> list[socket.socket]:
    """Drip a byte on every open one (if ``dripping``) until ``want`` of ``socks`` are closed
    by the server, or DEADLINE_S: the closed ones."""
    closed: list[socket.socket] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(closed) < want and time.monotonic() < deadline:
        alive = [s for s in socks if s not in closed]
        if dripping:
            drip(alive)
        readable, _, _ = select.select(alive, [], [], 0.2)
        closed += [s for s in readable if closed_by_server(s)]
    return closed


def get_healthz(sock: socket.socket) -> bytes:
    """The whole response to GET /healthz on ``sock`` (what came before a close, if one)."""
    data = b""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        )
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
        return head + b"\r\n\r\n" + body
    except (ConnectionResetError, BrokenPipeError):  # closed before the request was read
        return data


def test_dripping_connections_beyond_the_cap_leave_the_server_reachable(capped: Server) -> None:
    assert httpx.get(capped.url + "/healthz", timeout=DEADLINE_S).status_code == 200  # control
    # The attack: three times the cap of connections, each dripping a byte of a request's head.
    flood = [capped.connect() for _ in range(3 * CAP)]
    try:
        drip(flood)
        closed = wait_closed(flood, 2 * CAP, dripping=True)
        assert len(closed) >= 2 * CAP, f"{len(closed)} of {len(flood)} cut: no cap held"
        # The rest still drip, and a plain client is answered all the same.
        drip([s for s in flood if s not in closed])
        r = httpx.get(capped.url + "/healthz", timeout=DEADLINE_S)
        assert r.status_code == 200 and r.json()["status"] == "ok"
    finally:
        for sock in flood:
            sock.close()


def test_at_the_cap_with_every_request_in_flight_a_new_connection_is_a_503(
    capped: Server,
) -> None:
    head = (
        b"POST /v1/rollouts HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    # CAP requests in flight (a body promised, never sent); one the server cut before it read
    # the head (it was the oldest still waiting for one) is opened again.
    holders: list[socket.socket] = []
    answer = b""
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select(holders, [], [], 0) if holders else ([], [], [])
            for sock in readable:
                if closed_by_server(sock):
                    holders.remove(sock)
                    sock.close()
            while len(holders) < CAP:
                holders.append(capped.connect())
                holders[-1].sendall(head)
            with capped.connect() as probe:
                answer = get_healthz(probe)
            if answer.startswith(b"HTTP/1.1 503"):
                break
        assert answer.startswith(b"HTTP/1.1 503"), answer  # the cap holds
        assert b"retry-after: 1" in answer.lower()
    finally:
        for sock in holders:
            sock.close()
    # Control: with the requests gone, the server answers again.
    status = None
    while status != 200 and time.monotonic() < deadline + DEADLINE_S:
        with capped.connect() as probe:
            answer = get_healthz(probe)
            status = int(answer.split()[1]) if answer else None
    assert status == 200


def test_a_connection_that_never_finishes_its_head_is_closed(keyed: Server) -> None:
    with keyed.connect() as control:  # control: a whole head is answered, and kept alive
        assert get_healthz(control).startswith(b"HTTP/1.1 200")
        assert get_healthz(control).startswith(b"HTTP/1.1 200")
    began = time.monotonic()
    half, dripper = keyed.connect(), keyed.connect()
    try:
        # The attack: half a head sent at once, and one dripped a byte at a time (slowloris).
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed: list[socket.socket] = []
        while len(closed) < 2 and time.monotonic() < began + DEADLINE_S:
            alive = [s for s in (half, dripper) if s not in closed]
            if dripper in alive:
                drip([dripper])
            readable, _, _ = select.select(alive, [], [], 0.2)
            closed += [s for s in readable if closed_by_server(s)]
        elapsed = time.monotonic() - began
        assert half in closed and dripper in closed, f"still open after {elapsed:.0f} s"
        assert elapsed >= HEAD_TIMEOUT_S  # cut by the head timeout, not at once
    finally:
        half.close()
        dripper.close()


def test_the_soft_file_limit_is_raised_to_the_hard_one(capped: Server) -> None:
    assert START_SOFT < HARD  # control: the server was started below its hard limit
    limits = Path(f"/proc/{capped.proc.pid}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    assert soft == hard == str(HARD), line


def test_the_connection_cap_stays_below_the_file_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert connection_cap(None, 1024) == 512
    assert connection_cap(None, 1 << 20) == MAX_DEFAULT_CONNECTIONS
    assert connection_cap(100, 1024) == 100
    with pytest.raises(TooManyConnections):
        connection_cap(513, 1024)
    from raas.api.server import DrainingServer

    served: list[Any] = []
    monkeypatch.setattr(DrainingServer, "run", lambda self: served.append(self))
    serve = ["serve", "--db", str(tmp_path / "x.db"), "--port", str(free_port())]
    result = CliRunner().invoke(main, [*serve, "--max-connections", str(HARD)])
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
    assert "over half the open-file limit" in result.output and served == []
    assert CliRunner().invoke(main, [*serve, "--max-connections", "64"]).exit_code == 0  # control
    assert len(served) == 1


def test_a_key_on_the_command_line_is_refused_and_a_key_file_stays_out_of_ps(
    keyed: Server, tmp_path: Path
) -> None:
    # Control: the key from the file is in force.
    assert httpx.get(keyed.url + "/v1/status", timeout=DEADLINE_S).status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(keyed.url + "/v1/status", headers=auth, timeout=DEADLINE_S).status_code == 200
    cmdline = Path(f"/proc/{keyed.proc.pid}/cmdline").read_bytes()
    assert b"--api-key-file" in cmdline and KEY.encode() not in cmdline
    # The attack on the key: a server given it on its command line, where ps shows it for days.
    for command in ("serve", "engine"):
        typed = subprocess.run(
            [sys.executable, "-m", "raas", command, "--api-key", KEY, "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            cwd=tmp_path,
        )
        error = typed.stderr.strip().splitlines()[-1]
        assert typed.returncode == 2, typed.stderr
        assert "--api-key-file" in error and "RAAS_API_KEY" in error and KEY not in error
    # Nor can raas slurm pass one on to every node's server; a key file it can (control).
    with pytest.raises(SlurmOptionError, match="--api-key-file"):
        serve_values(["--api-key", KEY])
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    assert serve_values(["--api-key-file", str(key_file)]) == {"api_key_file": str(key_file)}
