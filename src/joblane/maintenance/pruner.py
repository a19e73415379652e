"""Pruner: delete finished jobs (and their attempts) older than the retention."""

from __future__ import annotations

from typing import Any

from ..store import Store
from .service import Service


class Pruner(Service):
    name = "pruner"
    max_batches = 20  # per round, so one round never holds the lock for long

    def __init__(self, store: Store, *, retention: float = 7 * 86400.0, prune_failed: bool = False,
                 interval: float = 60.0, batch: int = 5000, **kw: Any):
        super().__init__(store, interval=interval, **kw)
        if retention < 0:
            raise ValueError("pruner: retention must be >= 0 seconds")
        self.retention = float(retention)
        self.prune_failed = prune_failed
        self.batch = batch

    async def _work(self, conn: Any) -> list[int]:
        """The ids of the jobs deleted."""
        stmt = self.store.prune_finished(self.retention, self.prune_failed, self.batch)
        return [r[0] for r in await self._batches(conn, stmt, self.batch, self.max_batches)]
