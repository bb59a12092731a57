"""A bounded queue of jobs waiting for one stage, shared by tenants in weighted fair shares."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    id: str
    priority: int
    tenant: str


J = TypeVar("J", bound=Queued)


class QueueFull(Exception):
    pass


def _alike(tenant: str) -> float:
    return 1.0


class StageQueue(Generic[J]):
    """Tenants by weighted fair queueing; within a tenant, higher ``priority`` first, first-in
    first-out within a priority.

    Fair share is weighted fair queueing by virtual time, every job costing one slot: a backlogged
    tenant's next job has a start tag, its finish tag is that plus ``1 / weight``, and the tenant
    with the smallest finish tag is served; its next start tag is that finish. With unit costs
    this is exact WFQ in a few lines (deficit round robin would need a quantum and rounds for the
    same split). The virtual time is the start tag served last; a tenant that had nothing waiting
    starts again from it, so it banks no credit while idle, and one with nothing waiting is
    skipped, so its share goes to the others (work-conserving). ``weight`` is asked at each take,
    so a new weight applies at once.

    Places are shared too: a tenant holding fewer places than its weighted share of the queue's
    size (among the tenants holding places in it) may take one even when the queue is full. A
    tenant that filled the queue while alone then cannot shut out one that arrives: the newcomer
    is never refused a submission, nor held before a full next queue, by another's backlog. So
    the size bounds each tenant's holding to its share once the queue is full, and the whole
    queue holds twice its size at most (one tenant's full queue, the others' shares beyond it).

    ``may_take(tenant)``, when given, holds a tenant's jobs back while false (at its sandbox
    quota); they wait, and whoever makes it true again calls ``wake``.

    ``hands_to``, the queue of the next stage: a job is taken only with a place reserved for it
    there (``put_nowait(job, reserved=True)`` once its stage is over, ``unreserve(tenant)`` if
    it ends instead). So a full next queue holds jobs back here, in fair-share order, rather than
    after their stage in the order their workers wake: a tenant never waits behind another's
    jobs that are already through this stage, nor (by the shares above) behind another's full
    next queue, and no worker holds a job (nor its sandbox) while it waits for room. A place
    freed there wakes this queue's waiters.

    A job can be taken out again (``discard``) when it is cancelled while it waits, which frees its
    place at once. Places can be reserved (``reserve``) for jobs that are put later, so that
    nothing takes them meanwhile. Waiters are woken through a replaceable event so that sync code
    (a cancel) can wake them without holding a lock.
    """

    def __init__(
        self,
        maxsize: int,
        weight: Callable[[str], float] = _alike,
        may_take: Callable[[str], bool] | None = None,
        hands_to: StageQueue[J] | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError("a stage queue holds at least one job")
        self.maxsize = maxsize
        self._weight = weight
        self._may_take = may_take
        self._next = hands_to
        self._previous: StageQueue[J] | None = None
        if hands_to is not None:
            hands_to._previous = self
        self._heaps: dict[str, list[tuple[int, int, J]]] = {}
        self._waiting: Counter[str] = Counter()  # members per tenant
        self._start: dict[str, float] = {}  # each tenant's next start tag
        self._vtime = 0.0  # the start tag of the job taken last
        self._members: set[str] = set()
        self._reserved = 0
        self._held: Counter[str] = Counter()  # places per tenant: members and reserved
        self._seq = itertools.count()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job: J) -> bool:
        return job.id in self._members

    @property
    def free(self) -> int:
        return self.maxsize - len(self._members) - self._reserved

    def waiting(self, tenant: str) -> int:
        return self._waiting[tenant]

    def share(self, tenant: str) -> int:
        """The places ``tenant`` may hold in a full queue: its weighted share of the size among
        the tenants holding places here, it included (at least one)."""
        weight = self._weight(tenant)
        others = sum(self._weight(t) for t, n in self._held.items() if n > 0 and t != tenant)
        return max(1, int(self.maxsize * weight / (weight + others)))

    def room(self, tenant: str) -> int:
        """The places ``tenant`` may have now: the free ones, or what its share leaves it (up to
        twice the size in all)."""
        beyond = min(self.share(tenant) - self._held[tenant], self.maxsize + self.free)
        return max(0, self.free, beyond)

    def has_room(self, tenant: str, n: int = 1) -> bool:
        return n <= self.room(tenant)

    def reserve(self, tenant: str, n: int = 1) -> None:
        """Hold ``n`` places of ``tenant`` for its jobs put later with ``put_nowait(job,
        reserved=True)``."""
        if not self.has_room(tenant, n):
            raise QueueFull
        self._reserved += n
        self._held[tenant] += n

    def unreserve(self, tenant: str, n: int = 1) -> None:
        """Give back ``n`` reserved places of ``tenant`` that will not be used."""
        self._reserved -= n
        self._held[tenant] -= n
        self._freed()

    def put_nowait(self, job: J, reserved: bool = False) -> None:
        if reserved:
            self._reserved -= 1
        elif not self.has_room(job.tenant):
            raise QueueFull
        else:
            self._held[job.tenant] += 1
        heap = self._heaps.setdefault(job.tenant, [])
        heapq.heappush(heap, (-job.priority, next(self._seq), job))
        self._members.add(job.id)
        if self._waiting[job.tenant] <= 0:  # back from idle: from the virtual time now
            self._start[job.tenant] = max(self._start.get(job.tenant, 0.0), self._vtime)
        self._waiting[job.tenant] += 1
        self.wake()

    async def put(self, job: J, give_up: Callable[[], bool]) -> bool:
        """Wait for room, then enqueue; False if ``give_up()`` turned true while waiting."""
        while not self.has_room(job.tenant):
            if give_up():
                return False
            await self._wait()
        if give_up():
            return False
        self.put_nowait(job)
        return True

    async def get(self) -> J:
        while (job := self.take()) is None:
            await self._wait()
        return job

    def take(self) -> J | None:
        """The next job by fair share (with its place in the next queue reserved), or None when
        no tenant may be served now (held back, or no room for it in the next queue)."""
        best: tuple[float, float, str] | None = None
        for tenant, n in self._waiting.items():
            if n <= 0 or (self._may_take is not None and not self._may_take(tenant)):
                continue
            if self._next is not None and not self._next.has_room(tenant):
                continue
            start = self._start[tenant]
            finish = start + 1.0 / self._weight(tenant)
            if best is None or (finish, start, tenant) < best:
                best = (finish, start, tenant)
        if best is None:
            return None
        finish, start, tenant = best
        heap = self._heaps[tenant]
        while True:  # a discarded job's entry stays in its heap until it comes up
            _, _, job = heapq.heappop(heap)
            if job.id in self._members:
                break
        self._members.discard(job.id)
        self._waiting[tenant] -= 1
        self._held[tenant] -= 1
        self._start[tenant] = finish
        self._vtime = start
        if self._next is not None:
            self._next.reserve(tenant)
        self._freed()
        return job

    def discard(self, job: J) -> bool:
        """Take ``job`` out of the queue; True if it was waiting here."""
        if job.id not in self._members:
            return False
        self._members.discard(job.id)
        self._waiting[job.tenant] -= 1
        self._held[job.tenant] -= 1
        self._freed()
        return True

    def wake(self) -> None:
        """Wake every waiter to re-check its condition."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _freed(self) -> None:
        """A place freed: this queue's waiters, and the previous stage's (which takes a job
        only when this queue has room for it), check again."""
        self.wake()
        if self._previous is not None:
            self._previous.wake()

    async def _wait(self) -> None:
        await self._changed.wait()
