"""Jobs, their states, the three stage pools, budgets and cancellation."""

from raas.pipeline.config import PipelineConfig
from raas.pipeline.errors import (
    Draining,
    JobIdConflict,
    Overloaded,
    QuotaExceeded,
    RequestRejected,
    StoreUnavailable,
    SubmitError,
)
from raas.pipeline.job import Job, JobRequest
from raas.pipeline.pipeline import JobView, Pipeline, PipelineObserver
from raas.pipeline.states import JobState, Stage
from raas.pipeline.tenants import TenantPolicies, policies_from, policies_of

__all__ = [
    "Draining",
    "Job",
    "JobIdConflict",
    "JobRequest",
    "JobState",
    "JobView",
    "Overloaded",
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
