"""Per-turn snapshots of agent jobs, for branching (``RolloutRequest.branch``).

A job submitted with ``sampling_params.keep_snapshots: N`` has its state kept after each turn
that the loop goes on from: a copy of its trajectory (token ids, loss mask, logprobs, turn
records and conversation) and a fork of its sandbox, idle (nothing runs in it but its own
action server and shell). A branch forks that fork again, so one snapshot serves any number of
branches. A fork copies the sandbox's files exactly (``Sandbox.fork``), and a live fork is what
forks fastest, so the snapshot is one rather than the copied files on disk.

Bounds: at most N snapshots a job (its oldest turns evicted first) and ``max_total`` an owner
(a tenant: its oldest evicted first), lowered for an owner by what ``bind``'s ``allowed`` says
(the pipeline's: the tenant's ``max_snapshots``, and what its ``max_sandboxes`` leaves beside
its jobs' own sandboxes, since a kept snapshot is a live sandbox). An owner's snapshots are
evicted only for its own new ones, never for another's: one tenant's jobs cannot take away
the turn another branches from. A snapshot's files lie in its own tmpfs mounts, each
capped by the sandbox limits (``disk_bytes``, ``tmp_bytes``), so the count bounds the memory
and disk they take too. Every snapshot is closed when the server stops; after a crash the
sandbox runtime's own clean-up finds them as it finds any sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
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


def _one_owner(job_id: str) -> str:
    return ""


class Snapshots:
    """The snapshots kept on this server, by job and turn, oldest first."""

    def __init__(self, max_total: int = 64) -> None:
        self.max_total = max_total  # an owner's at most (a server without tenants: all)
        self._jobs: OrderedDict[str, _JobSnapshots] = OrderedDict()
        self._order: OrderedDict[tuple[str, int], Snapshot] = OrderedDict()
        self._kept: Counter[str] = Counter()  # snapshots per owner
        self._closing: set[asyncio.Task[None]] = set()
        self._owner: Callable[[str], str] = _one_owner
        self._allowed: Callable[[str], int | None] = lambda owner: None
        self._freed: Callable[[str], None] = lambda owner: None

    def __len__(self) -> int:
        return len(self._order)

    def bind(
        self,
        owner: Callable[[str], str],
        allowed: Callable[[str], int | None],
        freed: Callable[[str], None],
    ) -> None:
        """Whose each job is (``owner`` of a job id), how many snapshots an owner may keep now
        besides ``max_total`` (``allowed``; None: no other bound), and whom to tell when one of
        an owner's goes (``freed``: its quota has room again). The pipeline binds its tenants."""
        self._owner, self._allowed, self._freed = owner, allowed, freed

    def held(self, owner: str) -> int:
        """The snapshots ``owner`` keeps now (each an idle sandbox)."""
        return self._kept[owner]

    def add(self, snapshot: Snapshot, per_job: int) -> None:
        """Keep ``snapshot``; the job's oldest beyond ``per_job`` and its owner's oldest beyond
        what the owner may keep are evicted (their sandboxes closed in the background): where
        the owner may keep none, ``snapshot`` itself is, at once. No other owner's is touched."""
        owner = self._owner(snapshot.job_id)
        entry = self._jobs.get(snapshot.job_id)
        if entry is None:
            entry = self._jobs[snapshot.job_id] = _JobSnapshots()
            while len(self._jobs) > REMEMBERED_JOBS:
                forgettable = self._forgettable(owner, snapshot.job_id)
                if forgettable is None:  # every other job keeps another owner's: remember all
                    break
                self._forget(forgettable)
        key = (snapshot.job_id, snapshot.turn)
        old = self._order.pop(key, None)  # a job run again after an infra failure
        if old is not None:
            self._kept[owner] -= 1
            self._close(old)
        entry.kept[snapshot.turn] = snapshot
        entry.last_turn = max(entry.last_turn, snapshot.turn)
        self._order[key] = snapshot
        self._kept[owner] += 1
        while len(entry.kept) > per_job:
            self._evict(snapshot.job_id, min(entry.kept))
        allowed = self._allowed(owner)
        cap = self.max_total if allowed is None else min(self.max_total, max(0, allowed))
        while self._kept[owner] > cap:
            self._evict(*next(k for k in self._order if self._owner(k[0]) == owner))

    def _forgettable(self, owner: str, new: str) -> str | None:
        """The job whose history goes when too many are remembered (never ``new``): the oldest
        that keeps no snapshot, else ``owner``'s oldest (never a snapshot of another owner's)."""
        for job_id, entry in self._jobs.items():
            if not entry.kept and job_id != new:
                return job_id
        return next((j for j in self._jobs if j != new and self._owner(j) == owner), None)

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
        self._gone(job_id, 1)
        self._close(snapshot)

    def _forget(self, job_id: str) -> None:
        entry = self._jobs.pop(job_id)
        for turn in list(entry.kept):
            self._close(self._order.pop((job_id, turn)))
        self._gone(job_id, len(entry.kept))

    def _gone(self, job_id: str, n: int) -> None:
        if n:
            owner = self._owner(job_id)
            self._kept[owner] -= n
            self._freed(owner)

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
        self._kept.clear()
        for snapshot in snapshots:
            self._close(snapshot)
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)


async def _close_quietly(sandbox: Sandbox) -> None:
    try:
        await sandbox.close()
    except Exception:
        log.exception("closing a snapshot's sandbox failed")
