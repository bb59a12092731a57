"""A bounded priority queue of jobs waiting for one stage."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    id: str
    priority: int


J = TypeVar("J", bound=Queued)


class QueueFull(Exception):
    pass


class StageQueue(Generic[J]):
    """Higher ``priority`` first, first-in first-out within a priority.

    A job can be taken out again (``discard``) when it is cancelled while it waits, which frees its
    place at once. Places can be reserved (``reserve``) for jobs that are put later, so that
    nothing takes them meanwhile. Waiters are woken through a replaceable event so that sync code
    (a cancel) can wake them without holding a lock.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("a stage queue holds at least one job")
        self.maxsize = maxsize
        self._heap: list[tuple[int, int, J]] = []
        self._members: set[str] = set()
        self._reserved = 0
        self._seq = itertools.count()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job: J) -> bool:
        return job.id in self._members

    @property
    def free(self) -> int:
        return self.maxsize - len(self._members) - self._reserved

    def reserve(self, n: int) -> None:
        """Hold ``n`` places for jobs put later with ``put_nowait(job, reserved=True)``."""
        if n > self.free:
            raise QueueFull
        self._reserved += n

    def unreserve(self, n: int) -> None:
        """Give back ``n`` reserved places that will not be used."""
        self._reserved -= n
        self.wake()

    def put_nowait(self, job: J, reserved: bool = False) -> None:
        if reserved:
            self._reserved -= 1
        elif self.free <= 0:
            raise QueueFull
        heapq.heappush(self._heap, (-job.priority, next(self._seq), job))
        self._members.add(job.id)
        self.wake()

    async def put(self, job: J, give_up: Callable[[], bool]) -> bool:
        """Wait for room, then enqueue; False if ``give_up()`` turned true while waiting."""
        while self.free <= 0:
            if give_up():
                return False
            await self._wait()
        if give_up():
            return False
        self.put_nowait(job)
        return True

    async def get(self) -> J:
        while True:
            while self._heap:
                _, _, job = heapq.heappop(self._heap)
                if job.id in self._members:
                    self._members.discard(job.id)
                    self.wake()
                    return job
            await self._wait()

    def discard(self, job: J) -> bool:
        """Take ``job`` out of the queue; True if it was waiting here."""
        if job.id not in self._members:
            return False
        self._members.discard(job.id)
        self.wake()
        return True

    def wake(self) -> None:
        """Wake every waiter to re-check its condition."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()
