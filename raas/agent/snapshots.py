"""Per-turn snapshots of agent jobs, for branching (``RolloutRequest.branch``).

A job submitted with ``sampling_params.keep_snapshots: N`` has its state kept after each turn
that the loop goes on from: a copy of its trajectory (token ids, loss mask, logprobs, turn
records and conversation) and a fork of its sandbox, idle (nothing runs in it but its own
action server and shell). A branch forks that fork again, so one snapshot serves any number of
branches. A fork copies the sandbox's files exactly (``Sandbox.fork``), and a live fork is what
forks fastest, so the snapshot is one rather than the copied files on disk.

Bounds: at most N snapshots a job (its oldest turns evicted first) and ``max_total`` on the
server (the oldest of all evicted first). A snapshot's files lie in its own tmpfs mounts, each
capped by the sandbox limits (``disk_bytes``, ``tmp_bytes``), so the count bounds the memory
and disk they take too. Every snapshot is closed when the server stops; after a crash the
sandbox runtime's own clean-up finds them as it finds any sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from raas.sandbox import Sandbox
from raas.wire import Trajectory

log = logging.getLogger(__name__)

# Jobs whose snapshot history (how many turns, which were evicted) is remembered, so that a
# branch from an evicted turn says so; beyond this the oldest job is forgotten.
REMEMBERED_JOBS = 10_000


@dataclass
class Snapshot:
    job_id: str
    turn: int  # the number of turns done (1-based)
    trajectory: Trajectory  # a copy of the job's trajectory after that turn
    instance: dict[str, Any]
    sandbox: Sandbox | None  # an idle fork of the job's sandbox (None: the job had none)
    context: Any = None  # the job's task context (what a fork of it carries besides files)


@dataclass
class _JobSnapshots:
    kept: dict[int, Snapshot] = field(default_factory=dict)
    last_turn: int = 0


class SnapshotMissing(LookupError):
    """A branch names what is not kept; ``field`` is ``job_id`` or ``turn``."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name
        self.message = message


class Snapshots:
    """The snapshots kept on this server, by job and turn, oldest first."""

    def __init__(self, max_total: int = 64) -> None:
        self.max_total = max_total
        self._jobs: OrderedDict[str, _JobSnapshots] = OrderedDict()
        self._order: OrderedDict[tuple[str, int], Snapshot] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._order)

    def add(self, snapshot: Snapshot, per_job: int) -> None:
        """Keep ``snapshot``; the job's oldest beyond ``per_job`` and the server's oldest beyond
        ``max_total`` are evicted (their sandboxes closed in the background)."""
        entry = self._jobs.get(snapshot.job_id)
        if entry is None:
            entry = self._jobs[snapshot.job_id] = _JobSnapshots()
            while len(self._jobs) > REMEMBERED_JOBS:
                self._forget(next(iter(self._jobs)))
        key = (snapshot.job_id, snapshot.turn)
        old = self._order.pop(key, None)  # a job run again after an infra failure
        if old is not None:
            self._close(old)
        entry.kept[snapshot.turn] = snapshot
        entry.last_turn = max(entry.last_turn, snapshot.turn)
        self._order[key] = snapshot
        while len(entry.kept) > per_job:
            self._evict(snapshot.job_id, min(entry.kept))
        while len(self._order) > self.max_total:
            self._evict(*next(iter(self._order)))

    def get(self, job_id: str, turn: int) -> Snapshot:
        """The snapshot of ``job_id`` after ``turn``; SnapshotMissing names what is not kept."""
        entry = self._jobs.get(job_id)
        if entry is None:
            raise SnapshotMissing(
                "job_id",
                f"job {job_id} kept no snapshots (submit it with sampling_params.keep_snapshots)",
            )
        snapshot = entry.kept.get(turn)
        if snapshot is not None:
            return snapshot
        if turn > entry.last_turn:
            raise SnapshotMissing(
                "turn",
                f"job {job_id} has snapshots of turns 1..{entry.last_turn} at most; turn {turn}"
                " is beyond them (no snapshot is kept after a job's last turn)",
            )
        kept = ", ".join(map(str, sorted(entry.kept))) or "none"
        raise SnapshotMissing(
            "turn", f"the snapshot of turn {turn} of job {job_id} was evicted (kept: {kept})"
        )

    def drop(self, job_id: str) -> None:
        """Forget ``job_id``'s snapshots (an attempt that runs again makes new ones: what an
        earlier attempt kept is of another trajectory)."""
        if job_id in self._jobs:
            self._forget(job_id)

    def _evict(self, job_id: str, turn: int) -> None:
        entry = self._jobs[job_id]
        snapshot = entry.kept.pop(turn)
        del self._order[(job_id, turn)]
        self._close(snapshot)

    def _forget(self, job_id: str) -> None:
        entry = self._jobs.pop(job_id)
        for turn in list(entry.kept):
            self._close(self._order.pop((job_id, turn)))

    def _close(self, snapshot: Snapshot) -> None:
        if snapshot.sandbox is None:
            return
        task = asyncio.get_running_loop().create_task(_close_quietly(snapshot.sandbox))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every snapshot's sandbox (the server stops); the job history is forgotten."""
        snapshots = list(self._order.values())
        self._order.clear()
        self._jobs.clear()
        for snapshot in snapshots:
            self._close(snapshot)
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)


async def _close_quietly(sandbox: Sandbox) -> None:
    try:
        await sandbox.close()
    except Exception:
        log.exception("closing a snapshot's sandbox failed")
