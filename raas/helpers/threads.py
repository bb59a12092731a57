"""Blocking calls run in a thread and awaited to their end, cancelled or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def to_its_end(call: Callable[[], T], undo: Callable[[T], None]) -> T:
    """``call()`` in a thread, awaited to its end even where the task is cancelled meanwhile:
    such a call may use the caller's fds or PIDs by number (closed or reaped under it, their
    numbers taken by another file or process, it would act on whatever has them by then), and
    what it makes (a cgroup, a fork) only its result names. Cancelled, ``undo`` gets that
    result, then the cancellation is raised."""
    job = asyncio.ensure_future(asyncio.to_thread(call))
    cancelled: asyncio.CancelledError | None = None
    while not job.done():
        try:
            await asyncio.wait({job})
        except asyncio.CancelledError as e:  # the thread goes on: wait for it all the same
            cancelled = cancelled or e
    if cancelled is None:
        return job.result()
    if not job.cancelled() and job.exception() is None:
        undo(job.result())
    raise cancelled


def nothing(_: object) -> None:
    """An ``undo`` for a call that makes nothing to undo."""
