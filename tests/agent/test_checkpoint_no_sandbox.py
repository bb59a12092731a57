"""raas.agent.checkpoints for a job without a sandbox: nothing is read at its turn boundary, so
the next turn's tools never wait for its checkpoint's row (the store's write): `raas bench soak`
found them waiting for it, a SQLite write on the loop's path each turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raas.agent.checkpoints import Checkpointer, TurnCheckpoint
from raas.wire import Trajectory


class SlowBook:
    """A CheckpointBook whose rows are written once ``go`` is set: a busy store."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.rows: list[TurnCheckpoint] = []

    def job_dir(self, job_id: str) -> Path:
        raise AssertionError("a job without a sandbox has no archives")

    async def add_checkpoint(self, checkpoint: TurnCheckpoint) -> None:
        await self.go.wait()
        self.rows.append(checkpoint)

    async def checkpoints(self, job_id: str) -> list[TurnCheckpoint]:
        return list(self.rows)


def _after_turn(t: Trajectory, turn: int) -> Trajectory:
    t.add_generated([10 + turn, 20 + turn], [-0.5, -0.25])
    t.turns.append({"turn": turn, "text": f"reply {turn}"})
    t.add_inserted([30 + turn])
    return t


async def test_the_tools_never_wait_for_the_row_of_a_job_without_a_sandbox() -> None:
    book = SlowBook()
    t = Trajectory(prompt_ids=[1, 2, 3], messages=[{"role": "user", "content": "go"}])
    ck = Checkpointer(book, "j", {"task": "x"}, None, Trajectory())
    for turn in range(2):
        await ck.after_turn(turn + 1, _after_turn(t, turn))
        # The next turn's tools go on at once, with the rows still unwritten...
        await asyncio.wait_for(ck.before_tools(), 5)
    assert book.rows == []
    book.go.set()
    await ck.close()
    # ...and the rows come, in turn order, chained.
    assert [(r.from_turn, r.turn) for r in book.rows] == [(0, 1), (1, 2)]
    assert ck.stats.written == 2 and ck.stats.stopped is None
