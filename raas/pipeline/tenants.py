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

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from raas.pipeline.errors import QuotaExceeded
from raas.pipeline.job import Job
from raas.tasks.protocol import TaskJob
from raas.tenants import TenantPolicy, Tenants, tenant_of

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


class TenantBooks:
    """Per tenant, what its quotas count: its jobs accepted and not finished (or being recorded),
    the sandboxes it holds (its jobs' from INIT to cleanup, and its kept snapshots), and the LLM
    tokens its jobs used and reserved. Admission refuses by them; the stages count on them."""

    def __init__(
        self,
        policy: TenantPolicies,
        snapshots: Any = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.policy = policy  # asked each time: a reload of the tenants file takes effect
        self.wake = wake  # the INIT queue's: a job held back at its tenant's sandbox cap may go
        self.jobs: Counter[str] = Counter()
        self.sandboxes: Counter[str] = Counter()
        self._tokens: dict[str, TokenMeter] = {}
        # A kept snapshot is a live sandbox of its job's tenant: counted in its max_sandboxes,
        # bounded by its max_snapshots, evicted for its own new ones only (raas.agent.snapshots).
        self._snapshots = snapshots if hasattr(snapshots, "bind") else None
        if self._snapshots is not None:
            self._snapshots.bind(tenant_of, self.snapshots_allowed, self.snapshot_freed)

    def check_quotas(self, wanted: Counter[str], tokens: Counter[str], retry_after_s: int) -> None:
        """QuotaExceeded when a tenant's ``wanted`` new jobs would take it over its jobs in
        flight, or their ``tokens`` (ceilings) would take it over an LLM token budget beside
        what it used and what is reserved: the whole submission is refused."""
        for tenant, n in wanted.items():
            policy = self.policy(tenant)
            cap = policy.quotas.max_jobs_in_flight
            if cap is not None and self.jobs[tenant] + n > cap:
                raise QuotaExceeded(
                    tenant,
                    "max_jobs_in_flight",
                    retry_after_s,
                    f"{self.jobs[tenant]} in flight, {n} more asked, at most {cap}",
                )
            meter = self.meter(tenant)
            spent = meter.over(policy, tokens[tenant])
            if spent is not None:
                quota, wait_s = spent
                asked = f"{tokens[tenant]} LLM tokens asked (the jobs' ceilings)"
                if wait_s is None:
                    raise QuotaExceeded(
                        tenant,
                        quota,
                        retry_after_s,
                        f"{asked}, {meter.reserved} reserved for its jobs in flight till they end",
                    )
                raise QuotaExceeded(
                    tenant,
                    quota,
                    max(1, math.ceil(wait_s)),
                    f"{asked}; its window frees in {wait_s:.0f} s",
                )

    def meter(self, tenant: str) -> TokenMeter:
        return self._tokens.setdefault(tenant, TokenMeter())

    def settle_tokens(self, job: Job) -> None:
        """The job ended: what it used replaces the ceiling reserved for it (once)."""
        self.meter(job.tenant).settle(job.tokens_reserved, sum(job.llm_tokens()))
        job.tokens_reserved = 0

    def weight(self, tenant: str) -> float:
        return self.policy(tenant).weight

    def may_take_init(self, tenant: str) -> bool:
        # INIT's slots keep none (no stage comes before it): the sandbox quota alone decides.
        cap = self.policy(tenant).quotas.max_sandboxes
        return cap is None or self.held_sandboxes(tenant) < cap

    def held_sandboxes(self, tenant: str) -> int:
        """``tenant``'s sandboxes: its jobs' from INIT to cleanup, and its kept snapshots."""
        kept = self._snapshots.held(tenant) if self._snapshots is not None else 0
        return self.sandboxes[tenant] + kept

    def snapshots_allowed(self, tenant: str) -> int | None:
        """How many snapshots ``tenant`` may keep now (None: as many as the server's): its
        max_snapshots, and what its max_sandboxes leaves beside its jobs' own sandboxes."""
        quotas = self.policy(tenant).quotas
        caps = [quotas.max_snapshots]
        if quotas.max_sandboxes is not None:
            caps.append(quotas.max_sandboxes - self.sandboxes[tenant])
        return min((c for c in caps if c is not None), default=None)

    def snapshot_freed(self, tenant: str) -> None:
        self.wake()  # a job of the tenant held back at its cap may go

    def hold_sandbox(self, job: Job) -> None:
        job.sandbox_since = time.monotonic()
        self.sandboxes[job.tenant] += 1

    def release_sandbox(self, job: Job) -> None:
        if job.sandbox_since is None:
            return
        job.sandbox_s += time.monotonic() - job.sandbox_since
        job.sandbox_since = None
        self.sandboxes[job.tenant] -= 1
        self.wake()  # a job of the tenant held back at its cap may go
