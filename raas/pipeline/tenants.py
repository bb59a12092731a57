"""What the pipeline is told of each tenant: its weight in the stage queues and its quotas.

The tenants file (raas.tenants) says which API key is which tenant and holds each one's weight
and ``Quotas``; the pipeline only asks a ``TenantPolicies`` callable, by tenant name, each time
it decides, so a reload of the file that hands it a new one (``policies_of``, through
``Pipeline.set_tenants``) takes effect at the next job taken or submission checked.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from raas.tenants import Quotas, Tenants

# A tokens-per-second quota is measured over this window, so that one long turn's tokens do not
# refuse a tenant for the second after it and a burst is allowed as long as the minute's average
# holds.
SECOND_WINDOW_S = 60.0
DAY_S = 86400.0


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's weight (its share of each stage's slots while others wait too) and quotas
    (the tenants file's: jobs in flight refuse a submission, sandboxes hold jobs back in the
    INIT queue, LLM tokens per second, averaged over SECOND_WINDOW_S, or per day refuse one)."""

    weight: float = 1.0
    quotas: Quotas = field(default_factory=Quotas)

    def __post_init__(self) -> None:
        if not self.weight > 0 or not math.isfinite(self.weight):
            raise ValueError(f"a tenant's weight must be a positive number, not {self.weight}")


TenantPolicies = Callable[[str], TenantPolicy]
_NO_QUOTAS = TenantPolicy()


def every_tenant_alike(tenant: str) -> TenantPolicy:
    """The default: weight 1 and no quotas, so one tenant runs as if there were none."""
    return _NO_QUOTAS


def policies_from(table: dict[str, TenantPolicy]) -> TenantPolicies:
    """A ``TenantPolicies`` from a table; a tenant it does not name gets the default."""
    return lambda tenant: table.get(tenant, _NO_QUOTAS)


def policies_of(tenants: Tenants | None) -> TenantPolicies:
    """The policies of a reading of the tenants file (None: no file, every tenant alike); the
    admin's own jobs, of no tenant of the file, get the default."""
    if tenants is None:
        return every_tenant_alike
    return policies_from(
        {t.name: TenantPolicy(t.weight, t.quotas) for t in tenants.by_name.values()}
    )


class TokenMeter:
    """The LLM tokens of one tenant's finished jobs over the last day, to check its budgets."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spent: deque[tuple[float, int]] = deque()  # (when, tokens), oldest first

    def add(self, tokens: int) -> None:
        if tokens > 0:
            self._spent.append((self._clock(), tokens))

    def over(self, policy: TenantPolicy) -> tuple[str, float] | None:
        """The budget ``policy`` has spent ("llm_tokens_per_s" or "llm_tokens_per_day") and
        the seconds until enough of the window frees, or None while both hold."""
        now = self._clock()
        while self._spent and self._spent[0][0] <= now - DAY_S:
            self._spent.popleft()
        per_s = policy.quotas.llm_tokens_per_s
        per_minute = None if per_s is None else per_s * SECOND_WINDOW_S
        budgets = (
            ("llm_tokens_per_s", per_minute, SECOND_WINDOW_S),
            ("llm_tokens_per_day", policy.quotas.llm_tokens_per_day, DAY_S),
        )
        for name, limit, window in budgets:
            if limit is None:
                continue
            recent = [(t, n) for t, n in self._spent if t > now - window]
            used = sum(n for _, n in recent)
            if used < limit:
                continue
            # The window frees once the oldest tokens that put it over have left it.
            for t, n in recent:
                used -= n
                if used < limit:
                    return name, max(t + window - now, 0.0)
        return None
