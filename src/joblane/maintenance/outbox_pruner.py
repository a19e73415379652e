"""Outbox pruner: delete outbox rows sent longer ago than the retention; one relay at a time does it."""

from __future__ import annotations

import logging
from typing import Any

from ..store import Store
from .service import Service


class OutboxPruner(Service):
    """Deletes sent outbox rows in short rounds; behind, the next round comes at once (as the job Pruner)."""

    name = "outbox-pruner"
    max_batches = 4  # per round: short transactions, many rounds when behind
    report_level = logging.DEBUG
    horizon_pause = 60.0  # see Service.horizon_held

    def __init__(self, store: Store, *, retention: float, interval: float = 10.0, batch: int = 5000, **kw: Any):
        super().__init__(store, interval=interval, **kw)
        if retention < 0:
            raise ValueError("outbox pruner: retention must be >= 0 seconds")
        self.retention = float(retention)
        self.batch = batch

    async def _work(self, conn: Any) -> list[int]:
        """The ids of the rows deleted."""
        stmt = self.store.prune_outbox(self.retention, self.batch)
        return [r[0] for r in await self._batches(conn, stmt, self.batch, self.max_batches)]
