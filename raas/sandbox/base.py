"""The Sandbox: one abstract runtime, one subclass per provider (bwrap, apptainer, local).

A provider only knows how to launch the action server in its isolation and how to tear it all
down; the tools (bash, ipython, editor, files) are the same everywhere and go through the action
server's socket.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import socket
import sys
import tarfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Protocol

from raas.sandbox import copies
from raas.sandbox.checkpoint import Checkpointed, Restored
from raas.sandbox.client import (
    RELAY_MAX_BODY_BYTES,
    ActionClient,
    BashResult,
    ExecResult,
    IPythonResult,
    RelayHandler,
    SandboxError,
)
from raas.sandbox.config import SandboxConfig, SandboxLimits
from raas.sandbox.egress import EgressPolicy, Resolver, system_resolver
from raas.sandbox.fork import CARRY_ALL, ForkCarry, ShellState
from raas.sandbox.proxy import Egress, EgressCaps
from raas.sandbox.runtime import check_runtime_dir, record_launch, runtime_root

INSIDE_DIR = Path(__file__).resolve().parent / "inside"
# How the image's python3 runs the action server: isolated (-I: no user site, no PYTHON*
# variables, no script directory on the path) and without the site module (-S), which costs a
# third of an interpreter's start; the ipython action loads site itself before jupyter_client.
SERVER_PYTHON_FLAGS = ("-I", "-S")
READY = b"RAAS-ACTION-SERVER-READY"
SOCKET_NAME = "a.sock"
# The server stops bash and ipython at their own timeout, and the other actions are file
# operations: an answer later than the action timeout by this much means the server is stuck.
ANSWER_GRACE_S = 30.0
# How long a killed sandbox's launched process may take to exit (it reaps its children first).
EXIT_WAIT_S = 5.0
# The launched process's stderr is a pipe (a file would be host disk that the sandbox can write
# through /proc/1/fd/2): the end of it is kept for error messages, and how long a failed start
# may take to write it all.
STDERR_KEPT = 4096
STDERR_WAIT_S = 2.0

log = logging.getLogger(__name__)


def launch_env(*keep: str) -> dict[str, str]:
    """The environment a provider starts its launched process with: ``keep`` (names such as
    PATH, which the provider's own tools need to find their helpers) of raas's environment, and
    nothing else. That process (bwrap, apptainer) or a fork of it is the sandbox's PID 1, whose
    environment anything in the sandbox reads at /proc/1/environ: raas's own (its API key, cloud
    credentials) must never be there. The action server and the agent get theirs from the
    provider's clean one (bwrap's ``--clearenv``, apptainer's ``--containall``).
    """
    return {name: os.environ[name] for name in keep if name in os.environ}


class Launched(Protocol):
    """The process a provider launches for a sandbox (an asyncio subprocess, or a zygote's
    fork: ``raas.sandbox.zygote.ForkedProcess``): stdout carries the action server's ready
    line, stderr its errors."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdout(self) -> asyncio.StreamReader | None: ...
    @property
    def stderr(self) -> asyncio.StreamReader | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


