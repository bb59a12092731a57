"""SIGTERM stopping a run's coroutine as a Ctrl-C would, so that its cleanup runs."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Terminated(Exception):
    """SIGTERM (kill, Slurm's scancel, timeout) stopped a run, as a Ctrl-C would have."""


async def stopped_by_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """Awaits ``coro``; SIGTERM cancels it, as asyncio.run does on Ctrl-C, so that its cleanup
    runs (its jobs cancelled on the server, the servers it started stopped); then Terminated.

    Only this task is cancelled: a KeyboardInterrupt raised in the loop would make asyncio.run
    cancel every task at once, the cleanup's own awaits included. Not by way of SIGINT, which a
    process a script starts in the background ignores. Outside the main thread SIGTERM is not
    this coroutine's to take, and it only awaits. The handler before is put back after."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    before = signal.getsignal(signal.SIGTERM)
    signalled: list[bool] = []

    def cancel() -> None:
        signalled.append(True)
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, cancel)
    except (ValueError, RuntimeError):  # not the main thread
        return await coro
    try:
        return await coro
    except asyncio.CancelledError:
        if signalled:
            raise Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if before is not None:
            signal.signal(signal.SIGTERM, before)
