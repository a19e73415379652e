"""Pruner: delete finished jobs (and their attempts) older than the retention; then finished batches
none of whose jobs are left, signals no job waited for, cached step results past their expiry (and
claims on a key whose job died), and budget windows that ended longer ago than the longest window in use."""

from __future__ import annotations

import logging
from typing import Any

from .. import store
from ..store import Store
from .service import Service


class Pruner(Service):
    """Deletes history in rounds of at most ``max_batches`` batches, one transaction each.

    A round that deletes all it may has more to do: the next one comes at
    once (``behind``), so the pruner keeps up with any rate the workers
    reach, in short transactions that let autovacuum reuse the space as it
    goes. ``total`` counts the jobs deleted (a metric).
    """

    name = "pruner"
    max_batches = 4  # per round: short transactions, many rounds when behind
    report_level = logging.DEBUG
    horizon_pause = 60.0  # see Service.horizon_held

    def __init__(self, store: Store, *, retention: float = 7 * 86400.0, prune_failed: bool = False,
                 interval: float = 10.0, batch: int = 5000, **kw: Any):
        super().__init__(store, interval=interval, **kw)
        if retention < 0:
            raise ValueError("pruner: retention must be >= 0 seconds")
        self.retention = float(retention)
        self.prune_failed = prune_failed
        self.batch = batch
        self.cache_pruned = 0
        self.budget_windows_pruned = 0

    async def _work(self, conn: Any) -> list[int]:
        """The ids of the jobs deleted."""
        stmt = self.store.prune_finished(self.retention, self.prune_failed, self.batch)
        pruned = [r[0] for r in await self._batches(conn, stmt, self.batch, self.max_batches)]
        if not self.behind:  # batches none of whose jobs are left, and signals no job waited for
            await store.records(conn, self.store.prune_flows(self.retention, self.batch))
            cache = await store.value(conn, self.store.prune_step_cache(self.batch))
            windows = await store.value(conn, self.store.prune_budget_usage(self.batch))
            self.cache_pruned += cache
            self.budget_windows_pruned += windows
            if cache or windows:
                self.log.info("pruner: %d cached step results past their expiry, %d old budget windows removed",
                              cache, windows)
                self.behind = cache >= self.batch or windows >= self.batch
        return pruned
