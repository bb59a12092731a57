"""raas servers on a Ray cluster: one ``raas serve`` per node (or N spread over the nodes).

Each server is a child process of a small Ray actor pinned to its node (node-affinity
scheduling), bound to the node's IP on a free port, so a trainer anywhere in the cluster can
reach it. ``check()`` health-checks every server the way the trainer sees it (``GET /healthz``
on its URL) and repairs what died: a dead ``raas serve`` is restarted by its actor, a dead actor
is replaced on the same node. A restarted server keeps its database (finished results stay
readable; jobs it had in flight are reported ``server_restart``) and its port when that is
still free, so the URL the trainer holds usually stays valid.

Ray is optional: this module imports it only when used (``pip install 'raas[ray]'``). Every node
needs the same environment as the driver, with raas installed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from raas.helpers.children import guarded, terminate
from raas.helpers.ports import free_port, port_free
from raas.helpers.readiness import NotReady, exited, wait_until_answers
from raas.helpers.server_list import write_server_list
from raas.paths import ENV_PREFIX
from raas.settings import PER_SERVER, SettingsError, to_flags, validate

log = logging.getLogger(__name__)

RAY_MISSING = "raas's Ray deployment needs Ray, which is not installed: pip install 'raas[ray]'"


class RayNotInstalled(ImportError):
    pass


class DeploymentError(RuntimeError):
    pass


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayNotInstalled(RAY_MISSING) from e
    return ray


def serve_args(options: Mapping[str, Any]) -> list[str]:
    """``raas serve`` flags for settings named like ``ServeSettings`` fields (``run_workers``,
    ``llm`` as a list, ...), checked here so that a typo fails on the driver, not on every node."""
    reserved = PER_SERVER & set(options)
    if reserved:
        raise DeploymentError(f"the deployment sets {sorted(reserved)} itself; leave them out")
    try:
        flags = to_flags(options)  # an unknown option first, named as a flag
        validate(options)
    except SettingsError as e:
        raise DeploymentError(str(e)) from e
    return flags


@dataclass(frozen=True)
class ServerInfo:
    url: str
    pid: int
    node_id: str
    returncode: int | None  # None while raas serve runs
    starts: int


class ServerHost:
    """The body of the Ray actor: one ``raas serve`` child on this node."""

    def __init__(
        self,
        args: list[str],
        db: str,
        log_path: str,
        host: str | None,
        port: int | None,
        env: dict[str, str],
        ready_timeout_s: float,
    ) -> None:
        ray = import_ray()
        self.ip: str = ray.util.get_node_ip_address()
        self.node_id: str = ray.get_runtime_context().get_node_id()
        self.bind_host = host or self.ip
        self.args, self.db, self.log_path = args, db, Path(log_path)
        self.env = {**os.environ, **env}
        self.ready_timeout_s = ready_timeout_s
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        self._start(port)

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    def _start(self, port: int | None) -> None:
        # The previous port first (the trainer's URL stays valid), a fresh one when it is taken.
        candidates = [port] if port and port_free(self.bind_host, port) else []
        candidates += [free_port(self.bind_host), free_port(self.bind_host)]
        error = ""
        for p in candidates:
            self.port = p
            self.starts += 1
            with open(self.log_path, "a") as logf:
                logf.write(f"--- start {self.starts} on {self.bind_host}:{p}\n")
                logf.flush()
                command = [sys.executable, "-m", "raas", "serve", *self.args]
                command += ["--host", self.bind_host, "--port", str(p), "--db", self.db]
                self.proc = subprocess.Popen(
                    guarded(command), stdout=logf, stderr=subprocess.STDOUT, env=self.env
                )
            error = self._wait_ready()
            if not error:
                return
        raise DeploymentError(f"raas serve did not start on {self.ip}: {error}")

    def _wait_ready(self) -> str:
        assert self.proc is not None
        try:
            wait_until_answers(
                self.url + "/healthz", self.ready_timeout_s, exited(self.proc, self.log_path)
            )
        except NotReady as e:
            self._terminate(5.0)
            return f"{e} (log {self.log_path})"
        return ""

    def _terminate(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        return terminate(self.proc, timeout_s)

    def info(self) -> ServerInfo:
        assert self.proc is not None
        return ServerInfo(self.url, self.proc.pid, self.node_id, self.proc.poll(), self.starts)

    def restart(self, grace_s: float) -> ServerInfo:
        self._terminate(grace_s)
        self._start(self.port)
        return self.info()

    def stop(self, timeout_s: float) -> int | None:
        return self._terminate(timeout_s)


# -- on the driver ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Repair:
    """What ``check()`` did to one server: ``new_url`` None when it is gone (its node left, or
    the restart failed; the next check tries again), ``old_url`` None for a new node's server."""

    slot: int
    reason: str
    old_url: str | None
    new_url: str | None


@dataclass
class _Slot:
    index: int
    node_id: str
    actor: Any = None
    info: ServerInfo | None = None
    failed_checks: int = field(default=0)


