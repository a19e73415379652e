"""Pruner: delete finished jobs (and their attempts) older than the retention; then finished batches
none of whose jobs are left, signals no job waited for, cached step results past their expiry (and
claims on a key whose job died), budget windows that ended longer ago than the longest window in use, and
the rows of delayed jobs that the claims promoted into their ready entries.

The tries of a generation of job ids (a partition of attempts) leave whole: once every job of the
generation finished longer ago than the retention, its partition is truncated, then detached and
dropped, each step in a short transaction of its own under a 100 ms lock_timeout."""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import store
from ..rules import first_line, holder_text, horizon_holder
from ..store import Store
from .service import Service

LOCK_NOT_AVAILABLE = "55P03"


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
        self.deferred_pruned = 0
        self.generations_dropped = 0
        self._generations_at: float | None = None  # monotonic time of the last round of generations

    # Seconds between rounds of generations (making the next ones, taking finished ones away). Each
    # round checks the jobs of every generation left, so it runs less often than the row pruning.
    generation_interval = 60.0

    async def run_once(self, conn: Any) -> list | None:
        """A round of row pruning (paused while the horizon is held), then, when due, a round of
        generations, which runs whatever the horizon: a TRUNCATE or DROP frees the space regardless."""
        done = await super().run_once(conn)
        if done is not None and (self._generations_at is None
                                 or time.monotonic() - self._generations_at >= self.generation_interval):
            self._generations_at = time.monotonic()
            try:
                await self.generations(conn)
            except Exception as exc:  # the round's row pruning is done and reported all the same
                self.log.warning("pruner: generations of attempts: %s", first_line(exc))
        return done

    async def generations(self, conn: Any) -> dict[str, str]:
        """Make the partitions of the coming generations, then take each generation whose jobs all
        finished past the retention away (truncated, then dropped). What each partition came to
        ('made', 'truncated', 'dropped', 'kept: ...', 'locked'), by name."""
        out: dict[str, str] = {}
        made = await self._step(conn, "attempts", self.store.ensure_attempt_generations())
        if made is None:
            return out
        if made:
            out["attempts"] = "made"
            self.log.info("pruner: %d new generation(s) of attempts made", made)
        for (part,) in await store.records(conn, self.store.attempt_generations()):
            result = await self._step(conn, part, self.store.retire_attempt_generation(
                part, self.retention, self.prune_failed))
            if result == "truncated":  # emptied; the detach and drop come in a transaction of their own
                result = await self._step(conn, part, self.store.retire_attempt_generation(
                    part, self.retention, self.prune_failed)) or "truncated"
            out[part] = result or "locked"
            if result == "dropped":
                self.generations_dropped += 1
                self.log.info("pruner: the tries of generation %s of attempts were dropped", part)
        return out

    async def _step(self, conn: Any, table: str, stmt: Any) -> Any:
        """Run ``stmt`` in a transaction of its own under the pruner's lock and a 100 ms lock_timeout.
        None when another process holds the pruner's lock or a lock on ``table`` was not to be had (said in
        the log with the session holding it); the step is tried again next round."""
        try:
            async with conn.transaction():
                if not await store.value(conn, self.store.try_service_lock(self.lock)):
                    return None
                await store.run(conn, self.store.short_lock_timeout())
                return await store.value(conn, stmt)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            holder = horizon_holder(await store.records(conn, self.store.lock_holder(table)))
            self.log.warning("pruner: %s is locked (%s): left for the next round", table,
                             holder_text(holder) if holder else first_line(exc),
                             extra={"joblane": {"lock_holder": holder}} if holder else None)
            return None

    async def _work(self, conn: Any) -> list[int]:
        """The ids of the jobs deleted."""
        stmt = self.store.prune_finished(self.retention, self.prune_failed, self.batch)
        pruned = [r[0] for r in await self._batches(conn, stmt, self.batch, self.max_batches)]
        if not self.behind:  # batches none of whose jobs are left, and signals no job waited for
            await store.records(conn, self.store.prune_flows(self.retention, self.batch))
            cache = await store.value(conn, self.store.prune_step_cache(self.batch))
            windows = await store.value(conn, self.store.prune_budget_usage(self.batch))
            # the rows of delayed jobs the claims have promoted into their ready entries
            deferred = await store.value(conn, self.store.prune_deferred(self.batch))
            self.cache_pruned += cache
            self.budget_windows_pruned += windows
            self.deferred_pruned += deferred
            if cache or windows:
                self.log.info("pruner: %d cached step results past their expiry, %d old budget windows removed",
                              cache, windows)
            self.behind = cache >= self.batch or windows >= self.batch or deferred >= self.batch
        return pruned
