"""Durable turn boundaries: what an agent job writes at the end of each turn, and how a job
found unfinished after a crash resumes from the last one (``--checkpoint``).

At a turn boundary (the model's reply and the tools' observations appended) the job's
``Checkpointer`` takes the trajectory's new part (the tokens, turn records and messages since
the last checkpoint: small) at once, and starts writing the checkpoint in the background: the
sandbox's workspace changes as an archive (raas.sandbox.checkpoint), its shell's directory and
exported variables as data, what ran there that cannot come back, then one row in the result
store (``CheckpointBook``). The next model call never waits for it; the next turn's tools do,
but only for the sandbox to be read (the model's generation usually hides it), never for the
disk. A row is written only once its archive is synced, so a checkpoint half-written at a crash
is no row, and the job resumes from the one before.

Resuming (``resume_point``): the rows must chain from the start (each goes on from the turn the
one before ended at), and each archive of the chain must hash as its row says; the latest turn
for which both hold is the point. Every row carries a fingerprint of what shapes the rollout
(the request, the tools, the prompt, the tokenizer that names the model): where any part
differs now, the job runs from the start and its result names what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raas.sandbox import Sandbox
from raas.sandbox.checkpoint import CheckpointTooLarge, shell_data, shell_of
from raas.sandbox.copies import file_sha256
from raas.sandbox.fork import ShellState
from raas.wire import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnCheckpoint:
    """One durable turn boundary of a job: the trajectory's part from turn ``from_turn`` to
    ``turn``, and where the workspace's archive of that turn lies (``archive``, a name in the
    job's directory; None where the job has no sandbox) with the turn its chain starts at
    (``base``: that archive holds every file, the later ones the changes)."""

    job_id: str
    from_turn: int
    turn: int
    fingerprint: dict[str, str]
    delta: dict[str, Any]
    base: int | None = None
    archive: str | None = None
    size: int = 0
    sha256: str | None = None
    shell: dict[str, Any] | None = None
    lost: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)


class CheckpointBook(Protocol):
    """Where checkpoints are kept (the result store is one): a directory of raas's own a job for
    its archives, and rows."""

    def job_dir(self, job_id: str) -> Path:
        """The job's directory (made 0700, checked to be raas's own, at each call)."""
        ...

    async def add_checkpoint(self, checkpoint: TurnCheckpoint) -> None:
        """Keep ``checkpoint`` (the rows after its ``from_turn`` go: another run's)."""
        ...

    async def checkpoints(self, job_id: str) -> list[TurnCheckpoint]:
        """The job's rows, by turn."""
        ...


# -- the trajectory's parts ----------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """How much of a trajectory a checkpoint has written."""

    response: int = 0
    turns: int = 0
    messages: int = 0

    @classmethod
    def of(cls, trajectory: Trajectory) -> Mark:
        t = trajectory
        return cls(len(t.response_ids), len(t.turns), len(t.messages))


def delta(trajectory: Trajectory, since: Mark) -> dict[str, Any]:
    """The part of ``trajectory`` after ``since`` (the prompt too, from the start), as data."""
    t, n = trajectory, since.response
    part: dict[str, Any] = {
        "response_ids": t.response_ids[n:],
        "loss_mask": t.loss_mask[n:],
        "logprobs": t.logprobs[n:],
        "turns": [dict(turn) for turn in t.turns[since.turns :]],
        "messages": [dict(m) for m in t.messages[since.messages :]],
    }
    if since == Mark():
        part["prompt_ids"] = list(t.prompt_ids)
    return part


def rebuild(deltas: Sequence[Mapping[str, Any]]) -> Trajectory:
    """The trajectory that ``deltas`` (from the start, in order) make; ValueError where they do
    not make a sound one."""
    data: dict[str, list[Any]] = {
        "prompt_ids": [],
        "response_ids": [],
        "loss_mask": [],
        "logprobs": [],
        "turns": [],
        "messages": [],
    }
    for part in deltas:
        for name, values in data.items():
            values.extend(part.get(name, []))
    trajectory = Trajectory.model_validate(data)
    problem = trajectory.invariant_error()
    if problem is not None or not trajectory.prompt_ids:
        raise ValueError(f"the checkpoints' trajectory is not sound: {problem or 'no prompt'}")
    return trajectory


# -- fingerprints --------------------------------------------------------------------------------


def fingerprint(parts: Mapping[str, Any]) -> dict[str, str]:
    """A hash of each part of what shapes a rollout, by its name."""
    return {
        name: hashlib.sha256(
            json.dumps(value, sort_keys=True, default=str, separators=(",", ":")).encode()
        ).hexdigest()[:32]
        for name, value in parts.items()
    }


def changed(saved: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The parts whose hash differs (or that one of the two lacks)."""
    return sorted(name for name in {*saved, *now} if saved.get(name) != now.get(name))


# -- resuming ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumePoint:
    """Where a job goes on from: ``turn`` turns done, their trajectory, the archives that make
    the workspace of that turn (oldest first), the shell's state, and what could not be kept."""

    turn: int
    trajectory: Trajectory
    archives: tuple[Path, ...]
    shell: ShellState | None
    lost: tuple[str, ...]


def resume_point(
    rows: Sequence[TurnCheckpoint], now: Mapping[str, str], job_dir: Path, files: bool
) -> tuple[ResumePoint | None, str | None]:
    """The latest turn of ``rows`` a job can go on from, or None and why not (None, None: no
    checkpoint at all). ``now``: the rollout's fingerprint today; ``files``: whether the new
    sandbox can take the archives. Reads and hashes archives: run it in a thread."""
    chain = _chained(rows)
    if not chain:
        return None, None
    differ = changed(chain[-1].fingerprint, now)
    if differ:
        return None, (
            f"what shapes the rollout changed since its checkpoints ({', '.join(differ)}):"
            " it ran from the start"
        )
    problems: list[str] = []
    for end in range(len(chain), 0, -1):
        point = _point(chain[:end], job_dir, files, problems)
        if point is not None:
            return point, None
    why = "; ".join(problems[:3])
    return None, f"its checkpoints could not be used ({why}): it ran from the start"


def _chained(rows: Sequence[TurnCheckpoint]) -> list[TurnCheckpoint]:
    """The rows that follow on from the start, each from where the one before ended."""
    chain: list[TurnCheckpoint] = []
    at = 0
    for row in sorted(rows, key=lambda r: r.turn):
        if row.from_turn != at or row.turn <= at:
            break
        chain.append(row)
        at = row.turn
    return chain


def _point(
    chain: Sequence[TurnCheckpoint], job_dir: Path, files: bool, problems: list[str]
) -> ResumePoint | None:
    """The point at ``chain``'s last turn, or None (and why, in ``problems``)."""
    last = chain[-1]
    archives: list[Path] = []
    if last.base is not None:  # the job had a sandbox: its workspace's chain
        if not files:
            problems.append("the new sandbox cannot take the workspace's files")
            return None
        # The archives of the last one's chain: its first holds every file; each later turn
        # has one of its changes, or none where the workspace had not changed.
        tail = [row for row in chain if row.turn >= last.base]
        if not tail or tail[0].turn != last.base:
            problems.append(f"the first archive of turn {last.turn}'s chain is missing")
            return None
        for row in tail:
            if row.base != last.base or (row.archive is None and row is tail[0]):
                problems.append(f"turn {row.turn} is not of turn {last.turn}'s chain")
                return None
            if row.archive is None:  # the workspace had not changed since the row before
                continue
            path = job_dir / row.archive
            if not _sound(path, row.sha256):
                problems.append(f"the archive of turn {row.turn} is missing or does not hash")
                return None
            archives.append(path)
    try:
        trajectory = rebuild([row.delta for row in chain])
    except (ValueError, TypeError) as e:
        problems.append(str(e))
        return None
    shell = shell_of(last.shell)
    return ResumePoint(last.turn, trajectory, tuple(archives), shell, tuple(last.lost))


def _sound(path: Path, sha256: str | None) -> bool:
    """Whether ``path`` is a file (no link) that hashes as ``sha256``."""
    try:
        return path.is_file() and not path.is_symlink() and file_sha256(path) == sha256
    except OSError:
        return False


# -- writing -------------------------------------------------------------------------------------


@dataclass
class CheckpointStats:
    """What a job's checkpoints cost: how many, the bytes of their archives, the time the loop
    waited for them (the turn boundary's own work, and tools held while the sandbox was read),
    and the time their writing took in the background."""

    written: int = 0
    bytes: int = 0
    loop_s: float = 0.0
    write_s: float = 0.0
    stopped: str | None = None  # why this job's checkpoints stopped (a cap, a failure)

    def data(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "bytes": self.bytes,
            "loop_s": round(self.loop_s, 6),
            "write_s": round(self.write_s, 6),
            "stopped": self.stopped,
        }


class Checkpointer:
    """A job's checkpoints through one RUN: ``after_turn`` at each turn boundary (the loop's
    hook), ``before_tools`` before the next turn's tools, ``close`` at the end."""

    def __init__(
        self,
        book: CheckpointBook,
        job_id: str,
        fingerprint: dict[str, str],
        sandbox: Sandbox | None,
        trajectory: Trajectory,
        *,
        every: int = 1,
        max_bytes: int = 256 << 20,
    ) -> None:
        self.book, self.job_id, self.fingerprint = book, job_id, fingerprint
        self.sandbox = sandbox
        self.every, self.max_bytes = every, max_bytes
        self.stats = CheckpointStats()
        self._mark = Mark.of(trajectory)
        self._turn = len(trajectory.turns)  # a resumed run goes on from its turns
        self._snar: Path | None = None  # the chain's tar state; a run starts a chain of its own
        self._base: int | None = None
        self._signature: str | None = None  # the workspace's at the last checkpoint
        self._reading: asyncio.Event | None = None
        self._last: asyncio.Task[None] | None = None

    async def after_turn(self, turns: int, trajectory: Trajectory) -> None:
        if self.stats.stopped is not None or turns % self.every:
            return
        started = time.perf_counter()
        part = delta(trajectory, self._mark)
        from_turn = self._turn
        self._mark, self._turn = Mark.of(trajectory), turns
        reading, read_before = asyncio.Event(), self._reading
        self._reading = reading
        self._last = asyncio.create_task(
            self._write(from_turn, turns, part, reading, read_before, self._last),
            name=f"raas-checkpoint-{self.job_id}-{turns}",
        )
        self.stats.loop_s += time.perf_counter() - started

    async def before_tools(self) -> None:
        """Wait until the last checkpoint has read the sandbox (the tools would change it)."""
        reading = self._reading
        if reading is not None and not reading.is_set():
            started = time.perf_counter()
            await reading.wait()
            self.stats.loop_s += time.perf_counter() - started

    async def close(self, abandon: bool = False) -> None:
        """Wait for the last checkpoint's row (the run ends: its result or EVAL comes next);
        ``abandon``: cancel it instead (the run is being cancelled: a timeout, a shutdown)."""
        last = self._last
        if last is None:
            return
        if abandon:
            last.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await last

    async def _write(
        self,
        from_turn: int,
        turn: int,
        part: dict[str, Any],
        reading: asyncio.Event,
        read_before: asyncio.Event | None,
        before: asyncio.Task[None] | None,
    ) -> None:
        started = time.perf_counter()
        try:
            if read_before is not None:  # one read of the sandbox at a time, in turn order
                await read_before.wait()
            row = await self._capture(from_turn, turn, part, reading)
            if before is not None:  # rows in turn order
                with contextlib.suppress(Exception):
                    await before
            if row is not None and self.stats.stopped is None:
                await self.book.add_checkpoint(row)
                self.stats.written += 1
                self.stats.bytes += row.size
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._stop(f"a checkpoint could not be written: {type(e).__name__}: {e}")
        finally:
            reading.set()
            self.stats.write_s += time.perf_counter() - started

    async def _capture(
        self, from_turn: int, turn: int, part: dict[str, Any], reading: asyncio.Event
    ) -> TurnCheckpoint | None:
        row = TurnCheckpoint(self.job_id, from_turn, turn, self.fingerprint, part)
        sandbox = self.sandbox
        if sandbox is None:
            reading.set()  # no sandbox to read: the next tools need not wait for the row
            return row
        try:
            job_dir = await asyncio.to_thread(self.book.job_dir, self.job_id)
            if self._snar is None:
                self._snar = job_dir / f"chain-{secrets.token_hex(6)}.snar"
                self._base = turn
            name = f"turn-{turn}-{secrets.token_hex(6)}.tar"
            left = self.max_bytes - self.stats.bytes
            made = await sandbox.checkpoint(
                self._snar, job_dir / name, max(left, 0), unchanged=self._signature
            )
            self._signature = made.signature
        except CheckpointTooLarge as e:
            self._stop(f"{e} (checkpoint_max_mb): later turns of this job are not checkpointed")
            return None
        finally:
            reading.set()
        return TurnCheckpoint(
            self.job_id,
            from_turn,
            turn,
            self.fingerprint,
            part,
            self._base,
            None if made.archive is None else name,  # None: the workspace did not change
            made.size,
            made.sha256,
            shell_data(made.shell),
            list(made.lost),
        )

    def _stop(self, why: str) -> None:
        if self.stats.stopped is None:
            self.stats.stopped = why
            log.warning("job %s: %s", self.job_id, why)
