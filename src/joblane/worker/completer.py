"""The completer: outcomes written in bulk, each guarded by the state it expects.

One ``complete_jobs`` statement finishes a whole batch and writes its
``attempts`` rows; a row changes only while its job is still ``running``
this attempt for this worker, so an outcome that arrives after its job was
rescued, cancelled or re-claimed elsewhere is a no-op (counted as
``stale``). ``put`` is the same call however outcomes are batched: the
Batcher coalesces them on size or a short timer, applies backpressure,
retries a failed flush and drains on shutdown.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

from .. import store
from ..store import Store, outcome_rows
from ..types import Outcome
from .batcher import Batcher

log = logging.getLogger("joblane.worker")


class Completer:
    """Writes the outcomes of worker ``name`` in batches of up to ``flush_size``, at most two flushes in flight.

    ``stats`` counts what was written, by outcome, and the stale outcomes.
    """

    def __init__(self, store: Store, name: str, stats: Counter[str], *, flush_size: int = 500,
                 flush_interval: float = 0.002):
        self.store = store
        self.name = name
        self.stats = stats
        self._pool: Any = None
        # two flushes in flight: while one batch is written, the next can be, on another connection
        self.batcher: Batcher[Outcome] = Batcher(self.write, max_size=flush_size, max_wait=flush_interval,
                                                 max_in_flight=2, name="completer")
        # tries that ended in WaitFor: parked by their own statement (park_jobs), never by complete_jobs
        self.waits: Batcher[Outcome] = Batcher(self.park, max_size=flush_size, max_wait=flush_interval,
                                               name="completer-waits")

    def start(self, pool: Any) -> None:
        self._pool = pool
        self.batcher.start()
        self.waits.start()

    async def put(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for the next batch (waits while too many are queued)."""
        if outcome.wait is not None:
            await self.waits.put(outcome)
            return
        await self.batcher.put(outcome)

    @property
    def pending(self) -> list[Outcome]:
        """Outcomes not yet written (queued or in a flush under way)."""
        return self.batcher.pending + self.waits.pending

    @property
    def backlogged(self) -> bool:
        """True while so many outcomes wait that the worker should stop claiming."""
        return self.batcher.backlogged

    def on_room(self, callback) -> None:
        """Call ``callback`` when a backlog of outcomes ends (a worker that stopped claiming may go on)."""
        self.batcher.on_room = callback

    async def close(self, timeout: float | None = None) -> bool:
        """Write what is queued; True when everything was written within ``timeout``."""
        closed = await self.batcher.close(timeout=timeout)
        return await self.waits.close(timeout=timeout) and closed

    async def park(self, batch: list[Outcome]) -> list[int]:
        """Park the jobs of ``batch`` (tries that raised WaitFor) in one statement; the ids that applied."""
        document = json.dumps([{"id": o.job_id, "attempt": o.attempt, "key": o.wait, "timeout": o.timeout,
                                "on_timeout": o.on_timeout, "started_at": o.started_at, "finished_at": o.finished_at,
                                "meta": None if o.meta is None else json.loads(o.meta)} for o in batch])
        async with self._pool.acquire() as conn:
            applied = await store.records(conn, self.store.park_jobs(document, self.name))
        for o in batch:
            self.stats[o.outcome] += 1
        if len(applied) < len(batch):
            self.stats["stale"] += len(batch) - len(applied)
        return [r[0] for r in applied]

    async def write(self, batch: list[Outcome]) -> list[int]:
        """Write ``batch`` (one statement per kind of write); returns the ids of the jobs whose outcome applied."""
        lean = [o for o in batch if o.lean]
        full = [o for o in batch if not o.lean] if lean else batch
        async with self._pool.acquire() as conn:
            applied = []
            if full:
                applied = [r[0] for r in await store.records(conn, self.store.complete_jobs(outcome_rows(full),
                                                                                             self.name))]
            if lean:
                costs = [o for o in lean if o.meta is not None]
                if costs:  # what the tries recorded (their cost) goes on their budget holds and starts first
                    await store.run(conn, self.store.settle_lean_costs(
                        "[" + ",".join(f'{{"id":{o.job_id},"attempt":{o.attempt},"meta":{o.meta}}}' for o in costs)
                        + "]"))
                applied += [r[0] for r in await store.records(conn, self.store.delete_done(
                    [o.job_id for o in lean], [o.attempt for o in lean], self.name))]
            skipped = len(batch) - len(applied)
            noted: list = []
            if skipped:
                # the job was rescued or cancelled while the task ran on: keep what it did on that try's
                # attempts row (meta.late), so a run that happened leaves a trace
                done = set(applied)
                late = [o for o in batch if o.job_id not in done]
                noted = await store.records(conn, self.store.note_late_outcomes(outcome_rows(late), self.name))
        for o in batch:
            self.stats[o.outcome] += 1
        if skipped:
            self.stats["stale"] += skipped
        if noted:
            log.warning("completer: %d outcomes arrived after their job was rescued or cancelled (jobs %s); "
                        "kept on their attempts rows as meta.late", len(noted),
                        ", ".join(str(r[0]) for r in noted[:10]))
        return applied