class Sandbox(ABC):
    can_fork: ClassVar[bool] = False  # whether ``fork`` works for this provider

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.limits = config.limits
        self.id = uuid.uuid4().hex[:12]
        self.dir = (config.runtime_dir or runtime_root()) / self.id
        self.client: ActionClient | None = None
        self.process: Launched | None = None
        self._closed = False
        self._close_lock = asyncio.Lock()
        self._stderr = bytearray()
        self._stderr_reader: asyncio.Task[None] | None = None
        self._held: list[SharedHold] = []
        # Said once, with the first tool's answer (a fork: what it could not carry over).
        self.note: str | None = None
        # raas's proxy for it, once opened (open_egress): its policy and what it carried.
        self.egress: Egress | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        """The host's end: the sandbox gets the listening socket itself, never this path."""
        return self.dir / SOCKET_NAME

    def server_args(self, listen_fd: int, scratch: str) -> list[str]:
        """The action server's command line (run by the image's python3)."""
        limits = self.limits
        args = [
            "--listen-fd", str(listen_fd),
            "--workdir", self.config.workdir,
            "--scratch", scratch,
            "--timeout", str(limits.action_timeout_s),
            "--max-output", str(limits.max_output_bytes),
            "--file-size-bytes", str(limits.disk_bytes),
        ]  # fmt: skip
        if limits.memory_bytes:
            args += ["--memory-bytes", str(limits.memory_bytes)]
        if limits.max_processes:
            args += ["--max-processes", str(limits.max_processes)]
        return args

    def hold(self, resource: contextlib.AbstractContextManager[Any]) -> None:
        """Enter ``resource`` now and leave it when the sandbox is closed (e.g. the image
        store's ``in_use(image)``, so that no prune removes the layers under the sandbox); its
        forks hold it too, and it is left when the last of them closes."""
        self._held.append(SharedHold(resource))

    def share_holds(self, child: Sandbox) -> None:
        """Make ``child`` (a fork of this sandbox) hold what this one holds."""
        for held in self._held:
            child._held.append(held.share())

    async def fork(
        self, limits: SandboxLimits | None = None, carry: ForkCarry = CARRY_ALL
    ) -> Sandbox:
        """A new, started sandbox whose files are a copy of this one's now (root, workspace,
        scratch), with its own limits (``limits``, else this one's), its own action server, and
        a shell in this shell's directory with its exported variables. Processes are not
        carried over: what ran here besides the shell is named in the child's ``note``. Call it
        between tool calls (no action of this sandbox running); the two are independent after.
        ``carry`` may leave some of it behind (a judge's fork: ``ForkCarry``).
        """
        raise SandboxError(f"{type(self).__name__} cannot fork")

    async def seal(self) -> bool:
        """Make this idle sandbox a source of copy-on-write forks, for good: its processes are
        killed (its shell's directory and variables read first, for its forks), and its files,
        which nothing can then change, become the lower layers its forks' writes go on top of
        (``raas.sandbox.cow``), instead of being copied. It runs no tool after; ``fork`` and
        ``close`` still work. For a group's template and a kept snapshot, whose forks must see
        what they saw when forked. False (and the sandbox unchanged and live) where this
        provider or the kernel cannot: its forks copy."""
        return False

    @property
    def can_checkpoint(self) -> bool:
        """Whether ``checkpoint`` keeps everything of this sandbox a job changes (its
        workspace; not a root it could change: an image's)."""
        return False

    async def checkpoint(
        self, snar: Path, dest: Path, max_bytes: int, unchanged: str | None = None
    ) -> Checkpointed:
        """Write the workspace's files into the new file ``dest`` (all of them where the state
        file ``snar`` does not exist yet, else the changes since the checkpoint that wrote it),
        and read the shell's directory and exported variables (raas.sandbox.checkpoint); where
        the workspace's signature is still ``unchanged`` (the last one's), no archive is
        written. Call it between tool calls, as ``fork``."""
        raise SandboxError(f"{type(self).__name__} cannot checkpoint")

    async def restore(self, archives: Sequence[Path], shell: ShellState | None) -> Restored:
        """Put a chain of ``checkpoint``'s archives (oldest first) into this fresh sandbox's
        workspace, then the shell's directory and variables; says what it could not."""
        raise SandboxError(f"{type(self).__name__} cannot restore a checkpoint")

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self._check_host_files)
            self.dir.mkdir(mode=0o711)
            # raas listens and hands the socket to the action server (an inherited fd): no host
            # directory is bound into the sandbox.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(str(self.socket_path))
                os.chmod(self.socket_path, 0o600)
                listener.listen(16)
                self.process = await self._launch(listener.fileno())
            record_launch(self.dir, self.process.pid)
            if self.process.stderr is not None:
                self._stderr_reader = asyncio.create_task(self._read_stderr(self.process.stderr))
            await self._wait_ready(self.process)
            self.client = await ActionClient.connect(
                self.socket_path, timeout_s=self.limits.start_timeout_s
            )
            await self._after_start(self.process)
        except BaseException:
            await self.close()
            raise

    def _check_host_files(self) -> None:
        """Before anything of the host is used: the runtime directory is one no one else may
        write in (``check_runtime_dir``), and each staged copy to be bound still holds what was
        staged (``copies.verify_binds``); a SandboxError naming what is not."""
        check_runtime_dir(self.dir.parent)
        binds = getattr(self.config, "ro_binds", None)
        if binds:
            copies.verify_binds(binds, runtime_root())

    @abstractmethod
    async def _launch(self, listen_fd: int) -> Launched:
        """Start the action server in this provider's isolation; stdout and stderr must be pipes.

        ``listen_fd`` is the listening socket: the launched process inherits it (``pass_fds``)
        and hands it on to the action server (``server_args``).
        """

    async def _after_start(self, process: Launched) -> None:  # noqa: B027
        """Once the server answers: what the provider needs to know; raising fails the start."""

    @abstractmethod
    def host_pids(self) -> set[int]:
        """Host PIDs of every process of this sandbox (empty once it is closed)."""

    async def _wait_ready(self, process: Launched) -> None:
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(
                process.stdout.readline(), timeout=self.limits.start_timeout_s
            )
        except TimeoutError:
            raise SandboxError(
                f"sandbox {self.id} did not start within {self.limits.start_timeout_s:g} s:"
                f" {self._stderr_tail()}"
            ) from None
        if not line.startswith(READY):
            if self._stderr_reader is not None:  # it failed: its stderr ends soon
                await asyncio.wait({self._stderr_reader}, timeout=STDERR_WAIT_S)
            # How it ended says what the (often empty) stderr does not: a signal, a status.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), timeout=STDERR_WAIT_S)
            status = "still running" if process.returncode is None else process.returncode
            raise SandboxError(
                f"sandbox {self.id} failed to start (exit status {status}): {self._stderr_tail()}"
            )

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._stderr += chunk
            del self._stderr[:-STDERR_KEPT]

    def _stderr_tail(self) -> str:
        text = self._stderr.decode(errors="replace").strip()
        return text[-2000:] or "no error output"

    async def close(self) -> None:
        """Kill every process of this sandbox, remove its socket and files. Idempotent."""
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if self.client is not None:
                await self.client.close()
            try:
                await self._terminate()
            finally:
                if self._stderr_reader is not None:
                    self._stderr_reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._stderr_reader
                await asyncio.to_thread(shutil.rmtree, self.dir, True)
                for held in self._held:
                    held.release()

    @abstractmethod
    async def _terminate(self) -> None:
        """Kill the sandbox's whole process tree and nothing else."""

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- tools -----------------------------------------------------------------------------------

    def _client(self) -> ActionClient:
        if self.client is None or self._closed:
            raise SandboxError(f"sandbox {self.id} is not running")
        return self.client

    async def call(self, action: str, **args: Any) -> dict[str, Any]:
        timeout_s = float(args.get("timeout_s") or self.limits.action_timeout_s)
        return await self._client().call(action, args, deadline_s=timeout_s + ANSWER_GRACE_S)

    async def bash(self, command: str, timeout_s: float | None = None) -> BashResult:
        result = await self.call(
            "bash", command=command, timeout_s=timeout_s or self.limits.action_timeout_s
        )
        bash = BashResult(**result)
        if note := self._take_note():
            bash = dataclasses.replace(bash, note=f"{note}; {bash.note}" if bash.note else note)
        return bash

    def _take_note(self) -> str | None:
        note, self.note = self.note, None
        return note

    async def exec(
        self,
        argv: list[str],
        stdin: str = "",
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        """Run ``argv`` as a fresh process in the sandbox, not in the agent's shell: no pty,
        ``env`` alone (with PATH, HOME and a UTF-8 locale by default), ``stdin`` piped in, and
        the exit status from the kernel. What a judge runs goes through here."""
        args: dict[str, Any] = {"argv": argv, "stdin": stdin, "cwd": cwd, "env": env}
        args["timeout_s"] = timeout_s or self.limits.action_timeout_s
        if max_output is not None:
            args["max_output"] = max_output
        return ExecResult(**await self.call("exec", **args))

    async def ipython(self, code: str, timeout_s: float | None = None) -> IPythonResult:
        result = await self.call(
            "ipython", code=code, timeout_s=timeout_s or self.limits.action_timeout_s
        )
        return IPythonResult(**result, note=self._take_note())

    async def editor(self, command: str, path: str, **args: Any) -> str:
        result = await self.call("editor", command=command, path=path, **args)
        return str(result["output"])

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes; ToolError if it holds more than ``max_bytes`` (default: the action
        server's limit on a file, 64 MiB)."""
        result = await self.call("read_file", path=path, max_bytes=max_bytes)
        if result["encoding"] == "base64":
            return base64.b64decode(result["content"])
        return str(result["content"]).encode()

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else data
        await self.call(
            "write_file",
            path=path,
            content=base64.b64encode(raw).decode(),
            encoding="base64",
            mode=mode,
        )

    async def upload(self, source: Path, dest: str) -> None:
        """Copy a host file or directory into the sandbox, to ``dest`` (a directory)."""
        data = await asyncio.to_thread(_tar, source)
        await self.call("upload", dest=dest, tar_b64=base64.b64encode(data).decode())

    async def expose(
        self,
        handler: RelayHandler,
        port: int = 0,
        timeout_s: float = 600.0,
        *,
        token: str | None = None,
        max_body_bytes: int = RELAY_MAX_BODY_BYTES,
    ) -> int:
        """Serve HTTP on ``127.0.0.1:PORT`` inside the sandbox with ``handler`` (run here, on
        the host) and return PORT (``port``, or a free one for 0). The sandbox keeps no network:
        each request goes over the action server's connection. A request that ``handler`` does
        not answer within ``timeout_s`` gets a 504, one where it raises a 502. With ``token``,
        only requests with ``Authorization: Bearer <token>`` reach the handler: the others get a
        401 before their body is read (see inside/relay.py). A body over ``max_body_bytes``
        gets a 413. Calling it again replaces the handler, token and cap (the port stays).
        """
        client = self._client()
        client.set_relay(handler, timeout_s, token=token, max_body_bytes=max_body_bytes)
        # The server's own deadline is a little later, so that the host's 504 is what arrives.
        args: dict[str, Any] = {"port": port, "timeout_s": timeout_s + 5.0, "token": token}
        args["max_body"] = max_body_bytes
        result = await client.call("expose_gateway", args, deadline_s=self.limits.start_timeout_s)
        return int(result["port"])

    async def open_egress(
        self,
        policy: EgressPolicy,
        caps: EgressCaps | None = None,
        *,
        resolve: Resolver = system_resolver,
    ) -> int:
        """Serve raas's HTTPS proxy on ``127.0.0.1:PORT`` inside the sandbox and return PORT
        (``proxy_env(PORT)`` sends HTTP clients there). The sandbox keeps no network: each
        connection to PORT is carried by the host (raas.sandbox.proxy), which tunnels it to a
        destination ``policy`` allows, within ``caps``; ``self.egress.meter`` counts what it
        did. Once per sandbox; a fork has none of its parent's."""
        if self.egress is not None:
            raise SandboxError(f"sandbox {self.id} has its egress proxy already")
        client = self._client()
        egress = Egress(policy, caps or EgressCaps(), resolve, label=f"sandbox {self.id}")

        async def carry(tunnel_id: int) -> None:
            await egress.carry(
                lambda: client.open_tunnel(tunnel_id), lambda: client.refuse_tunnel(tunnel_id)
            )

        client.set_tunnels(carry)
        args = {"port": 0, "max_tunnels": egress.caps.max_tunnels}
        result = await client.call("expose_proxy", args, deadline_s=self.limits.start_timeout_s)
        self.egress = egress
        return int(result["port"])

    async def download(self, path: str, dest: Path) -> None:
        """Copy a sandbox file or directory into the host directory ``dest``."""
        result = await self.call("download", path=path)
        await asyncio.to_thread(_untar, base64.b64decode(result["tar_b64"]), dest)


class SharedHold:
    """A resource entered once and left when the last sandbox that shares it lets it go."""

    def __init__(self, resource: contextlib.AbstractContextManager[Any]) -> None:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(resource)
        self._count = 1

    def share(self) -> SharedHold:
        self._count += 1
        return self

    def release(self) -> None:
        self._count -= 1
        if self._count == 0:
            self._stack.close()


async def reap(process: Launched, timeout_s: float) -> bool:
    """Wait for ``process`` to exit, at most ``timeout_s``; False if it is still running."""
    try:
        await asyncio.wait_for(process.wait(), timeout=timeout_s)
    except TimeoutError:
        return False
    return True


def _tar(source: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(source, arcname=source.name)
    return buf.getvalue()


def _untar(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def warn_unisolated() -> None:
    message = (
        "raas: the 'local' sandbox provider has NO isolation: agent commands run as this user,"
        " with this machine's files and network. Use it for development only."
    )
    log.warning(message)
    print(message, file=sys.stderr)
