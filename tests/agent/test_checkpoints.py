"""raas.agent.checkpoints: a trajectory's parts written at turn boundaries and rebuilt, the
fingerprint that refuses a changed rollout, which turn a job resumes at, and the Checkpointer's
order of work (the loop never waits for the disk; the tools wait for the sandbox's read)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from raas.agent.checkpoints import (
    Checkpointer,
    Mark,
    TurnCheckpoint,
    changed,
    delta,
    fingerprint,
    rebuild,
    resume_point,
)
from raas.sandbox.checkpoint import Checkpointed
from raas.sandbox.fork import ShellState
from raas.wire import Trajectory

PRINT = fingerprint({"task": "code", "sampling_params": {"temperature": 1.0}})


def grown(turns: int) -> list[Trajectory]:
    """A trajectory after each of ``turns`` turns (a copy each): generated, then inserted."""
    t = Trajectory(prompt_ids=[1, 2, 3], messages=[{"role": "user", "content": "go"}])
    copies = []
    for turn in range(turns):
        t.add_generated([10 + turn, 20 + turn], [-0.5, -0.25])
        t.turns.append({"turn": turn, "text": f"reply {turn}", "policy_version": turn})
        t.messages.append({"role": "assistant", "content": f"reply {turn}"})
        t.add_inserted([30 + turn])
        t.messages.append({"role": "tool", "content": f"seen {turn}"})
        copies.append(t.model_copy(deep=True))
    return copies


def test_the_parts_of_each_turn_rebuild_the_trajectory_exactly() -> None:
    steps = grown(3)
    mark, parts = Mark(), []
    for t in steps:
        parts.append(delta(t, mark))
        mark = Mark.of(t)
    assert "prompt_ids" in parts[0] and "prompt_ids" not in parts[1]  # the prompt once
    assert parts[2]["response_ids"] == [12, 22, 32]  # only what turn 2 added
    assert rebuild(parts).model_dump() == steps[-1].model_dump()


def test_parts_that_do_not_make_a_sound_trajectory_are_refused() -> None:
    steps = grown(2)
    first = delta(steps[0], Mark())
    second = delta(steps[1], Mark.of(steps[0]))
    second["logprobs"] = second["logprobs"][:-1]  # one logprob short
    with pytest.raises(ValueError, match="not sound"):
        rebuild([first, second])
    assert rebuild([first]).response_ids == [10, 20, 30]  # control


def test_a_changed_part_is_named() -> None:
    other = fingerprint({"task": "code", "sampling_params": {"temperature": 0.5}})
    assert changed(PRINT, other) == ["sampling_params"]
    assert changed(PRINT, {**PRINT, "model": "x"}) == ["model"]
    assert changed(PRINT, dict(PRINT)) == []


def rows_of(steps: list[Trajectory], job_dir: Path, files: bool = True) -> list[TurnCheckpoint]:
    """Rows of a job whose turns each wrote an archive (the first the chain's base)."""
    rows, mark = [], Mark()
    for i, t in enumerate(steps, start=1):
        name = None
        sha = None
        if files:
            name = f"turn-{i}.tar"
            (job_dir / name).write_bytes(f"archive {i}".encode())
            sha = hashlib.sha256(f"archive {i}".encode()).hexdigest()
        rows.append(
            TurnCheckpoint(
                "j",
                i - 1,
                i,
                PRINT,
                delta(t, mark),
                base=1 if files else None,
                archive=name,
                size=9,
                sha256=sha,
                shell={"cwd": "/workspace/d", "env": [["MARK", "x"]], "dropped": []},
                lost=["sleep (pid 6)"],
            )
        )
        mark = Mark.of(t)
    return rows


def test_a_job_resumes_at_its_last_turn_with_every_archive_of_its_chain(tmp_path: Path) -> None:
    steps = grown(3)
    point, why = resume_point(rows_of(steps, tmp_path), PRINT, tmp_path, files=True)
    assert why is None and point is not None
    assert point.turn == 3
    assert point.trajectory.model_dump() == steps[-1].model_dump()
    assert [p.name for p in point.archives] == ["turn-1.tar", "turn-2.tar", "turn-3.tar"]
    assert point.shell == ShellState("/workspace/d", (("MARK", "x"),), ())
    assert point.lost == ("sleep (pid 6)",)


def test_a_torn_or_missing_archive_resumes_at_the_turn_before(tmp_path: Path) -> None:
    steps = grown(3)
    rows = rows_of(steps, tmp_path)
    (tmp_path / "turn-3.tar").write_bytes(b"arch")  # torn: does not hash
    point, _ = resume_point(rows, PRINT, tmp_path, files=True)
    assert point is not None and point.turn == 2
    (tmp_path / "turn-1.tar").unlink()  # the chain's base gone: nothing of it can be used
    point, why = resume_point(rows, PRINT, tmp_path, files=True)
    assert point is None and why is not None and "turn 1" in why


def test_an_archive_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    steps = grown(1)
    rows = rows_of(steps, tmp_path)
    (tmp_path / "elsewhere.tar").write_bytes(b"archive 1")
    (tmp_path / "turn-1.tar").unlink()
    (tmp_path / "turn-1.tar").symlink_to(tmp_path / "elsewhere.tar")  # hashes right
    point, why = resume_point(rows, PRINT, tmp_path, files=True)
    assert point is None and why is not None


def test_rows_that_do_not_chain_from_the_start_are_not_resumed(tmp_path: Path) -> None:
    steps = grown(3)
    rows = rows_of(steps, tmp_path)
    point, why = resume_point(rows[1:], PRINT, tmp_path, files=True)  # turn 1's row gone
    assert (point, why) == (None, None)
    gap = [rows[0], rows[2]]  # turn 2's row gone: turn 3's goes on from a turn not kept
    point, _ = resume_point(gap, PRINT, tmp_path, files=True)
    assert point is not None and point.turn == 1


def test_a_changed_fingerprint_refuses_and_names_the_part(tmp_path: Path) -> None:
    rows = rows_of(grown(2), tmp_path)
    now = {**PRINT, "model": "another"}
    point, why = resume_point(rows, now, tmp_path, files=True)
    assert point is None and why is not None and "model" in why
    assert resume_point(rows, PRINT, tmp_path, files=True)[0] is not None  # control


def test_files_a_new_sandbox_cannot_take_refuse_the_resume(tmp_path: Path) -> None:
    rows = rows_of(grown(1), tmp_path)
    point, why = resume_point(rows, PRINT, tmp_path, files=False)
    assert point is None and why is not None and "cannot take" in why
    no_files = rows_of(grown(1), tmp_path, files=False)  # a job without a sandbox
    assert resume_point(no_files, PRINT, tmp_path, files=False)[0] is not None


class Book:
    """An in-memory CheckpointBook; ``fail`` makes add_checkpoint raise."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: list[TurnCheckpoint] = []
        self.fail = False

    def job_dir(self, job_id: str) -> Path:
        return self.root

    async def add_checkpoint(self, checkpoint: TurnCheckpoint) -> None:
        if self.fail:
            raise OSError("disk full")
        self.rows = [r for r in self.rows if r.turn <= checkpoint.from_turn] + [checkpoint]

    async def checkpoints(self, job_id: str) -> list[TurnCheckpoint]:
        return list(self.rows)


class SlowSandbox:
    """A sandbox whose checkpoint waits for ``go``: the read of a slow disk."""

    can_checkpoint = True

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.reads = 0
        self.version = 0  # what its workspace holds: a new version is a change

    async def checkpoint(
        self, snar: Path, dest: Path, max_bytes: int, unchanged: str | None = None
    ) -> Checkpointed:
        self.reads += 1
        await self.go.wait()
        signature = f"files-{self.version}"
        if signature == unchanged:
            return Checkpointed(None, 0, None, None, (), signature)
        dest.write_bytes(b"x")
        return Checkpointed(dest, 1, hashlib.sha256(b"x").hexdigest(), None, (), signature)


async def test_the_turn_boundary_returns_before_the_sandbox_is_read(tmp_path: Path) -> None:
    book, sandbox = Book(tmp_path), SlowSandbox()
    steps = grown(2)
    ck = Checkpointer(book, "j", PRINT, sandbox, Trajectory(), every=1)  # type: ignore[arg-type]
    await asyncio.wait_for(ck.after_turn(1, steps[0]), 5)  # returns while the read waits
    tools = asyncio.create_task(ck.before_tools())
    await asyncio.sleep(0)
    assert not tools.done()  # the next turn's tools wait for the read...
    sandbox.go.set()
    await asyncio.wait_for(tools, 5)  # ...and only for it
    await ck.close()
    assert [r.turn for r in book.rows] == [1] and book.rows[0].base == 1
    sandbox.version = 1
    await ck.after_turn(2, steps[1])
    await ck.close()
    assert [(r.from_turn, r.turn, r.base) for r in book.rows] == [(0, 1, 1), (1, 2, 1)]
    assert ck.stats.written == 2 and ck.stats.bytes == 2


async def test_every_n_turns_writes_every_nth_and_chains_them(tmp_path: Path) -> None:
    book = Book(tmp_path)
    steps = grown(4)
    ck = Checkpointer(book, "j", PRINT, None, Trajectory(), every=2)
    for i, t in enumerate(steps, start=1):
        await ck.after_turn(i, t)
    await ck.close()
    assert [(r.from_turn, r.turn) for r in book.rows] == [(0, 2), (2, 4)]
    point, _ = resume_point(book.rows, PRINT, tmp_path, files=False)
    assert point is not None and point.trajectory.model_dump() == steps[-1].model_dump()


async def test_a_failed_write_stops_the_jobs_checkpoints_and_leaves_the_loop_alone(
    tmp_path: Path,
) -> None:
    book = Book(tmp_path)
    steps = grown(3)
    ck = Checkpointer(book, "j", PRINT, None, Trajectory(), every=1)
    await ck.after_turn(1, steps[0])
    await ck.close()
    book.fail = True
    await ck.after_turn(2, steps[1])  # no error reaches the loop
    await ck.close()
    book.fail = False
    await ck.after_turn(3, steps[2])  # a row from turn 2 would not chain: none is written
    await ck.close()
    assert [r.turn for r in book.rows] == [1]
    assert ck.stats.stopped is not None and "disk full" in ck.stats.stopped


async def test_a_resumed_run_goes_on_from_its_turns_with_a_chain_of_its_own(
    tmp_path: Path,
) -> None:
    book, sandbox = Book(tmp_path), SlowSandbox()
    sandbox.go.set()
    steps = grown(3)
    ck = Checkpointer(book, "j", PRINT, sandbox, steps[1], every=1)  # type: ignore[arg-type]
    await ck.after_turn(3, steps[2])
    await ck.close()
    (row,) = book.rows
    assert (row.from_turn, row.turn, row.base) == (2, 3, 3)  # a new base: all files again
    assert row.delta["response_ids"] == [12, 22, 32] and "prompt_ids" not in row.delta


async def test_a_turn_that_changed_no_file_writes_no_archive_and_still_resumes(
    tmp_path: Path,
) -> None:
    book, sandbox = Book(tmp_path), SlowSandbox()
    sandbox.go.set()
    steps = grown(3)
    ck = Checkpointer(book, "j", PRINT, sandbox, Trajectory(), every=1)  # type: ignore[arg-type]
    await ck.after_turn(1, steps[0])
    await ck.before_tools()  # as the loop: the next turn's tools wait for the read
    await ck.after_turn(2, steps[1])  # nothing changed: no archive
    await ck.before_tools()
    sandbox.version = 1  # the tools changed a file
    await ck.after_turn(3, steps[2])
    await ck.close()
    assert [(r.turn, r.archive is not None) for r in book.rows] == [
        (1, True),
        (2, False),
        (3, True),
    ]
    point, _ = resume_point(book.rows, PRINT, tmp_path, files=True)
    assert point is not None and point.turn == 3 and len(point.archives) == 2
    # The chain's first row must hold every file: one without an archive cannot start it.
    first = book.rows[0]
    book.rows[0] = TurnCheckpoint(**{**first.__dict__, "archive": None})
    assert resume_point(book.rows, PRINT, tmp_path, files=True)[0] is None
