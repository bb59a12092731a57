"""Jobs, their states, the three stage pools, budgets and cancellation."""

from raas.pipeline.config import PipelineConfig
from raas.pipeline.errors import (
    Draining,
    InitQueueFull,
    JobIdConflict,
    QuotaExceeded,
    RequestRejected,
    StoreUnavailable,
    SubmitError,
)
from raas.pipeline.job import Job, JobRequest
from raas.pipeline.observer import PipelineObserver
from raas.pipeline.pipeline import Pipeline
from raas.pipeline.states import TRANSITIONS, BadTransition, JobState, Phase, Stage
from raas.pipeline.tenants import TenantPolicies, policies_from, policies_of
from raas.pipeline.views import JobView

__all__ = [
    "TRANSITIONS",
    "BadTransition",
    "Draining",
    "InitQueueFull",
    "Job",
    "JobIdConflict",
    "JobRequest",
    "JobState",
    "JobView",
    "Phase",
    "Pipeline",
    "PipelineConfig",
    "PipelineObserver",
    "QuotaExceeded",
    "RequestRejected",
    "Stage",
    "StoreUnavailable",
    "SubmitError",
    "TenantPolicies",
    "policies_from",
    "policies_of",
]
