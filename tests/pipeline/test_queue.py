from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from raas.pipeline.queue import QueueFull, StageQueue


@dataclass
class Item:
    id: str
    priority: int = 0
    tenant: str = "default"


async def test_priority_then_fifo() -> None:
    q: StageQueue[Item] = StageQueue(10)
    for item in [Item("a"), Item("b", 1), Item("c"), Item("d", 1)]:
        q.put_nowait(item)
    assert [(await q.get()).id for _ in range(4)] == ["b", "d", "a", "c"]


async def test_bounded_and_discard_frees_a_place() -> None:
    q: StageQueue[Item] = StageQueue(2)
    a, b = Item("a"), Item("b")
    q.put_nowait(a)
    q.put_nowait(b)
    with pytest.raises(QueueFull):
        q.put_nowait(Item("c"))
    assert q.discard(a) and not q.discard(a)
    q.put_nowait(Item("c"))
    assert [(await q.get()).id for _ in range(2)] == ["b", "c"]


async def test_put_waits_for_room_or_gives_up() -> None:
    q: StageQueue[Item] = StageQueue(1)
    q.put_nowait(Item("a"))
    waiting = asyncio.create_task(q.put(Item("b"), give_up=lambda: False))
    stop = False
    giving_up = asyncio.create_task(q.put(Item("c"), give_up=lambda: stop))
    await asyncio.sleep(0)
    assert not waiting.done() and not giving_up.done()
    stop = True
    q.wake()
    assert await giving_up is False
    assert (await q.get()).id == "a"
    assert await waiting is True
    assert (await q.get()).id == "b" and len(q) == 0
