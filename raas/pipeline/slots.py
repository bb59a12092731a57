"""A stage's workers shared by tenants: slots kept for a tenant's jobs on their way.

Weighted fair queueing orders the jobs waiting in a stage's queue, but a stage's slots are not
preempted: when one tenant's backlog holds every slot, another's job that reaches the queue waits
for one of those jobs to end (a whole agent loop, in RUN), however fair the order. So a tenant
under its weighted share of a stage's slots has a slot kept free for each of its jobs in the
stage before (on their way here, in a moment): another tenant over its own share may not take
it. INIT keeps none (nothing comes before it), and a job still waiting in the queue before keeps
none (it may wait there long: its next queue full, its tenant's sandbox quota reached).

So a tenant with nothing on its way keeps nothing (its share goes to the others: work-conserving
but for the jobs about to arrive), and a tenant under its share may always take a free slot.

A slot is never taken back from a job in its stage: RUN is one agent loop (a turn is the task's
own, and its sandbox and conversation are the job's), so there is nothing to preempt it at. A
tenant that took every slot while alone would then hold them for as long as its jobs run
(never-ending ones: until their budget, ``max_timeout_s`` at most) while another waits. So a
tenant under its share takes a slot even when none is free (``may_take`` says yes; the pipeline
runs RUN with as many workers again to take it): the slots beyond ``workers`` go only to tenants
under their shares, a tenant over its share takes none while all are held, and no tenant waits
for another's jobs to end to get its share. That is the simplest design that holds: making a
job over its share wait at its next turn would need the loop (and the gateway's agents, whose
turns are their own) to hand its slot back; capping a tenant at its share whenever another
could come would leave slots idle. RUN holds at most twice its workers, as a queue holds twice
its places (raas.pipeline.queue).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable


class StageSlots:
    """How many of a stage's ``workers`` slots each tenant holds, and whether it may take one
    more (``may_take``). ``before``: the previous stage's, whose jobs are on their way here."""

    def __init__(
        self, workers: int, weight: Callable[[str], float], before: StageSlots | None = None
    ) -> None:
        self.workers = workers
        self._weight = weight
        self._before = before
        self.held: Counter[str] = Counter()

    def take(self, tenant: str) -> None:
        self.held[tenant] += 1

    def give_back(self, tenant: str) -> None:
        self.held[tenant] -= 1

    def coming(self, tenant: str) -> int:
        """``tenant``'s jobs in the stage before."""
        return 0 if self._before is None else self._before.held[tenant]

    def may_take(self, tenant: str) -> bool:
        """Whether ``tenant`` may take a slot now: it is under its share (even where every one
        of ``workers`` is held: see above), or the slots free beyond the one it takes cover those
        kept for the other tenants' jobs on their way."""
        active = {tenant} | {t for t, n in self.held.items() if n > 0}
        if self._before is not None:
            active |= {t for t, n in self._before.held.items() if n > 0}
        total = sum(self._weight(t) for t in active)
        share = {t: max(1, int(self.workers * self._weight(t) / total)) for t in active}
        if self.held[tenant] < share[tenant]:
            return True
        kept = sum(
            max(0, min(share[t] - self.held[t], self.coming(t))) for t in active if t != tenant
        )
        return self.workers - sum(self.held.values()) - 1 >= kept
