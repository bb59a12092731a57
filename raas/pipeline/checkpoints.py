"""The result store as the book of agent jobs' checkpoints (raas.agent.checkpoints'
CheckpointBook): a TurnCheckpoint as a row of the store's, and back, within its tenant's
``max_checkpoint_mb``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raas.agent.checkpoints import TurnCheckpoint
from raas.store.sqlite import ResultStore
from raas.tenants import tenant_of

# The fields the store keeps in columns of their own; the rest is the row's data.
COLUMNS = ("job_id", "turn", "from_turn", "archive")


class OverTenantQuota(RuntimeError):
    """A checkpoint would put its tenant's jobs over its ``max_checkpoint_mb``: not kept."""


def no_caps(tenant: str) -> float | None:
    return None


FIELDS = {f.name for f in dataclasses.fields(TurnCheckpoint)}


class StoredCheckpoints:
    def __init__(self, store: ResultStore, cap_mb: Callable[[str], float | None] = no_caps) -> None:
        self.store = store
        # A tenant's max_checkpoint_mb (None: no cap): asked at each checkpoint, so that a
        # reloaded tenants file holds from the next one.
        self.cap_mb = cap_mb

    def job_dir(self, job_id: str) -> Path:
        return self.store.checkpoint_dir(job_id)

    async def add_checkpoint(self, checkpoint: TurnCheckpoint) -> None:
        # Shallow: the row's parts are its own already (the trajectory's part is a fresh copy),
        # and asdict's deep copy of every token list cost ~0.6 ms a turn on the event loop.
        data = {f: getattr(checkpoint, f) for f in FIELDS if f not in COLUMNS}
        cap = self.cap_mb(tenant_of(checkpoint.job_id))
        kept = await self.store.add_checkpoint(
            checkpoint.job_id,
            checkpoint.from_turn,
            checkpoint.turn,
            checkpoint.archive,
            data,
            size=checkpoint.size,
            tenant_cap=None if cap is None else int(cap * 2**20),
        )
        if not kept:
            raise OverTenantQuota(
                "not kept: its tenant's max_checkpoint_mb is held by its jobs' checkpoints, or"
                " the job has finished"
            )

    async def checkpoints(self, job_id: str) -> list[TurnCheckpoint]:
        found = []
        for row in await self.store.checkpoints(job_id):
            checkpoint = _row(job_id, row)
            if checkpoint is not None:
                found.append(checkpoint)
        return found


def _row(job_id: str, row: dict[str, Any]) -> TurnCheckpoint | None:
    """A row as a TurnCheckpoint; None where its data is not one (a row of another raas)."""
    try:
        return TurnCheckpoint(**{**{k: v for k, v in row.items() if k in FIELDS}, "job_id": job_id})
    except TypeError:
        return None
