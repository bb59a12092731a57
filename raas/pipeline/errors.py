"""Why a submission is turned away (these are request errors, never job failures)."""

from __future__ import annotations


class SubmitError(Exception):
    pass


class InitQueueFull(SubmitError):
    """The INIT queue has no room for a tenant's new jobs (a 429; a client sees any 429 as
    raas.client's Overloaded)."""

    def __init__(self, retry_after_s: int, room: int, wanted: int) -> None:
        super().__init__(
            f"the INIT queue is full ({room} places left to this tenant, {wanted} wanted);"
            " retry later"
        )
        self.retry_after_s = retry_after_s


class QuotaExceeded(SubmitError):
    """A tenant's submission would go over one of its quotas: nothing of it was accepted."""

    def __init__(self, tenant: str, quota: str, retry_after_s: int, detail: str) -> None:
        super().__init__(f"tenant {tenant!r} is over its {quota} quota ({detail}); retry later")
        self.tenant = tenant
        self.quota = quota
        self.retry_after_s = retry_after_s


class Draining(SubmitError):
    def __init__(self, shutting_down: bool = False) -> None:
        super().__init__(
            "the service is shutting down and accepts no new jobs"
            if shutting_down
            else "the service is draining and accepts no new jobs (POST /start resumes)"
        )


class StoreUnavailable(SubmitError):
    """The result store cannot write (a full disk, an I/O error): nothing was accepted, since a
    job is accepted only once its record is written."""

    def __init__(self, retry_after_s: int, reason: str) -> None:
        super().__init__(f"the service cannot record new jobs now ({reason}); retry later")
        self.retry_after_s = retry_after_s


class JobIdConflict(SubmitError):
    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job_id {job_id!r} was already submitted with a different instance or"
            " sampling_params; resubmit the same request or use a new job_id"
        )
        self.job_id = job_id


class RequestRejected(SubmitError):
    """Request ``index`` of a submission is bad input; ``cause`` says which field and why."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(f"request {index}: {cause}")
        self.index = index
        self.cause = cause
