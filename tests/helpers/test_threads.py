"""raas.helpers.threads: a thread awaited to its end even when its task is cancelled."""

from __future__ import annotations

import asyncio
import threading

import pytest

from raas.helpers.threads import nothing, to_its_end


async def test_a_cancelled_call_runs_to_its_end_and_what_it_made_is_undone() -> None:
    entered, release = threading.Event(), threading.Event()
    ended, undone = [], []

    def call() -> str:
        entered.set()
        release.wait(30)
        ended.append(True)
        return "made"

    task = asyncio.ensure_future(to_its_end(call, undone.append))
    assert await asyncio.to_thread(entered.wait, 30)
    task.cancel()
    await asyncio.sleep(0)  # the cancellation is delivered while the thread still runs
    assert not task.done() and not ended  # it waits for the thread, not for nothing
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == [True] and undone == ["made"]


async def test_an_uncancelled_call_returns_its_result_and_undoes_nothing() -> None:
    undone: list[str] = []
    assert await to_its_end(lambda: "made", undone.append) == "made"  # the control
    assert undone == []


async def test_a_call_that_raises_raises_and_is_not_undone() -> None:
    def call() -> str:
        raise OSError("no cgroup")

    with pytest.raises(OSError, match="no cgroup"):
        await to_its_end(call, nothing)
