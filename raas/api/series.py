"""The dashboard's plots over time (GET /v1/dashboard/series): what finished in each bucket of a
few seconds, read from the ledger's ``recent`` window (raas.pipeline.ledger), which counts it
(filled at the start from the results the store holds for its span).

The window holds the buckets that saw something (at most ``keep``); a read spreads them over the
timeline, empty buckets as zeros, back ``keep`` buckets from now at most. A tenant's read holds
its own jobs only; the admin's every tenant's.
"""

from __future__ import annotations

from raas.pipeline.ledger import Counts, Window
from raas.wire import ERROR_KINDS, STAGE_NAMES, DashboardSeries


def read_series(window: Window, tenant: str | None = None) -> DashboardSeries:
    """Every bucket from the oldest kept (or ``keep`` back from now) to now, oldest first: of
    ``tenant``'s jobs, or of every tenant's (None)."""
    now = window.index()
    # From the oldest bucket that holds something of the reader's, ``keep`` back at most.
    held = [b for b in window.buckets() if tenant is None or tenant in b.tenants]
    first = max(held[0].index if held else now, window.first())
    kept = {b.index: b.of(tenant) for b in held if b.index >= first}
    indices = range(first, now + 1)
    buckets = [kept.get(i) or Counts() for i in indices]
    bucket_s = window.bucket_s

    def share(part: float, whole: int) -> float | None:
        return part / whole if whole else None

    return DashboardSeries(
        bucket_s=bucket_s,
        t=[i * bucket_s for i in indices],
        finished=[b.finished_jobs for b in buckets],
        rollouts_per_min=[60 * b.finished_jobs / bucket_s for b in buckets],
        generated_tokens_per_s=[b.generated_tokens / bucket_s for b in buckets],
        rewarded=[b.rewarded for b in buckets],
        reward_mean=[share(b.reward_sum, b.rewarded) for b in buckets],
        pass_rate=[share(b.passed, b.rewarded) for b in buckets],
        stage_s={s: [share(b.stage_s[s], b.stage_runs[s]) for b in buckets] for s in STAGE_NAMES},
        errors={k: [b.errors[k] for b in buckets] for k in ERROR_KINDS},
        malformed_tool_calls=[b.malformed_tool_calls for b in buckets],
        staleness_mean=[share(b.staleness_sum, b.staleness_known) for b in buckets],
        staleness_max=[b.staleness_max for b in buckets],
    )