class RayDeployment:
    """raas servers as Ray actors: ``start()``, ``urls()``, ``check()``, ``stop()``.

    ``options`` are ``raas serve`` settings by field name (``{"llm": [url], "run_workers": 16,
    "sandbox": "bwrap"}``); ``env`` is added to each server's environment. The servers listen
    on their nodes' addresses, so each needs an API key (``RAAS_API_KEY`` in ``env``, or
    ``options["api_key"]``, which goes there too, off the command lines that ps shows): without
    one a server refuses to start. Databases and logs go to ``workdir/name/`` on each
    node. With ``server_list``, the URLs are also written to that file (one a line, replaced in
    one rename whenever they change; ``raas.client.read_server_list`` reads it). ``num_cpus``
    is what each actor reserves in Ray's accounting: 0 by default, because the server's work
    happens in its own processes, which Ray does not count anyway.
    """

    def __init__(
        self,
        options: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | Path = "/tmp/raas-ray",
        server_list: str | Path | None = None,
        name: str = "raas",
        host: str | None = None,
        address: str | None = None,
        num_cpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        ready_timeout_s: float = 120.0,
        health_timeout_s: float = 5.0,
        max_failed_checks: int = 2,
        restart_grace_s: float = 5.0,
    ) -> None:
        options = dict(options or {})
        self.env = dict(env or {})
        if options.get("api_key") is not None:  # a flag would show it in ps on every node
            self.env[f"{ENV_PREFIX}API_KEY"] = str(options.pop("api_key"))
        self.args = serve_args(options)
        self.dir = Path(workdir) / name
        self.server_list = Path(server_list) if server_list is not None else None
        self.name, self.host, self.address = name, host, address
        self.num_cpus, self.resources = num_cpus, dict(resources or {})
        self.ready_timeout_s, self.health_timeout_s = ready_timeout_s, health_timeout_s
        self.max_failed_checks, self.restart_grace_s = max_failed_checks, restart_grace_s
        self.per_node: int | None = None  # set by start(): servers per node, or None for N total
        self._slots: list[_Slot] = []
        self._next = 0
        self._ray: Any = None
        self._actor_class: Any = None

    def __enter__(self) -> RayDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- public ----------------------------------------------------------------------------------

    def start(self, num_servers: int | None = None, per_node: int = 1) -> list[str]:
        """``num_servers`` spread round-robin over the alive nodes, or (the default) ``per_node``
        on every alive node, the ones that join later included (at ``check()``)."""
        ray = self._connect()
        if self._slots:
            raise DeploymentError("already started")
        nodes = self._alive_nodes()
        if not nodes:
            raise DeploymentError(f"no alive Ray node has the resources {self.resources}")
        if num_servers is None:
            self.per_node = per_node
            targets = [n for n in nodes for _ in range(per_node)]
        else:
            targets = [nodes[i % len(nodes)] for i in range(num_servers)]
        self._slots = [self._new_slot(node) for node in targets]
        for slot in self._slots:
            slot.actor = self._spawn(slot, None)
        try:
            infos = ray.get(
                [s.actor.info.remote() for s in self._slots], timeout=self.ready_timeout_s + 30
            )
        except Exception as e:
            self.stop(timeout_s=5.0)
            raise DeploymentError(f"raas servers did not start: {e}") from e
        for slot, info in zip(self._slots, infos, strict=True):
            slot.info = info
        log.info("raas servers up: %s", ", ".join(self.urls()))
        self._publish()
        return self.urls()

    def urls(self) -> list[str]:
        """The URLs of the servers as of the last ``start()`` or ``check()``."""
        return [s.info.url for s in self._slots if s.info is not None]

    def check(self) -> list[Repair]:
        """Health-check every server and repair what is down; returns what it did."""
        ray = self._connect()
        repairs = self._follow_nodes() if self.per_node is not None else []
        refs = {s.index: s.actor.info.remote() for s in self._slots if s.actor is not None}
        for slot in self._slots:
            problem = self._diagnose(slot, refs.get(slot.index))
            if problem is None:
                continue
            whole_actor, reason = problem
            old = slot.info.url if slot.info else None
            try:
                if whole_actor:
                    self._replace_actor(slot)
                else:
                    slot.info = ray.get(
                        slot.actor.restart.remote(self.restart_grace_s),
                        timeout=self.ready_timeout_s + 30,
                    )
                slot.failed_checks = 0
            except Exception as e:
                slot.info = None
                reason += f"; restart failed: {e}"
            new = slot.info.url if slot.info else None
            log.warning("raas server %d (%s): %s; now %s", slot.index, old, reason, new)
            repairs.append(Repair(slot.index, reason, old, new))
        if repairs:
            self._publish()
        return repairs

    def servers(self) -> list[ServerInfo]:
        """URL, node, pid of each server, as of the last ``start()`` or ``check()``."""
        return [s.info for s in self._slots if s.info is not None]

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM every server (it drains and persists), then remove the actors."""
        if not self._slots:
            return
        ray = self._connect()
        refs = [s.actor.stop.remote(timeout_s) for s in self._slots if s.actor is not None]
        deadline = time.monotonic() + timeout_s + 30
        for ref in refs:  # one by one: a dead actor's error must not cut the others' drain short
            with contextlib.suppress(Exception):
                ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
        for slot in self._slots:
            if slot.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(slot.actor, no_restart=True)
        self._slots = []
        if self.server_list is not None:
            self.server_list.unlink(missing_ok=True)

    # -- helpers ---------------------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._ray is None:
            ray = import_ray()
            if not ray.is_initialized():
                ray.init(address=self.address, log_to_driver=False)
            self._ray = ray
        return self._ray

    def _publish(self) -> None:
        if self.server_list is None:
            return
        write_server_list(self.server_list, self.urls())

    def _alive_nodes(self) -> list[str]:
        return [
            n["NodeID"]
            for n in self._ray.nodes()
            if n["Alive"] and all(n["Resources"].get(k, 0) >= v for k, v in self.resources.items())
        ]

    def _new_slot(self, node_id: str) -> _Slot:
        self._next += 1
        return _Slot(self._next - 1, node_id)

    def _spawn(self, slot: _Slot, port: int | None) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._actor_class is None:
            self._actor_class = self._ray.remote(ServerHost)
        return self._actor_class.options(
            num_cpus=self.num_cpus,
            resources=self.resources,
            # Hard affinity, also for N servers: Ray's SPREAD and soft affinity were seen to
            # put all of them on one node of a fresh cluster. A node that is gone is replaced
            # by check().
            scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
            max_restarts=0,  # check() replaces it, so that it can say so and update the URL
        ).remote(
            self.args,
            str(self.dir / f"server-{slot.index}.db"),
            str(self.dir / f"server-{slot.index}.log"),
            self.host,
            port,
            self.env,
            self.ready_timeout_s,
        )

    def _diagnose(self, slot: _Slot, ref: Any) -> tuple[bool, str] | None:
        """(replace the whole actor?, why) for a server that needs a restart, else None."""
        ray = self._ray
        if ref is None:
            return True, "no server (an earlier restart failed)"
        try:
            info: ServerInfo = ray.get(ref, timeout=self.health_timeout_s)
        except ray.exceptions.GetTimeoutError:
            return True, "its Ray actor does not answer"
        except ray.exceptions.RayError as e:
            return True, f"its Ray actor died ({type(e).__name__})"
        slot.info = info
        if info.returncode is not None:
            return False, f"raas serve exited with {info.returncode}"
        try:
            ok = httpx.get(info.url + "/healthz", timeout=self.health_timeout_s).status_code == 200
            error = "" if ok else "not 200"
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
        slot.failed_checks = slot.failed_checks + 1 if error else 0
        if slot.failed_checks >= self.max_failed_checks:
            return False, f"/healthz failed {slot.failed_checks} times in a row ({error})"
        return None

    def _replace_actor(self, slot: _Slot) -> None:
        port = int(slot.info.url.rsplit(":", 1)[1]) if slot.info else None
        if slot.actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(slot.actor, no_restart=True)
        alive = self._alive_nodes()
        if slot.node_id not in alive and alive:
            # Fixed-count mode only (per-node slots of a gone node were dropped): the least used.
            slot.node_id = min(alive, key=lambda n: sum(s.node_id == n for s in self._slots))
            port = None
        slot.actor, slot.info = None, None
        slot.actor = self._spawn(slot, port)
        slot.info = self._ray.get(slot.actor.info.remote(), timeout=self.ready_timeout_s + 30)

    def _follow_nodes(self) -> list[Repair]:
        """Per-node mode: drop the servers of nodes that left, start some on nodes that joined."""
        alive = self._alive_nodes()
        repairs: list[Repair] = []
        for slot in [s for s in self._slots if s.node_id not in alive]:
            with contextlib.suppress(Exception):
                self._ray.kill(slot.actor, no_restart=True)
            self._slots.remove(slot)
            old = slot.info.url if slot.info else None
            repairs.append(Repair(slot.index, "its node left the cluster", old, None))
        have = {s.node_id for s in self._slots}
        for node in [n for n in alive if n not in have]:
            for _ in range(self.per_node or 1):
                slot = self._new_slot(node)
                self._slots.append(slot)
                try:
                    slot.actor = self._spawn(slot, None)
                    slot.info = self._ray.get(
                        slot.actor.info.remote(), timeout=self.ready_timeout_s + 30
                    )
                    reason = "a node joined the cluster"
                except Exception as e:
                    reason = f"a node joined the cluster; start failed: {e}"
                new = slot.info.url if slot.info else None
                repairs.append(Repair(slot.index, reason, None, new))
        return repairs
