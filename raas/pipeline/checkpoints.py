"""The result store as the book of agent jobs' checkpoints (raas.agent.checkpoints'
CheckpointBook): a TurnCheckpoint as a row of the store's, and back."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from raas.agent.checkpoints import TurnCheckpoint
from raas.store.sqlite import ResultStore

# The fields the store keeps in columns of their own; the rest is the row's data.
COLUMNS = ("job_id", "turn", "from_turn", "archive")
FIELDS = {f.name for f in dataclasses.fields(TurnCheckpoint)}


class StoredCheckpoints:
    def __init__(self, store: ResultStore) -> None:
        self.store = store

    def job_dir(self, job_id: str) -> Path:
        return self.store.checkpoint_dir(job_id)

    async def add_checkpoint(self, checkpoint: TurnCheckpoint) -> None:
        data = {k: v for k, v in dataclasses.asdict(checkpoint).items() if k not in COLUMNS}
        await self.store.add_checkpoint(
            checkpoint.job_id, checkpoint.from_turn, checkpoint.turn, checkpoint.archive, data
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
