"""The ledger: the one place that counts what jobs did. Every count of finished jobs that raas
shows (``Pipeline.stats()``, /metrics, GET /v1/usage, the dashboard's plots) is read from it.

It is told three things, on the event loop: a job was accepted and a stage run ended (as a
PipelineObserver), and a job finished (a JobEvent, which the pipeline makes where the job
finishes: ``record``). It keeps, in memory since the process started:

- totals by tenant and data_source (a Counts each), and two histograms (seconds a finished job
  waited in queues; seconds of each stage run): what /metrics and ``Pipeline.stats()`` show. A
  data_source is counted under the server's own name for it (``source_label``), never as a
  client wrote it: the string is a tenant's, and every spelling of it would be a total kept till
  the process ends, a series on /metrics, and shown there to every tenant;
- two windows of time buckets, each bucket a Counts a tenant: ``recent`` (10 s buckets, two
  hours: the dashboard's plots) and ``daily`` (one-minute buckets, a day: each tenant's usage).
  A window keeps only the buckets that saw something, at most ``keep``.

What outlives a restart is the result store's (raas.store): the dashboard's counts over every
stored result are counted from the table there, and ``recent`` is filled at the start
(``restore``) from the results the store holds for its span, before any job of this process
finishes, so that no result is counted both from the store and as it finishes.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from raas.pipeline.events import JobEvent
from raas.pipeline.job import Job
from raas.pipeline.states import JobState, Stage
from raas.store.dashboard import FinishedGroup
from raas.tasks import sources
from raas.wire import PASS_REWARD

# Seconds: a stage run, a job's wait in queues (the bounds of /metrics' histograms).
DURATION_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


@dataclass(frozen=True)
class WindowSpec:
    bucket_s: float
    keep: int  # buckets


# The label of the jobs of a data_source no task of this server runs (a job from before a restart
# whose task is gone, a result that could be stored only without its data_source).
UNKNOWN_SOURCE = "(unknown)"


def source_label(data_source: str, task: str | None) -> str:
    """The name the jobs of ``data_source``, run by ``task``, are counted under: the task's own
    name, or a dataset name as the alias table spells it (``aime*`` for every ``aime...``,
    raas.tasks.sources.canonical), so one of the names the server runs, however the client
    spelled it; UNKNOWN_SOURCE when no task ran it."""
    if task is None:
        return UNKNOWN_SOURCE
    if data_source == task:
        return task
    return sources.canonical(data_source) or task


RECENT = WindowSpec(10.0, 720)  # two hours: the dashboard's plots
DAILY = WindowSpec(60.0, 24 * 60)  # a day: each tenant's usage


@dataclass
class Counts:
    """What a set of jobs did: those accepted, the stage runs that ended, those finished."""

    submitted: int = 0
    stage_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    stage_runs: Counter[str] = field(default_factory=Counter)
    finished: Counter[str] = field(default_factory=Counter)  # by final state
    # The errors that ended a run of a job (its last, or one run again), by kind.
    errors: Counter[str] = field(default_factory=Counter)
    sandbox_s: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    generated_tokens: int = 0
    malformed_tool_calls: int = 0
    tamper: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    passed: int = 0  # rewarded with PASS_REWARD or more
    # The finished jobs whose policy version span is known (JobEvent.policy_version_span).
    staleness_known: int = 0
    staleness_sum: int = 0
    staleness_max: int | None = None

    @property
    def finished_jobs(self) -> int:
        return sum(self.finished.values())

    def add_event(self, event: JobEvent) -> None:
        self.finished[event.state.value] += 1
        for kind in event.attempt_error_kinds:
            self.errors[kind] += 1
        if event.error_kind is not None:
            self.errors[event.error_kind] += 1
        self.sandbox_s += event.sandbox_s
        self.tokens_in += event.tokens_in
        self.tokens_out += event.tokens_out
        self.generated_tokens += event.generated_tokens
        self.malformed_tool_calls += event.malformed_tool_calls
        self.tamper += event.tamper
        if event.reward is not None:
            self.rewarded += 1
            self.reward_sum += event.reward
            self.passed += event.reward >= PASS_REWARD
        if event.policy_version_span is not None:
            self._add_staleness(1, event.policy_version_span, event.policy_version_span)

    def _add_staleness(self, known: int, total: int, largest: int | None) -> None:
        self.staleness_known += known
        self.staleness_sum += total
        if largest is not None:
            now = self.staleness_max
            self.staleness_max = largest if now is None else max(now, largest)

    def add_group(self, group: FinishedGroup) -> None:
        """Count the results of ``group`` (read from the store at a start)."""
        self.finished[group.state] += group.jobs
        self.errors.update(group.attempt_errors)
        if group.error_kind is not None:
            self.errors[group.error_kind] += group.jobs
        self.generated_tokens += group.generated_tokens
        self.malformed_tool_calls += group.malformed_tool_calls
        self.rewarded += group.rewarded
        self.reward_sum += group.reward_sum
        self.passed += group.passed
        # A job's seconds in a stage (every attempt's) as one run: a stored result keeps no
        # more, and where it ended is its finish's bucket, not each run's.
        for stage, seconds in group.stage_s.items():
            self.stage_s[stage] += seconds
            self.stage_runs[stage] += group.stage_runs[stage]
        self._add_staleness(group.staleness_known, group.staleness_sum, group.staleness_max)

    def add_stage(self, stage: Stage, seconds: float) -> None:
        self.stage_s[stage.value] += seconds
        self.stage_runs[stage.value] += 1

    def add(self, other: Counts) -> None:
        """Add ``other``'s counts to these."""
        self.submitted += other.submitted
        for stage, s in other.stage_s.items():
            self.stage_s[stage] += s
        self.stage_runs.update(other.stage_runs)
        self.finished.update(other.finished)
        self.errors.update(other.errors)
        self.sandbox_s += other.sandbox_s
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.generated_tokens += other.generated_tokens
        self.malformed_tool_calls += other.malformed_tool_calls
        self.tamper += other.tamper
        self.rewarded += other.rewarded
        self.reward_sum += other.reward_sum
        self.passed += other.passed
        self._add_staleness(other.staleness_known, other.staleness_sum, other.staleness_max)


