"""Prometheus metrics: jobs by state, errors by kind, stage durations, queue depths, activity, the
node's image store, and each tenant's use (jobs, stage and sandbox seconds, LLM tokens).

Each tenant's series are kept in a registry of their own and shown to the admin only: a tenant
must not read another's use (its own is GET /v1/usage), and the server-wide series say nothing
of who."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from raas.api.image_store import ImageStoreMonitor
from raas.pipeline import Job, JobState, Pipeline, Stage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
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
    """A PipelineObserver that counts into its own registry (one per app, so tests can run many)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tenant_registry = CollectorRegistry()  # the per-tenant series: the admin's only
        counter = partial(Counter, registry=self.registry)
        tenant_counter = partial(Counter, registry=self.tenant_registry)
        histogram = partial(Histogram, buckets=STAGE_BUCKETS, registry=self.registry)
        self.submitted = counter("raas_jobs_submitted", "Jobs accepted, by task.", ["data_source"])
        self.finished = counter(
            "raas_jobs_finished",
            "Jobs finished, by final state and task.",
            ["state", "data_source"],
        )
        self.stage_seconds = histogram(
            "raas_stage_duration_seconds", "Time a job spent inside a stage.", ["stage"]
        )
        self.errors = counter(
            "raas_job_errors",
            "Errors that ended a run of a job (its last, or one run again), by kind and task.",
            ["kind", "data_source"],
        )
        self.malformed_tool_calls = counter(
            "raas_malformed_tool_calls",
            "Tool calls the model wrote that the parser could not read, in finished jobs, by task.",
            ["data_source"],
        )
        self.tamper = counter(
            "raas_judge_tamper",
            "Finished jobs a judge scored 0 because a twin of a deciding test passed, by task.",
            ["data_source"],
        )
        self.queue_seconds = histogram(
            "raas_job_queue_seconds", "Time a finished job spent waiting in stage queues."
        )
        self.tenant_submitted = tenant_counter(
            "raas_tenant_jobs_submitted", "Jobs accepted, by tenant.", ["tenant"]
        )
        self.tenant_finished = tenant_counter(
            "raas_tenant_jobs_finished", "Jobs finished, by tenant and state.", ["tenant", "state"]
        )
        self.tenant_stage_seconds = tenant_counter(
            "raas_tenant_stage_seconds", "Seconds inside stages, by tenant.", ["tenant", "stage"]
        )
        self.tenant_sandbox_seconds = tenant_counter(
            "raas_tenant_sandbox_seconds",
            "Seconds finished jobs held a sandbox (INIT to cleanup, every attempt), by tenant.",
            ["tenant"],
        )
        self.tenant_tokens = tenant_counter(
            "raas_tenant_llm_tokens",
            "LLM tokens of finished jobs by tenant: in (each call's prompt) and out (generated).",
            ["tenant", "direction"],
        )

    def watch(self, pipeline: Pipeline) -> None:
        self.registry.register(_PipelineGauges(pipeline))
        self.tenant_registry.register(_TenantGauges(pipeline))

    def watch_images(self, images: ImageStoreMonitor) -> None:
        self.registry.register(_ImageStoreGauges(images))

    def job_submitted(self, job: Job) -> None:
        self.submitted.labels(job.data_source).inc()
        self.tenant_submitted.labels(job.tenant).inc()

    def stage_ended(self, job: Job, stage: Stage, seconds: float) -> None:
        self.stage_seconds.labels(stage.value).observe(seconds)
        self.tenant_stage_seconds.labels(job.tenant, stage.value).inc(seconds)

    def job_finished(self, job: Job, state: JobState) -> None:
        self.finished.labels(state.value, job.data_source).inc()
        self.tenant_finished.labels(job.tenant, state.value).inc()
        self.tenant_sandbox_seconds.labels(job.tenant).inc(job.sandbox_s)
        tokens_in, tokens_out = job.llm_tokens()
        self.tenant_tokens.labels(job.tenant, "in").inc(tokens_in)
        self.tenant_tokens.labels(job.tenant, "out").inc(tokens_out)
        for error in job.attempt_errors:
            self.errors.labels(error.kind, job.data_source).inc()
        if job.ending is not None:
            self.errors.labels(job.ending.kind, job.data_source).inc()
        self.queue_seconds.observe(job.timing.queue_s)
        if job.result is not None:
            malformed = job.result.trajectory.malformed_tool_calls()
            self.malformed_tool_calls.labels(job.data_source).inc(malformed)
            if job.result.metrics.get("tamper"):
                self.tamper.labels(job.data_source).inc()

    def render(self, per_tenant: bool = True) -> bytes:
        """The exposition; ``per_tenant`` adds each tenant's series (for the admin)."""
        text = generate_latest(self.registry)
        return text + generate_latest(self.tenant_registry) if per_tenant else text


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
