"""Each tenant's use over a period (GET /v1/usage, ``raas usage``), read from the ledger's
``daily`` window (raas.pipeline.ledger: one-minute buckets kept for a day), which counts it; the
ledger's totals, since the server started, are what /metrics says."""

from __future__ import annotations

from collections import defaultdict

from raas.pipeline.ledger import Counts, Ledger
from raas.wire import TenantUsage, UsageReport


def read_usage(ledger: Ledger, since_s: float, only: str | None = None) -> UsageReport:
    """Each tenant's use in the buckets that overlap the last ``since_s`` seconds (``only``: that
    tenant's alone)."""
    window = ledger.daily
    now = ledger.clock()
    kept = window.keep * window.bucket_s
    since_s = max(0.0, min(since_s, now - ledger.started, kept))
    totals: defaultdict[str, Counts] = defaultdict(Counts)
    for bucket in window.buckets(window.index(now - since_s)):
        for tenant, counts in bucket.tenants.items():
            if only is None or tenant == only:
                totals[tenant].add(counts)
    tenants = [_usage(name, counts) for name, counts in sorted(totals.items())]
    return UsageReport(since_s=since_s, tenants=tenants)


def _usage(tenant: str, counts: Counts) -> TenantUsage:
    return TenantUsage(
        tenant=tenant,
        submitted=counts.submitted,
        finished=dict(counts.finished),
        stage_s=dict(counts.stage_s),
        sandbox_s=counts.sandbox_s,
        tokens_in=counts.tokens_in,
        tokens_out=counts.tokens_out,
    )