@dataclass
class Histogram:
    """How many values fell at or under each bound (not cumulative; the last: above them all),
    and their sum."""

    bounds: tuple[float, ...] = DURATION_BOUNDS
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass
class Bucket:
    """What happened in the ``index``-th ``bucket_s`` seconds since the epoch, by tenant."""

    index: int
    tenants: defaultdict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))

    def of(self, tenant: str | None) -> Counts:
        """One tenant's counts (None: every tenant's together)."""
        if tenant is not None:
            return self.tenants.get(tenant) or Counts()
        total = Counts()
        for counts in self.tenants.values():
            total.add(counts)
        return total


class Window:
    """The last ``keep`` buckets of ``bucket_s`` seconds that saw something, oldest first."""

    def __init__(self, spec: WindowSpec, clock: Callable[[], float]) -> None:
        self.bucket_s, self.keep, self.clock = spec.bucket_s, spec.keep, clock
        self._ring: deque[Bucket] = deque(maxlen=spec.keep)

    def index(self, t: float | None = None) -> int:
        """The bucket of time ``t`` (None: now)."""
        return math.floor((self.clock() if t is None else t) / self.bucket_s)

    def now(self, tenant: str) -> Counts:
        """``tenant``'s counts in the newest bucket, made when it is new."""
        index = self.index()
        if not self._ring or self._ring[-1].index < index:
            self._ring.append(Bucket(index))
        return self._ring[-1].tenants[tenant]

    def first(self) -> int:
        """The index of the oldest bucket the window can hold now (``keep`` back from now)."""
        return self.index() - self.keep + 1

    def restore(self, buckets: Iterable[Bucket]) -> None:
        """Take in ``buckets`` from before (a bucket already here gets their counts added):
        those older than ``first()`` are left out, and those after now (a clock set back since
        they were written), which would take the counts of the jobs that finish now."""
        merged = {b.index: b for b in self._ring}
        now = self.index()
        for bucket in buckets:
            if not now - self.keep < bucket.index <= now:
                continue
            into = merged.setdefault(bucket.index, Bucket(bucket.index))
            for tenant, counts in bucket.tenants.items():
                into.tenants[tenant].add(counts)
        self._ring.clear()
        self._ring.extend(sorted(merged.values(), key=lambda b: b.index))

    def buckets(self, first: int | None = None) -> Iterator[Bucket]:
        """The kept buckets (from index ``first`` on), oldest first."""
        if first is None:
            return iter(self._ring)
        return (b for b in self._ring if b.index >= first)


class Ledger:
    """Counts of what jobs did since the process started; see the module's doc."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        recent: WindowSpec = RECENT,
        daily: WindowSpec = DAILY,
    ) -> None:
        self.clock = clock
        self.started = clock()
        self.totals: defaultdict[tuple[str, str], Counts] = defaultdict(Counts)
        self.queue_seconds = Histogram()
        self.stage_seconds = {stage: Histogram() for stage in Stage}
        self.recent = Window(recent, clock)
        self.daily = Window(daily, clock)

    def _counts(self, tenant: str, data_source: str, task: str | None) -> Iterator[Counts]:
        """Each place a count of ``tenant``'s job of ``data_source`` (run by ``task``) goes."""
        yield self.totals[tenant, source_label(data_source, task)]
        yield self.recent.now(tenant)
        yield self.daily.now(tenant)

    # -- what it is told -------------------------------------------------------------------------

    def restore(self, groups: list[FinishedGroup]) -> None:
        """Fill ``recent`` with results from before this process (read from the store for its
        span, ``recent.first()`` on): called at the start, before any job of this process
        finishes, so that each result is counted once: from the store, or as it finishes."""
        buckets: dict[int, Bucket] = {}
        for group in groups:
            bucket = buckets.setdefault(group.bucket, Bucket(group.bucket))
            bucket.tenants[group.tenant].add_group(group)
        self.recent.restore(sorted(buckets.values(), key=lambda b: b.index))

    def record(self, event: JobEvent) -> None:
        """A job finished: the one place its end is counted."""
        for counts in self._counts(event.tenant, event.data_source, event.task):
            counts.add_event(event)
        self.queue_seconds.observe(event.queue_s)

    def job_submitted(self, job: Job) -> None:
        for counts in self._counts(job.tenant, job.data_source, job.task):
            counts.submitted += 1

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None:
        for counts in self._counts(job.tenant, job.data_source, job.task):
            counts.add_stage(stage, seconds)
        self.stage_seconds[stage].observe(seconds)

    def job_finished(self, job: Job, state: JobState) -> None:
        """Nothing: a finished job is counted from the JobEvent the pipeline hands ``record``
        (this is here so that the ledger is a PipelineObserver for the other two)."""

    # -- what readers ask -----------------------------------------------------------------------

    def finished(self) -> Counter[str]:
        """Jobs finished since the start, by final state."""
        total: Counter[str] = Counter()
        for counts in self.totals.values():
            total.update(counts.finished)
        return total

    def by(self, key: Callable[[str, str], str]) -> dict[str, Counts]:
        """The totals added up by ``key(tenant, data_source)``."""
        grouped: defaultdict[str, Counts] = defaultdict(Counts)
        for (tenant, data_source), counts in self.totals.items():
            grouped[key(tenant, data_source)].add(counts)
        return dict(grouped)
