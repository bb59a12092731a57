"""raas.pipeline.checkpoints: the result store as the book of checkpoints, within each tenant's
``max_checkpoint_mb`` (what its jobs in flight hold together on disk)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from raas.agent.checkpoints import TurnCheckpoint
from raas.pipeline.checkpoints import OverTenantQuota, StoredCheckpoints
from raas.store.records import JobRecord
from raas.store.sqlite import ResultStore
from raas.wire import RolloutResult, Timing, Trajectory

MB = 2**20
# Tenant a may hold 100 bytes of archives; b has no cap.
CAPS = {"a": 100 / MB, "b": None}


@pytest.fixture
async def book(tmp_path: Path) -> AsyncIterator[StoredCheckpoints]:
    store = ResultStore(tmp_path / "r.db")
    await store.open()
    jobs = [("a~1", "a"), ("a~2", "a"), ("b~1", "b")]
    await store.add_jobs(
        [JobRecord(key, "run", "code", None, {}, 1.0, tenant=t) for key, t in jobs]
    )
    yield StoredCheckpoints(store, lambda tenant: CAPS.get(tenant))
    await store.close()


async def checkpoint(
    book: StoredCheckpoints, job_id: str, from_turn: int, turn: int, size: int
) -> TurnCheckpoint:
    """A row whose archive of ``size`` bytes lies in the job's directory, offered to the book."""
    folder = book.job_dir(job_id)
    name = f"turn-{turn}.tar"
    (folder / name).write_bytes(b"x" * size)
    row = TurnCheckpoint(job_id, from_turn, turn, {"task": "t"}, {}, 1, name, size, "h")
    await book.add_checkpoint(row)
    return row


async def test_a_tenant_over_its_checkpoint_quota_keeps_no_more(book: StoredCheckpoints) -> None:
    await checkpoint(book, "a~1", 0, 1, 60)
    with pytest.raises(OverTenantQuota):
        await checkpoint(book, "a~2", 0, 1, 60)  # a's two jobs would hold 120 bytes
    assert not (book.job_dir("a~2") / "turn-1.tar").exists()  # the refused archive is gone
    assert [r.turn for r in await book.checkpoints("a~2")] == []
    await checkpoint(book, "b~1", 0, 1, 500)  # another tenant's own room (no cap)
    assert [r.turn for r in await book.checkpoints("b~1")] == [1]


async def test_rows_a_checkpoint_replaces_do_not_count(book: StoredCheckpoints) -> None:
    await checkpoint(book, "a~1", 0, 1, 60)
    await checkpoint(book, "a~1", 0, 1, 90)  # a new run of the job: its turn 1 replaced
    assert [r.size for r in await book.checkpoints("a~1")] == [90]


async def test_a_finished_jobs_checkpoints_give_their_room_back(book: StoredCheckpoints) -> None:
    await checkpoint(book, "a~1", 0, 1, 60)
    result = RolloutResult(
        job_id="1",
        state="done",
        data_source="code",
        trajectory=Trajectory(),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
    )
    await book.store.save_result("a~1", result)
    await checkpoint(book, "a~2", 0, 1, 60)
    assert [r.turn for r in await book.checkpoints("a~2")] == [1]
    with pytest.raises(OverTenantQuota):  # the finished job keeps none
        await checkpoint(book, "a~1", 1, 2, 1)


async def test_a_row_reads_back_as_it_was_written(book: StoredCheckpoints) -> None:
    row = await checkpoint(book, "b~1", 0, 1, 10)
    assert await book.checkpoints("b~1") == [row]
