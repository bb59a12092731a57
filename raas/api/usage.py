"""Each tenant's use over time, in one-minute buckets kept for a day, read as GET /v1/usage
(``raas usage``). A PipelineObserver, as the Prometheus metrics are, whose counters say the same
since the server started; this keeps when, so a period can be asked."""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from raas.pipeline import Job, JobState, Stage
from raas.wire import TenantUsage, UsageReport

BUCKET_S = 60.0
KEEP = 24 * 60  # a day of buckets


@dataclass
class _Bucket:
    index: int
    tenants: dict[str, TenantUsage] = field(default_factory=dict)

    def of(self, tenant: str) -> TenantUsage:
        return self.tenants.setdefault(tenant, TenantUsage(tenant=tenant))


class UsageLedger:
    def __init__(
        self, bucket_s: float = BUCKET_S, keep: int = KEEP, clock: Callable[[], float] = time.time
    ) -> None:
        self.bucket_s, self.keep, self.clock = bucket_s, keep, clock
        self.started = clock()
        self._ring: deque[_Bucket] = deque(maxlen=keep)

    def _now(self, tenant: str) -> TenantUsage:
        index = math.floor(self.clock() / self.bucket_s)
        if not self._ring or self._ring[-1].index < index:
            self._ring.append(_Bucket(index))
        return self._ring[-1].of(tenant)

    def job_submitted(self, job: Job) -> None:
        self._now(job.tenant).submitted += 1

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None:
        usage = self._now(job.tenant)
        usage.stage_s[stage.value] = usage.stage_s.get(stage.value, 0.0) + seconds

    def job_finished(self, job: Job, state: JobState) -> None:
        usage = self._now(job.tenant)
        usage.finished[state.value] = usage.finished.get(state.value, 0) + 1
        usage.sandbox_s += job.sandbox_s
        tokens_in, tokens_out = job.llm_tokens()
        usage.tokens_in += tokens_in
        usage.tokens_out += tokens_out

    def read(self, since_s: float, only: str | None = None) -> UsageReport:
        """Each tenant's use in the buckets that overlap the last ``since_s`` seconds (``only``:
        that tenant's alone)."""
        now = self.clock()
        kept = self.keep * self.bucket_s
        since_s = max(0.0, min(since_s, now - self.started, kept))
        first = math.floor((now - since_s) / self.bucket_s)
        totals: dict[str, TenantUsage] = defaultdict(lambda: TenantUsage(tenant=""))
        for bucket in self._ring:
            if bucket.index < first:
                continue
            for tenant, usage in bucket.tenants.items():
                if only is None or tenant == only:
                    _add(totals[tenant], usage)
        tenants = [t.model_copy(update={"tenant": name}) for name, t in sorted(totals.items())]
        return UsageReport(since_s=since_s, tenants=tenants)


def _add(total: TenantUsage, usage: TenantUsage) -> None:
    total.submitted += usage.submitted
    for state, n in usage.finished.items():
        total.finished[state] = total.finished.get(state, 0) + n
    for stage, s in usage.stage_s.items():
        total.stage_s[stage] = total.stage_s.get(stage, 0.0) + s
    total.sandbox_s += usage.sandbox_s
    total.tokens_in += usage.tokens_in
    total.tokens_out += usage.tokens_out
