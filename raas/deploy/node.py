"""One node of a Slurm deployment: ``python -m raas.deploy.node``, run by srun on every node.

Starts this node's ``raas engine`` (with ``--engine-model``) and waits until it answers, then
``raas serve`` with this node's inference servers (``--llm`` URLs with ``{host}`` filled in), so
each server's rollouts stay on its own node. Once the server answers, its URL goes to
``SERVER_LIST.d/node-N.url``; node 0 gathers these into SERVER_LIST when every node has one,
with one rename, so a trainer never reads half a list.

Stopping: under srun, Slurm sends SIGTERM to every process of the step, the children included,
so this process only waits for them; forwarding it would be a second SIGTERM, which makes
``raas serve`` skip its drain. Only if they still run after the drain grace does it signal them
itself (someone signalled this process alone). Run by hand, it forwards: first to raas serve,
which drains while the engine still answers, then to the engine.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from raas.helpers.files import write_atomic
from raas.helpers.readiness import NotReady, exited, wait_until_answers
from raas.helpers.server_list import write_server_list
from raas.launch import ENGINE_PORT, ChildServer
from raas.settings import SettingsError, defaults, load_settings, parse_flags


class StartFailed(RuntimeError):
    pass


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m raas.deploy.node", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="Port of this node's raas serve.")
    p.add_argument("--server-list", type=Path, required=True)
    p.add_argument("--db-dir", type=Path, required=True)
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--llm", action="append", default=[], help="URL; {host} is this node.")
    p.add_argument("--engine-model")
    p.add_argument("--engine-port", type=int, default=ENGINE_PORT)
    p.add_argument("--ready-timeout-s", type=float, default=900.0)
    p.add_argument(
        "--expect-nodes",
        type=int,
        default=int(os.environ.get("SLURM_JOB_NUM_NODES", "1")),
        help="Servers node 0 waits for before it writes the list.",
    )
    p.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        help="-- then raas serve options (--drain-grace-s among them: this node waits as long)",
    )
    args = p.parse_args(argv)
    if args.serve_args[:1] == ["--"]:
        args.serve_args = args.serve_args[1:]
    return args


def drain_grace_s(serve_args: list[str]) -> float:
    """How long this node's raas serve drains: as it reads its settings (its flags, the
    environment, its --config file); settings it will refuse give the default (it exits)."""
    try:
        flags = parse_flags(serve_args, extra=("config",))
        config = flags.pop("config", None)
        return load_settings(Path(config) if config else None, flags).pipeline.drain_grace_s
    except SettingsError:
        return defaults().pipeline.drain_grace_s


class NodeRunner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.host = socket.gethostname()
        self.node_id = int(os.environ.get("SLURM_NODEID", "0"))
        self.job = os.environ.get("SLURM_JOB_ID", "local")
        self.under_slurm = "SLURM_STEP_ID" in os.environ or "SLURM_STEPID" in os.environ
        self.list_dir = Path(str(args.server_list) + ".d")
        self.own_file = self.list_dir / f"node-{self.node_id}.url"
        self.stopping = threading.Event()
        self.drain_grace_s = drain_grace_s(args.serve_args)
        self.engine: ChildServer | None = None
        self.serve: ChildServer | None = None

    def say(self, message: str) -> None:
        print(f"raas node {self.node_id} ({self.host}): {message}", flush=True)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping.is_set():
            self.say(f"{signal.Signals(signum).name}: stopping")
        self.stopping.set()

    # -- starting --------------------------------------------------------------------------------

    def _start(self, args: list[str], port: int, name: str, health: str) -> ChildServer:
        log = self.args.log_dir / f"raas-{self.job}-{self.host}-{name}.log"
        t0 = time.monotonic()
        child = ChildServer(args, log, dict(os.environ), port=port)
        timeout_s = self.args.ready_timeout_s
        try:
            answered = wait_until_answers(
                child.url + health, timeout_s, exited(child.proc, log, name), self.stopping, 0.2
            )
        except NotReady as e:
            child.stop(timeout_s=30.0)
            raise StartFailed(str(e)) from e
        if answered:
            self.say(f"{name} answers on port {port} ({time.monotonic() - t0:.1f} s)")
        return child

    def _serve_args(self) -> list[str]:
        a = self.args
        llm = [u.format(host=self.host) for u in a.llm]
        if a.engine_model:
            llm.append(f"http://{self.host}:{a.engine_port}")
        db = a.db_dir / f"raas-{self.host}.db"
        # Every interface: the trainer reaches the server by the node's name.
        args = ["serve", "--host", "0.0.0.0", "--db", str(db)]
        for url in llm:
            args += ["--llm", url]
        return [*args, *a.serve_args]

    def _publish(self) -> None:
        self.list_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.own_file, f"http://{self.host}:{self.args.port}\n")

    def _gather(self) -> None:
        """Node 0: the list, once every node's server answers (or until stopped)."""
        while not self.stopping.is_set() and self._children_alive():
            files = sorted(
                self.list_dir.glob("node-*.url"), key=lambda p: int(p.stem.split("-")[1])
            )
            if len(files) >= self.args.expect_nodes:
                write_server_list(self.args.server_list, [p.read_text() for p in files])
                self.say(f"{len(files)} servers listed in {self.args.server_list}")
                return
            self.stopping.wait(0.2)

    def _children_alive(self) -> bool:
        return all(c.proc.poll() is None for c in (self.engine, self.serve) if c is not None)

    # -- running and stopping --------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        a.log_dir.mkdir(parents=True, exist_ok=True)
        a.db_dir.mkdir(parents=True, exist_ok=True)
        failed = False
        try:
            if a.engine_model:
                # Every interface: the server reaches it by the node's name, as it would a
                # vLLM server, and a trainer can push weights to it (POST /update_weights).
                engine_args = ["engine", "--model", a.engine_model, "--host", "0.0.0.0"]
                self.engine = self._start(engine_args, a.engine_port, "engine", "/health")
            if not self.stopping.is_set():
                self.serve = self._start(self._serve_args(), a.port, "serve", "/healthz")
            if not self.stopping.is_set():
                self._publish()
                if self.node_id == 0:
                    self._gather()
            while not self.stopping.is_set():
                if not self._children_alive():
                    self.say("a server exited on its own: ending the deployment")
                    failed = True
                    break
                self.stopping.wait(0.5)
        except StartFailed as e:
            self.say(f"could not start: {e}")
            failed = True
        finally:
            self._unpublish(all_of_it=failed or self.node_id == 0)
            codes = self._stop_children()
        self.say(f"stopped ({', '.join(codes) or 'nothing was running'})")
        return 1 if failed else 0

    def _unpublish(self, all_of_it: bool) -> None:
        # A failing node takes the list down too: the job is ending.
        paths = [self.own_file, *([self.args.server_list] if all_of_it else [])]
        for p in paths:
            p.unlink(missing_ok=True)

    def _stop_children(self) -> list[str]:
        codes = []
        # raas serve first: it drains while the engine still answers its last turns.
        for name, child in (("serve", self.serve), ("engine", self.engine)):
            if child is None:
                continue
            grace = self.drain_grace_s + 10.0 if name == "serve" else 30.0
            if self.under_slurm and not self._wait(child, grace):
                self.say(f"{name} still runs {grace:g} s after the signal: stopping it")
            code = child.stop(timeout_s=grace)
            how = f"{code}" if code >= 0 else f"{code} ({signal.Signals(-code).name})"
            codes.append(f"{name} exited with {how}")
        return codes

    @staticmethod
    def _wait(child: ChildServer, timeout_s: float) -> bool:
        try:
            child.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False


def main(argv: list[str] | None = None) -> int:
    runner = NodeRunner(_parse(argv))
    signal.signal(signal.SIGTERM, runner.on_signal)
    signal.signal(signal.SIGINT, runner.on_signal)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
