"""Tenants: who shares a server, each with its API keys, a weight and quotas.

A server given a tenants file (``--tenants-file FILE``, ``RAAS_TENANTS_FILE``; TOML, or JSON when
the name ends in ``.json``) takes each tenant's keys besides its own API key, which is the
admin's: the admin sees every job. A tenant sees only its own jobs; its job ids are its own
namespace, so two tenants' ``cd-7`` are two jobs. The file holds no secret: each key is named
by its SHA-256 digest (``printf %s "$KEY" | sha256sum``), so the file may be readable by all::

    [tenants.alice]
    key_sha256 = ["<64 hex digits>"]   # one or more keys
    weight = 2.0                       # share of the stage pools against the others (> 0)
    [tenants.alice.quotas]
    max_jobs_in_flight = 500
    max_timeout_s = 3600               # no job of hers asks a longer timeout_s

Inside the server a tenant's job is known by a key that joins the tenant and its id with ``~``
(a character a job id cannot hold, so no id of one namespace is a key of another): ``alice~cd-7``.
The admin's own jobs (tenant ``default``, as on a server without tenants) keep their ids as
they are.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

DEFAULT_TENANT = "default"  # the admin's own jobs, and every job of a server without tenants
SEPARATOR = "~"
TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
KeyDigest = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$", strip_whitespace=True, to_lower=True)
]


class TenantsFileError(ValueError):
    """A tenants file that cannot be used, in one line naming the file and the field."""


class Quotas(BaseModel):
    """Limits on a tenant's use of the fleet (enforced by the scheduler; None: no limit).

    ``max_sandboxes`` counts its jobs from INIT to cleanup and its kept snapshots (each an idle
    sandbox); ``max_snapshots`` lowers the server's ``max_snapshots`` for it (its snapshots are
    evicted by its own new ones only); the token quotas are reserved at admission (each job's
    ceiling) and settled at its end (raas.pipeline.tenants); ``max_timeout_s`` refuses a job
    asking a longer ``timeout_s`` and is the budget of one asking none; ``max_checkpoint_mb``
    caps what its jobs in flight keep of their turn boundaries on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_jobs_in_flight: int | None = Field(default=None, ge=1)
    max_sandboxes: int | None = Field(default=None, ge=1)
    max_snapshots: int | None = Field(default=None, ge=0)
    llm_tokens_per_s: float | None = Field(default=None, gt=0)
    llm_tokens_per_day: float | None = Field(default=None, gt=0)
    max_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # The disk its jobs' checkpoints may hold together (raas.agent.checkpoints); past it, a
    # job's later turns are not checkpointed.
    max_checkpoint_mb: float | None = Field(default=None, gt=0, allow_inf_nan=False)


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's weight (its share of each stage's slots while others wait too) and quotas
    (the tenants file's: jobs in flight refuse a submission, sandboxes hold jobs back in the
    INIT queue, LLM tokens per second, averaged over a minute, or per day refuse one). What the
    pipeline is told of a tenant (raas.pipeline.tenants)."""

    weight: float = 1.0
    quotas: Quotas = field(default_factory=Quotas)

    def __post_init__(self) -> None:
        if not self.weight > 0 or not math.isfinite(self.weight):
            raise ValueError(f"a tenant's weight must be a positive number, not {self.weight}")


@dataclass(frozen=True)
class Tenant:
    name: str
    key_sha256: tuple[str, ...]  # digests of its API keys
    policy: TenantPolicy = field(default_factory=TenantPolicy)


class TenantEntry(BaseModel):
    """A tenant as the file writes it (its name is the table's)."""

    model_config = ConfigDict(extra="forbid")

    key_sha256: Annotated[list[KeyDigest], Field(min_length=1)]
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    quotas: Quotas = Field(default_factory=Quotas)


class TenantsFile(BaseModel):
    """The tenants file, whole: what load_tenants reads and what a test or a benchmark writes."""

    model_config = ConfigDict(extra="forbid")

    tenants: dict[TenantName, TenantEntry]


def key_digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


class Tenants:
    """The tenants of one reading of the file, and which of them a key belongs to."""

    def __init__(self, tenants: list[Tenant]) -> None:
        self.by_name = {t.name: t for t in tenants}
        self._by_digest = [(d.encode(), t) for t in tenants for d in t.key_sha256]

    def of_key(self, key: bytes) -> Tenant | None:
        """The tenant ``key`` belongs to; every digest is compared (in constant time), so the
        time taken says nothing of which matched."""
        digest = key_digest(key).encode()
        found = None
        for known, tenant in self._by_digest:
            if hmac.compare_digest(digest, known):
                found = tenant
        return found

    def digests(self) -> list[tuple[str, Tenant]]:
        """Each key's digest and its tenant (the dashboard's cookies are made from them)."""
        return [(d.decode(), t) for d, t in self._by_digest]

    def __len__(self) -> int:
        return len(self.by_name)


def load_tenants(path: Path) -> Tenants:
    """The tenants of the file at ``path``; TenantsFileError in one line naming the field."""
    try:
        raw = path.read_bytes()
        data: Any = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError, ValueError) as e:  # TOML's and JSON's errors are these
        raise TenantsFileError(f"tenants file {path}: cannot read it: {_one_line(e)}") from e
    try:
        parsed = TenantsFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(the file)"
        raise TenantsFileError(f"tenants file {path}: {where}: {err['msg']}") from e
    if DEFAULT_TENANT in parsed.tenants:
        raise TenantsFileError(
            f"tenants file {path}: tenants.{DEFAULT_TENANT}: the name is the admin's own"
            " (RAAS_API_KEY's jobs): give the tenant another"
        )
    seen: dict[str, str] = {}
    for name, entry in parsed.tenants.items():
        for digest in entry.key_sha256:
            if digest in seen:
                raise TenantsFileError(
                    f"tenants file {path}: tenants.{name}.key_sha256: a key of tenant"
                    f" {seen[digest]} too (a key belongs to one tenant)"
                )
            seen[digest] = name
    return Tenants(
        [
            Tenant(name, tuple(e.key_sha256), TenantPolicy(e.weight, e.quotas))
            for name, e in parsed.tenants.items()
        ]
    )


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def job_key(tenant: str, job_id: str) -> str:
    """The server's key of ``tenant``'s job ``job_id``: unique across tenants."""
    return job_id if tenant == DEFAULT_TENANT else f"{tenant}{SEPARATOR}{job_id}"


def tenant_of(key: str) -> str:
    """The tenant whose job ``key`` is."""
    tenant, sep, _ = key.partition(SEPARATOR)
    return tenant if sep else DEFAULT_TENANT


def own_id(key: str) -> str:
    """The id a job's own tenant knows it by."""
    return key.partition(SEPARATOR)[2] or key
