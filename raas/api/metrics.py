"""Prometheus metrics: jobs by state, errors by kind, stage durations, queue depths, activity, the
node's image store, and each tenant's use (jobs, stage and sandbox seconds, LLM tokens). Every
count is read at scrape time: jobs from the pipeline's ledger (raas.pipeline.ledger), which alone
counts them, the rest from the pipeline and the image store as they are now.

Each tenant's series are kept in a registry of their own and shown to the admin only: a tenant
must not read another's use (its own is GET /v1/usage), and the server-wide series say nothing
of who."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from raas.api.image_store import ImageStoreMonitor
from raas.pipeline import Pipeline
from raas.pipeline.ledger import Histogram, Ledger

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The gauges of each stage, read from Pipeline.stats(): its key, the metric's name and help.
PER_STAGE = (
    ("queued", "raas_queue_depth", "Jobs waiting for a stage."),
    ("active", "raas_stage_active", "Jobs inside a stage."),
    ("workers", "raas_stage_workers", "Worker slots of a stage."),
)

PER_TENANT = (
    ("in_flight", "raas_tenant_jobs_in_flight", "Jobs accepted and not finished, by tenant."),
    (
        "sandboxes",
        "raas_tenant_sandboxes",
        "Sandboxes held now (jobs from INIT to cleanup, and kept snapshots).",
    ),
)


class PipelineMetrics:
    """The exposition of one app (a registry each, so tests can run many): every count is read at
    scrape time from the pipeline's ledger (raas.pipeline.ledger), which alone counts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tenant_registry = CollectorRegistry()  # the per-tenant series: the admin's only

    def watch(self, pipeline: Pipeline) -> None:
        self.registry.register(_LedgerCounts(pipeline.ledger))
        self.registry.register(_PipelineGauges(pipeline))
        self.tenant_registry.register(_TenantCounts(pipeline.ledger))
        self.tenant_registry.register(_TenantGauges(pipeline))

    def watch_images(self, images: ImageStoreMonitor) -> None:
        self.registry.register(_ImageStoreGauges(images))

    def render(self, per_tenant: bool = True) -> bytes:
        """The exposition; ``per_tenant`` adds each tenant's series (for the admin)."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.tenant_registry) if per_tenant else text


def _counter(
    name: str, doc: str, labels: list[str], values: Iterable[tuple[list[str], float]], since: float
) -> CounterMetricFamily:
    """A counter family; each series counts from ``since`` (the ledger's start)."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value, created=since)
    return family


def _histogram(
    name: str,
    doc: str,
    labels: list[str],
    values: Iterable[tuple[list[str], Histogram]],
    since: float,
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for label_values, histogram in values:
        cumulative = list(itertools.accumulate(histogram.counts))
        bounds = [str(float(b)) for b in histogram.bounds] + ["+Inf"]  # as `le` is written
        family.add_metric(label_values, list(zip(bounds, cumulative, strict=True)), histogram.sum)
        created = dict(zip(labels, label_values, strict=True))
        family.samples.append(Sample(f"{name}_created", created, since))
    return family


class _LedgerCounts(Collector):
    """The server-wide counters and histograms, by task and state (nothing says whose)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        ledger, since = self.ledger, self.ledger.started
        tasks = sorted(ledger.by(lambda tenant, data_source: data_source).items())
        yield _counter(
            "raas_jobs_submitted",
            "Jobs accepted, by task.",
            ["data_source"],
            (([ds], c.submitted) for ds, c in tasks if c.submitted),
            since,
        )
        yield _counter(
            "raas_jobs_finished",
            "Jobs finished, by final state and task.",
            ["state", "data_source"],
            (([state, ds], n) for ds, c in tasks for state, n in sorted(c.finished.items())),
            since,
        )
        yield _histogram(
            "raas_stage_duration_seconds",
            "Time a job spent inside a stage.",
            ["stage"],
            (([s.value], h) for s, h in ledger.stage_seconds.items() if h.count),
            since,
        )
        yield _counter(
            "raas_job_errors",
            "Errors that ended a run of a job (its last, or one run again), by kind and task.",
            ["kind", "data_source"],
            (([kind, ds], n) for ds, c in tasks for kind, n in sorted(c.errors.items())),
            since,
        )
        finished = [(ds, c) for ds, c in tasks if c.finished_jobs]
        yield _counter(
            "raas_malformed_tool_calls",
            "Tool calls the model wrote that the parser could not read, in finished jobs, by task.",
            ["data_source"],
            (([ds], c.malformed_tool_calls) for ds, c in finished),
            since,
        )
        yield _counter(
            "raas_judge_tamper",
            "Finished jobs a judge scored 0 because a twin of a deciding test passed, by task.",
            ["data_source"],
            (([ds], c.tamper) for ds, c in tasks if c.tamper),
            since,
        )
        yield _histogram(
            "raas_job_queue_seconds",
            "Time a finished job spent waiting in stage queues.",
            [],
            [([], ledger.queue_seconds)],
            since,
        )


class _TenantCounts(Collector):
    """Each tenant's counters: jobs, stage and sandbox seconds, LLM tokens (the admin's)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        since = self.ledger.started
        tenants = sorted(self.ledger.by(lambda tenant, data_source: tenant).items())
        finished = [(t, c) for t, c in tenants if c.finished_jobs]
        yield _counter(
            "raas_tenant_jobs_submitted",
            "Jobs accepted, by tenant.",
            ["tenant"],
            (([t], c.submitted) for t, c in tenants if c.submitted),
            since,
        )
        yield _counter(
            "raas_tenant_jobs_finished",
            "Jobs finished, by tenant and state.",
            ["tenant", "state"],
            (([t, state], n) for t, c in tenants for state, n in sorted(c.finished.items())),
            since,
        )
        yield _counter(
            "raas_tenant_stage_seconds",
            "Seconds inside stages, by tenant.",
            ["tenant", "stage"],
            (([t, stage], s) for t, c in tenants for stage, s in sorted(c.stage_s.items())),
            since,
        )
        yield _counter(
            "raas_tenant_sandbox_seconds",
            "Seconds finished jobs held a sandbox (INIT to cleanup, every attempt), by tenant.",
            ["tenant"],
            (([t], c.sandbox_s) for t, c in finished),
            since,
        )
        yield _counter(
            "raas_tenant_llm_tokens",
            "LLM tokens of finished jobs by tenant: in (each call's prompt) and out (generated).",
            ["tenant", "direction"],
            (
                ([t, direction], n)
                for t, c in finished
                for direction, n in (("in", c.tokens_in), ("out", c.tokens_out))
            ),
            since,
        )


class _PipelineGauges(Collector):
    """Read at scrape time, so the numbers are never stale."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self.pipeline.stats()
        for key, name, doc in PER_STAGE:
            gauge = GaugeMetricFamily(name, doc, labels=["stage"])
            for stage, s in stats["stages"].items():
                gauge.add_metric([stage], s[key])
            yield gauge
        yield GaugeMetricFamily(
            "raas_jobs_in_flight", "Jobs accepted and not finished.", value=stats["in_flight"]
        )
        yield GaugeMetricFamily(
            "raas_accepting", "1 while new jobs are accepted.", value=1 if stats["accepting"] else 0
        )
        yield GaugeMetricFamily(
            "raas_store_writable",
            "1 while the result store writes; 0 since a write failed (a full disk).",
            value=1 if stats["store_writable"] else 0,
        )
        yield GaugeMetricFamily(
            "raas_results_held",
            "Finished jobs whose results wait for the store to write them.",
            value=stats["results_held"],
        )
        yield GaugeMetricFamily(
            "raas_store_unreadable_rows",
            "Rows of the result store found unreadable: quarantined, skipped where listed.",
            value=stats["unreadable_rows"],
        )


class _TenantGauges(Collector):
    """Each tenant's jobs in flight and sandboxes held, read at scrape time."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tenants = self.pipeline.stats()["tenants"]
        for key, name, doc in PER_TENANT:
            gauge = GaugeMetricFamily(name, doc, labels=["tenant"])
            for tenant, t in tenants.items():
                gauge.add_metric([tenant], t[key])
            yield gauge


class _ImageStoreGauges(Collector):
    """The last reading of the node's image store (read off the event loop by the monitor)."""

    def __init__(self, images: ImageStoreMonitor) -> None:
        self.images = images

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usage = self.images.usage
        if usage is None:  # not read yet
            return
        yield GaugeMetricFamily(
            "raas_image_store_images", "Images the node's image store names.", value=usage.images
        )
        yield GaugeMetricFamily(
            "raas_image_store_layers", "Unpacked layers in the image store.", value=usage.layers
        )
        yield GaugeMetricFamily(
            "raas_image_store_bytes",
            "Bytes of the image store: unpacked layers, each once, and blobs.",
            value=usage.total_bytes,
        )
        yield GaugeMetricFamily(
            "raas_image_store_share_ratio",
            "Layer bytes the images would take unshared, over those stored (1: nothing shared).",
            value=usage.share_ratio,
        )
