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
        """Whether ``tenant`` may take a free slot now: it is under its share, or the slots free
        beyond the one it takes cover those kept for the other tenants' jobs on their way."""
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
