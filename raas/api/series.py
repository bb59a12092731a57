"""The dashboard's plots over time: what finished in each bucket of a few seconds, kept in
memory as a bounded ring (the one place these series live), read as GET /v1/dashboard/series.

A PipelineObserver, as the Prometheus metrics are: it is told of every stage run and every
finished job on the event loop, and only adds to the newest bucket. The ring holds the buckets
that saw something (at most ``keep``); a read spreads them over the timeline, empty buckets as
zeros, back ``keep`` buckets from now at most.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import get_args

from raas.pipeline import Job, JobState, Stage
from raas.wire import PASS_REWARD, DashboardSeries, ErrorKind, StageName

BUCKET_S = 10.0
KEEP = 720  # two hours of buckets
KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
STAGES: tuple[StageName, ...] = get_args(StageName)


@dataclass
class Bucket:
    """What ended in the ``index``-th ``bucket_s`` seconds since the epoch."""

    index: int
    finished: int = 0
    generated_tokens: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    passed: int = 0
    stage_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    stage_runs: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    malformed_tool_calls: int = 0


class Series:
    """The ring, fed as a PipelineObserver."""

    def __init__(
        self, bucket_s: float = BUCKET_S, keep: int = KEEP, clock: Callable[[], float] = time.time
    ) -> None:
        self.bucket_s, self.keep, self.clock = bucket_s, keep, clock
        self._ring: deque[Bucket] = deque(maxlen=keep)

    def _index(self) -> int:
        return math.floor(self.clock() / self.bucket_s)

    def _now(self) -> Bucket:
        index = self._index()
        if not self._ring or self._ring[-1].index < index:
            self._ring.append(Bucket(index))
        return self._ring[-1]

    def job_submitted(self, job: Job) -> None:
        pass

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None:
        bucket = self._now()
        bucket.stage_s[stage.value] += seconds
        bucket.stage_runs[stage.value] += 1

    def job_finished(self, job: Job, state: JobState) -> None:
        bucket = self._now()
        bucket.finished += 1
        for error in job.attempt_errors:
            bucket.errors[error.kind] += 1
        if job.ending is not None:
            bucket.errors[job.ending.kind] += 1
        result = job.result
        if result is None:
            return
        bucket.generated_tokens += sum(result.trajectory.loss_mask)
        bucket.malformed_tool_calls += result.trajectory.malformed_tool_calls()
        if result.reward is not None:
            bucket.rewarded += 1
            bucket.reward_sum += result.reward
            bucket.passed += result.reward >= PASS_REWARD

    def read(self) -> DashboardSeries:
        """Every bucket from the oldest kept (or ``keep`` back from now) to now, oldest first."""
        now = self._index()
        kept = {b.index: b for b in self._ring}
        first = max(min(kept, default=now), now - self.keep + 1)
        buckets = [kept.get(i) or Bucket(i) for i in range(first, now + 1)]

        def share(part: float, whole: int) -> float | None:
            return part / whole if whole else None

        return DashboardSeries(
            bucket_s=self.bucket_s,
            t=[b.index * self.bucket_s for b in buckets],
            finished=[b.finished for b in buckets],
            rollouts_per_min=[60 * b.finished / self.bucket_s for b in buckets],
            generated_tokens_per_s=[b.generated_tokens / self.bucket_s for b in buckets],
            rewarded=[b.rewarded for b in buckets],
            reward_mean=[share(b.reward_sum, b.rewarded) for b in buckets],
            pass_rate=[share(b.passed, b.rewarded) for b in buckets],
            stage_s={s: [share(b.stage_s[s], b.stage_runs[s]) for b in buckets] for s in STAGES},
            errors={k: [b.errors[k] for b in buckets] for k in KINDS},
            malformed_tool_calls=[b.malformed_tool_calls for b in buckets],
        )
