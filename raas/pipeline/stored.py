"""A job's request as its record keeps it, and read back (a restart's recovery, a resubmission
of a known job_id): the wire's RolloutRequest as JSON, its tenant in the record's own column."""

from __future__ import annotations

from typing import Any

from raas.pipeline.job import JobRequest
from raas.store.records import JobRecord
from raas.tenants import own_id
from raas.wire import RolloutRequest


def as_stored(request: JobRequest) -> dict[str, Any]:
    """What the record keeps of ``request``: every field of its RolloutRequest, ids its tenant's."""
    return request.rollout.model_dump(mode="json")


def request_of(record: JobRecord) -> JobRequest:
    """The request ``record`` keeps, validated as the wire validates one: a ValidationError when
    it is no longer a valid request."""
    data = record.request
    if "job_id" not in data:  # a row written field by field, before the request was kept whole
        data = _fields_kept_before(data, record.job_id)
    return JobRequest(RolloutRequest.model_validate(data), record.tenant)


def _fields_kept_before(data: dict[str, Any], key: str) -> dict[str, Any]:
    """A RolloutRequest's fields of an older row: it kept no job_id (the record's key is it), the
    group and a branch's parent as the server's keys, and the tenant beside them (the record's
    tenant column has it too)."""
    fields = {k: v for k, v in data.items() if k in RolloutRequest.model_fields}
    fields["job_id"] = own_id(key)
    if isinstance(fields.get("group"), str):
        fields["group"] = own_id(fields["group"])
    branch = fields.get("branch")
    if isinstance(branch, dict) and isinstance(branch.get("job_id"), str):
        fields["branch"] = {**branch, "job_id": own_id(branch["job_id"])}
    return fields
