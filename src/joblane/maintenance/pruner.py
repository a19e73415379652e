"""Pruner: delete finished jobs (and their attempts) older than the retention."""

from __future__ import annotations

from .service import Service


class Pruner(Service):
    name = "pruner"

    def __init__(self, queries, schema: str, *, retention: float = 7 * 86400.0, prune_failed: bool = False,
                 interval: float = 60.0, batch: int = 5000, **kw):
        super().__init__(queries, schema, interval=interval, **kw)
        if retention < 0:
            raise ValueError("pruner: retention must be >= 0 seconds")
        self.retention = float(retention)
        self.prune_failed = prune_failed
        self.batch = batch
        self.max_batches = 20

    async def _work(self, conn) -> list[int]:
        pruned: list[int] = []
        for _ in range(self.max_batches):
            rows = await conn.fetch(self.queries.prune_finished, self.retention, self.prune_failed, self.batch)
            pruned.extend(r[0] for r in rows)
            if len(rows) < self.batch:
                break
        return pruned
