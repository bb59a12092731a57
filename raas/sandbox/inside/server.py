"""The action server: the first process in a sandbox, serving tools over a Unix socket.

Protocol 3, JSON lines. On connect the server sends ``{"hello": {"protocol": 3, ...}}``. Each
request is ``{"id": N, "action": NAME, "args": {...}}``; each answer is ``{"id": N, "ok": true,
"result": {...}}`` or ``{"id": N, "ok": false, "error": {"type": ..., "message": ...}}``. Requests
on one connection may overlap; bash and ipython each run one command at a time.

Protocol 2 adds the relay (see relay.py): the ``expose_gateway`` action (args ``port``, 0 for
any; ``timeout_s``, the deadline of one relayed request; ``token``, the bearer token a request
must carry; ``max_body``, the largest body in bytes) listens on 127.0.0.1 inside and answers
``{"port": N}``; from then on the server also sends ``{"relay": {...}}`` messages on that
connection, and the host sends ``{"relay_reply": {...}}`` lines, which get no answer.

Protocol 3 adds the proxy's door (see tunnel.py): the ``expose_proxy`` action (args ``port``,
``max_tunnels``) listens on 127.0.0.1 inside and answers ``{"port": N}``; the server then sends
``{"tunnel": {"id": N}}`` for each connection made to it, which the host carries on a connection
of its own whose first line is ``{"tunnel_attach": N}`` (or refuses with a ``{"tunnel_close":
{"id": N}}`` line).

The ``exec`` action (see execute.py) runs a fresh process from ``argv`` with the given ``stdin``,
``cwd``, ``env``, ``timeout_s`` and ``max_output``, outside the agent's shell: what judges use.

Standard library only, Python 3.8+: the image's own python3 runs it (or the one raas lends an
image without one: raas/sandbox/hostpython.py).
"""

from __future__ import annotations

import os
import sys

# Started with -I, so this file's directory is not on the path: the modules beside it are.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The server never speaks TLS: asyncio goes without ssl (OpenSSL's loading is a tenth of the
# start-up). The ipython action lifts this before importing jupyter_client.
sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

import asyncio  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any, Callable  # noqa: E402

from editor import Editor, ToolError  # noqa: E402
from execute import clean_env, run_process  # noqa: E402
from files import download, read_file, upload, write_file  # noqa: E402
from pyrepl import IPythonSession, KernelUnavailable  # noqa: E402
from relay import MAX_BODY, Relay, Send  # noqa: E402
from shell import Shell  # noqa: E402
from tunnel import MAX_TUNNELS, Tunnels  # noqa: E402

PROTOCOL = 3
READY = "RAAS-ACTION-SERVER-READY"
MAX_MESSAGE = 512 * 1024 * 1024


class BadRequest(Exception):
    pass


