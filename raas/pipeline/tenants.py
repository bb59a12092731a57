"""What the pipeline is told of each tenant: its weight in the stage queues and its quotas.

The tenants file (raas.tenants) says which API key is which tenant and holds each one's
``TenantPolicy`` (weight and ``Quotas``); the pipeline only asks a ``TenantPolicies`` callable,
by tenant name, each time it decides, so a reload of the file that hands it a new one
(``policies_of``, through ``Pipeline.set_tenants``) takes effect at the next job taken or
submission checked.

A limit is reserved when a job is admitted, not checked after the fact: a job's LLM tokens are
reserved at its ceiling (``token_ceiling``) from its admission until it ends, when what it used
replaces the reservation (``TokenMeter.settle``), so one batch cannot spend a multiple of a
tenant's token quota; its sandbox is counted from INIT, and each snapshot it keeps, until they
are closed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from raas.tasks.protocol import TaskJob
from raas.tenants import TenantPolicy, Tenants

# A tokens-per-second quota is measured over this window, so that one long turn's tokens do not
# refuse a tenant for the second after it and a burst is allowed as long as the minute's average
# holds.
SECOND_WINDOW_S = 60.0
DAY_S = 86400.0


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
    return policies_from({t.name: t.policy for t in tenants.by_name.values()})


def token_ceiling(handler: Any, job: TaskJob) -> int | None:
    """The most LLM tokens ``job`` can use, counted as a job's token quota counts them (each
    call's prompt and output, from its turn records), or None where its task does not say.

    A handler says it with its own ``token_ceiling(job)``. An agent task (one with
    ``loop_config``: raas.tasks.agentic) is bounded by its loop: a turn's prompt and output
    together fit in ``max_context_tokens`` (the loop asks for no more output than the context
    has room for, and stops before a turn with none), and there are ``max_turns`` turns at most,
    a branch's copied ones included. ``max_tokens`` alone (a turn's output) would leave out the
    prompts, which the quota counts. An agent program behind the gateway (the harness task) is
    told ``max_turns`` but not held to it: what its job used is what settles, all the same."""
    declared = getattr(handler, "token_ceiling", None)
    if callable(declared):
        ceiling = declared(job)
        return None if ceiling is None else int(ceiling)
    loop_config = getattr(handler, "loop_config", None)
    if callable(loop_config):
        config = loop_config(job)
        return int(config.max_turns) * int(config.max_context_tokens)
    return None


def token_budgets(policy: TenantPolicy) -> list[tuple[str, float, float]]:
    """Each token quota of ``policy`` that is set: its name, its tokens and its window (s)."""
    per_s = policy.quotas.llm_tokens_per_s
    budgets = (
        ("llm_tokens_per_s", None if per_s is None else per_s * SECOND_WINDOW_S, SECOND_WINDOW_S),
        ("llm_tokens_per_day", policy.quotas.llm_tokens_per_day, DAY_S),
    )
    return [(name, limit, window) for name, limit, window in budgets if limit is not None]


class TokenMeter:
    """One tenant's LLM tokens: those its finished jobs used over the last day, and those
    reserved for its jobs in flight (each one's ceiling, from its admission until it ends)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._spent: deque[tuple[float, int]] = deque()  # (when, tokens), oldest first
        self.reserved = 0

    def add(self, tokens: int) -> None:
        if tokens > 0:
            self._spent.append((self._clock(), tokens))

    def reserve(self, tokens: int) -> None:
        """Hold ``tokens`` (admitted jobs' ceilings) against every budget until settled."""
        self.reserved += tokens

    def settle(self, reserved: int, used: int) -> None:
        """A job ended: what it ``used`` replaces the ``reserved`` ceiling it was admitted with."""
        self.reserved -= reserved
        self.add(used)

    def over(self, policy: TenantPolicy, more: int = 0) -> tuple[str, float | None] | None:
        """The budget of ``policy`` that ``more`` tokens (a submission's ceilings) would take
        over, beside those used in its window and those reserved ("llm_tokens_per_s" or
        "llm_tokens_per_day"), and the seconds until enough of the window frees (None: not
        before jobs in flight end); None while every budget holds them. A budget already spent
        refuses even a job of no ceiling."""
        now = self._clock()
        while self._spent and self._spent[0][0] <= now - DAY_S:
            self._spent.popleft()
        reserved = self.reserved

        def fits(used: float, limit: float) -> bool:
            return used + reserved < limit and used + reserved + more <= limit

        for name, limit, window in token_budgets(policy):
            recent = [(t, n) for t, n in self._spent if t > now - window]
            used = sum(n for _, n in recent)
            if fits(used, limit):
                continue
            if not fits(0, limit):  # the reservations alone leave no room: jobs must end first
                return name, None
            # The window frees once the oldest tokens that put it over have left it.
            for t, n in recent:
                used -= n
                if fits(used, limit):
                    return name, max(t + window - now, 0.0)
        return None
