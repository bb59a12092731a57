"""How big each stage is and how long a job may take, by stage: built from the settings'
``pipeline`` group (``raas.settings.PipelineSettings``), which holds every default of these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raas.pipeline.states import Stage
from raas.pipeline.tenants import TenantPolicies, every_tenant_alike
from raas.settings import PipelineSettings


def _per_stage(settings: PipelineSettings, suffix: str) -> dict[Stage, Any]:
    return {stage: getattr(settings, f"{stage.value}_{suffix}") for stage in Stage}


def _default(name: str) -> Any:
    """A setting's default, from ``PipelineSettings`` (none is written here)."""
    return PipelineSettings.model_fields[name].get_default(call_default_factory=True)


@dataclass
class PipelineConfig:
    workers: dict[Stage, int] = field(
        default_factory=lambda: _per_stage(PipelineSettings(), "workers")
    )
    # How many jobs may wait for each stage. A full INIT queue turns submissions away (429); a
    # full RUN or EVAL queue makes the stage before it take no more jobs (backpressure: a job is
    # taken with its place in the next queue reserved), so a slow EVAL cannot pile up unbounded
    # jobs, each holding a sandbox.
    queue_size: dict[Stage, int] = field(
        default_factory=lambda: _per_stage(PipelineSettings(), "queue")
    )
    # Budget of stage time per job (queue waits do not count); a request may set its own.
    job_timeout_s: float | None = field(default_factory=lambda: _default("timeout_s"))
    stage_timeout_s: dict[Stage, float | None] = field(
        default_factory=lambda: _per_stage(PipelineSettings(), "timeout_s")
    )
    # How long a cancelled stage may take to stop before it is abandoned.
    cancel_grace_s: float = field(default_factory=lambda: _default("cancel_grace_s"))
    max_attempts: int = field(default_factory=lambda: _default("max_attempts"))
    # Not settings: how the pipeline works, not how big it is.
    cleanup_timeout_s: float = 60.0
    retry_after_s: int = 1
    # While the result store cannot write (a full disk): how often a held result is tried
    # again, and (rounded up) the Retry-After of a submission refused for it.
    store_retry_s: float = 2.0
    # Each tenant's weight and quotas (raas.pipeline.tenants), asked at each decision; replace it
    # (Pipeline.set_tenants) when the settings are read again.
    tenants: TenantPolicies = every_tenant_alike

    def __post_init__(self) -> None:
        for stage in Stage:
            if self.workers.get(stage, 0) < 1:
                raise ValueError(f"{stage}_workers must be at least 1")
            if self.queue_size.get(stage, 0) < 1:
                raise ValueError(f"{stage}_queue must be at least 1")
            self.stage_timeout_s.setdefault(stage, None)
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    @classmethod
    def from_settings(cls, settings: PipelineSettings) -> PipelineConfig:
        """The one place the settings' ``pipeline`` group becomes the pipeline's config."""
        return cls(
            workers=_per_stage(settings, "workers"),
            queue_size=_per_stage(settings, "queue"),
            job_timeout_s=settings.timeout_s,
            stage_timeout_s=_per_stage(settings, "timeout_s"),
            cancel_grace_s=settings.cancel_grace_s,
            max_attempts=settings.max_attempts,
        )