class ActionServer:
    def __init__(self, args: SimpleNamespace) -> None:
        self.args = args
        # The provider's environment (clean: the image's Env under raas's own), then the shell's.
        env = dict(os.environ)
        env.update(
            {
                "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
                "HOME": args.workdir,
                "TERM": "dumb",
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "PAGER": "cat",
                "GIT_PAGER": "cat",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.shell = Shell(args.workdir, env, args.scratch)
        self.editor = Editor(args.workdir)
        self.ipython = IPythonSession(args.workdir, args.scratch)
        self.relay = Relay()
        self.shell_started = False
        self.tunnels = Tunnels()
        self.actions: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": self.ping,
            "bash": self.bash,
            "exec": self.exec,
            "ipython": self.run_ipython,
            "editor": self.edit,
            "read_file": self.read,
            "write_file": self.write,
            "upload": self.upload,
            "download": self.download,
            "expose_gateway": self.expose_gateway,
            "expose_proxy": self.expose_proxy,
        }
        # The actions that answer on the connection that asked (its ``send``).
        self.attached = {"expose_gateway", "expose_proxy"}

    def path(self, value: Any, name: str = "path") -> str:
        if not isinstance(value, str) or not value:
            raise BadRequest(f"{name} must be a non-empty string")
        return self.editor.resolve(value)

    async def ping(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True}

    async def bash(self, args: dict[str, Any]) -> dict[str, Any]:
        command = args.get("command")
        if not isinstance(command, str):
            raise BadRequest("command must be a string")
        timeout = float(args.get("timeout_s") or self.args.timeout)
        max_output = int(args.get("max_output") or self.args.max_output)
        return await self.shell.run(command, timeout, max_output)

    async def exec(self, args: dict[str, Any]) -> dict[str, Any]:
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise BadRequest("argv must be a non-empty list of strings")
        stdin = args.get("stdin") or ""
        if not isinstance(stdin, str):
            raise BadRequest("stdin must be a string")
        try:
            env = clean_env(args.get("env"), self.args.workdir)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return await run_process(
            argv,
            stdin.encode(),
            self.path(args.get("cwd") or self.args.workdir, "cwd"),
            env,
            float(args.get("timeout_s") or self.args.timeout),
            int(args.get("max_output") or self.args.max_output),
        )

    async def run_ipython(self, args: dict[str, Any]) -> dict[str, Any]:
        code = args.get("code")
        if not isinstance(code, str):
            raise BadRequest("code must be a string")
        return await self.ipython.run(code, float(args.get("timeout_s") or self.args.timeout))

    async def edit(self, args: dict[str, Any]) -> dict[str, Any]:
        args = dict(args)
        command, path = args.pop("command", None), args.pop("path", None)
        if not isinstance(command, str):
            raise BadRequest("command must be a string")
        if not isinstance(path, str):
            raise BadRequest("path must be a string")
        output = await self._in_thread(self.editor.run, command, path, **args)
        return {"output": output}

    async def read(self, args: dict[str, Any]) -> Any:
        limit = int(args.get("max_bytes") or self.args.max_file)
        return await self._in_thread(read_file, self.path(args.get("path")), limit)

    async def write(self, args: dict[str, Any]) -> Any:
        content = args.get("content")
        if not isinstance(content, str):
            raise BadRequest("content must be a string")
        return await self._in_thread(
            write_file,
            self.path(args.get("path")),
            content,
            args.get("encoding", "utf-8"),
            int(args.get("mode", 0o644)),
        )

    async def upload(self, args: dict[str, Any]) -> Any:
        return await self._in_thread(
            upload, self.path(args.get("dest"), "dest"), args.get("tar_b64", "")
        )

    async def download(self, args: dict[str, Any]) -> Any:
        skip = args.get("skip") or []
        if not isinstance(skip, list) or not all(isinstance(p, str) for p in skip):
            raise BadRequest("skip must be a list of name patterns")
        limit = args.get("max_bytes")
        return await self._in_thread(
            download, self.path(args.get("path")), skip, None if limit is None else int(limit)
        )

    async def expose_gateway(self, args: dict[str, Any], send: Send | None = None) -> Any:
        if send is None:
            raise BadRequest("expose_gateway needs a connection")
        port = int(args.get("port") or 0)
        if not 0 <= port < 65536:
            raise BadRequest("port must be in 0..65535")
        timeout = float(args.get("timeout_s") or 600.0)
        token = args.get("token")
        if token is not None and not isinstance(token, str):
            raise BadRequest("token must be a string")
        max_body = int(args.get("max_body") or MAX_BODY)
        try:
            return {"port": await self.relay.expose(send, port, timeout, token, max_body)}
        except (OSError, ValueError) as e:
            raise ToolError(f"cannot listen for the relay: {e}") from None

    async def expose_proxy(self, args: dict[str, Any], send: Send | None = None) -> Any:
        if send is None:
            raise BadRequest("expose_proxy needs a connection")
        port = int(args.get("port") or 0)
        if not 0 <= port < 65536:
            raise BadRequest("port must be in 0..65535")
        max_tunnels = int(args.get("max_tunnels") or MAX_TUNNELS)
        if max_tunnels < 1:
            raise BadRequest("max_tunnels must be at least 1")
        try:
            return {"port": await self.tunnels.expose(send, port, max_tunnels)}
        except (OSError, ValueError) as e:
            raise ToolError(f"cannot listen for the proxy: {e}") from None

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: fn(*args, **kwargs))

    async def answer(self, request: dict[str, Any], send: Send | None = None) -> dict[str, Any]:
        req_id = request.get("id")
        action = self.actions.get(str(request.get("action")))
        try:
            if action is None:
                raise BadRequest(
                    "unknown action {!r} (have: {})".format(
                        request.get("action"), ", ".join(sorted(self.actions))
                    )
                )
            args = request.get("args") or {}
            if not isinstance(args, dict):
                raise BadRequest("args must be an object")
            if request.get("action") in self.attached:
                result = await action(args, send)  # type: ignore[call-arg]
            else:
                result = await action(args)
            return {"id": req_id, "ok": True, "result": result}
        except (ToolError, KernelUnavailable, BadRequest) as e:
            return {
                "id": req_id,
                "ok": False,
                "error": {"type": type(e).__name__, "message": str(e)},
            }
        except TypeError as e:  # unexpected or missing arguments
            return {"id": req_id, "ok": False, "error": {"type": "BadRequest", "message": str(e)}}
        except Exception as e:
            return {
                "id": req_id,
                "ok": False,
                "error": {"type": type(e).__name__, "message": str(e)},
            }

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lock = asyncio.Lock()

        async def send(message: dict[str, Any]) -> None:
            async with lock:
                writer.write(json.dumps(message).encode() + b"\n")
                await writer.drain()

        async def handle(request: Any) -> None:
            if not isinstance(request, dict):
                message = "a request is a JSON object"
                error = {"type": "BadRequest", "message": message}
                await send({"id": None, "ok": False, "error": error})
                return
            await send(await self.answer(request, send))

        hello = {"protocol": PROTOCOL, "python": sys.version.split()[0], "pid": os.getpid()}
        await send({"hello": hello})
        if not self.shell_started:  # once the host has its hello: see serve
            self.shell_started = True
            self.shell.start_soon()
        tasks = set()
        first = True
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    request = json.loads(line)
                except ValueError:
                    request = None
                if first and isinstance(request, dict) and "tunnel_attach" in request:
                    # The host's stream for a tunnel (tunnel.py): raw bytes from here on.
                    await self.tunnels.attached(request["tunnel_attach"], reader, writer)
                    break
                first = False
                if isinstance(request, dict) and "relay_reply" in request:
                    self.relay.reply(request["relay_reply"])
                    continue
                if isinstance(request, dict) and "tunnel_close" in request:
                    closing = request["tunnel_close"]
                    self.tunnels.refused(closing.get("id") if isinstance(closing, dict) else None)
                    continue
                task = asyncio.ensure_future(handle(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self.relay.detach(send)
            self.tunnels.detach(send)
            for task in tasks:
                task.cancel()
            writer.close()

    async def serve(self) -> None:
        listener = None
        if self.args.listen_fd is not None:
            # The host made the socket and listens: its path is the host's, not bound in here.
            # Not inheritable, before the shell starts: it is not for the agent's processes.
            listener = socket.socket(fileno=self.args.listen_fd)
            listener.set_inheritable(False)
        if listener is not None:
            server = await asyncio.start_unix_server(
                self.connection, sock=listener, limit=MAX_MESSAGE
            )
        else:
            server = await asyncio.start_unix_server(
                self.connection, path=self.args.socket, limit=MAX_MESSAGE
            )
            os.chmod(self.args.socket, 0o600)
        print(READY, flush=True)
        # bash starts once the host has the first connection's hello (``connection``), not
        # here: its spawn would hold the loop while the host's connect waits to be accepted.
        # The start ends sooner, and the first command waits for bash.
        async with server:
            await server.serve_forever()


def apply_limits(args: SimpleNamespace) -> None:
    limits = [
        (resource.RLIMIT_AS, args.memory_bytes),
        (resource.RLIMIT_NPROC, args.max_processes),
        (resource.RLIMIT_FSIZE, args.file_size_bytes),
        (resource.RLIMIT_CORE, 0),
    ]
    for kind, value in limits:
        if (value is not None and value > 0) or kind == resource.RLIMIT_CORE:
            resource.setrlimit(kind, (value, value))


# The options (all "--name VALUE"): their types and defaults. Parsed by hand: argparse (and the
# gettext and locale it imports) would be a tenth of the server's start-up.
OPTIONS: dict[str, Any] = {
    "socket": (str, None),  # a Unix socket path to listen on
    "listen_fd": (int, None),  # or an inherited listening Unix socket
    "workdir": (str, "/workspace"),
    "scratch": (str, "/tmp"),
    "timeout": (float, 120.0),  # default seconds per action
    "max_output": (int, 64 * 1024),
    "max_file": (int, 64 * 1024 * 1024),
    "memory_bytes": (int, None),
    "max_processes": (int, None),
    "file_size_bytes": (int, None),
}


def parse_args(argv: list[str]) -> SimpleNamespace:
    values: dict[str, Any] = {name: default for name, (_, default) in OPTIONS.items()}
    if len(argv) % 2:
        sys.exit(f"server.py: every option takes a value: {argv}")
    for flag, text in zip(argv[::2], argv[1::2]):
        name = flag[2:].replace("-", "_")
        if not flag.startswith("--") or name not in OPTIONS:
            sys.exit(f"server.py: unknown option {flag}")
        try:
            values[name] = OPTIONS[name][0](text)
        except ValueError:
            sys.exit(f"server.py: {flag} {text!r} is not a valid {OPTIONS[name][0].__name__}")
    if (values["socket"] is None) == (values["listen_fd"] is None):
        sys.exit("server.py: give exactly one of --socket and --listen-fd")
    return SimpleNamespace(**values)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.workdir, exist_ok=True)
    os.chdir(args.workdir)
    apply_limits(args)
    server = ActionServer(args)
    try:
        asyncio.run(server.serve())
    finally:
        server.shell.close()
        server.ipython.close()


if __name__ == "__main__":
    main()
