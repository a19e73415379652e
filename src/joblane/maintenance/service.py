"""The one shape of every background service: validated config, run_once(), a jittered loop."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from .. import store
from ..lifecycle import sleep_unless
from ..migrations import lock_key
from ..rules import first_line, holder_name, holder_text, holds_horizon, horizon_holder
from ..store import Statement, Store


class Service:
    """Subclasses set ``name`` and implement ``_work(conn)``, which returns what the round did.

    ``run_once(conn)`` takes a transaction-scoped advisory lock for
    (schema, name): when another process holds it the call returns None
    at once, so however many workers run, one does the work at a time.
    ``run(pool, stopping)`` calls it every ``interval`` seconds, +-``jitter``.
    """

    name = "service"
    log = logging.getLogger("joblane.maintenance")

    def __init__(self, store: Store, *, interval: float, jitter: float = 0.2):
        if interval <= 0:
            raise ValueError(f"{self.name}: interval must be positive")
        if not 0 <= jitter < 1:
            raise ValueError(f"{self.name}: jitter must be in [0, 1)")
        self.store = store
        self.interval = interval
        self.jitter = jitter
        self.lock = lock_key(store.schema, self.name)
        self.runs = 0
        self.total = 0

    async def run_once(self, conn: Any) -> list | None:
        """Do one round on an asyncpg connection; None when another process holds the lock."""
        async with conn.transaction():
            if not await store.value(conn, self.store.try_service_lock(self.lock)):
                return None
            if self.horizon_pause is not None and await self.horizon_held(conn):
                self.behind = False
                done = []
            else:
                done = await self._work(conn)
        self.runs += 1
        self.total += len(done)
        return done

    async def _work(self, conn: Any) -> list:
        raise NotImplementedError

    async def _batches(self, conn: Any, stmt: Statement, batch: int, max_batches: int | None = None) -> list:
        """The rows of ``stmt`` (which handles at most ``batch`` rows a time) run until it handles fewer,
        or ``max_batches`` times; stopped at ``max_batches`` full batches, the service is ``behind``."""
        rows: list = []
        runs = 0
        self.behind = False
        while max_batches is None or runs < max_batches:
            got = await store.records(conn, stmt)
            rows.extend(got)
            runs += 1
            if len(got) < batch:
                return rows
        self.behind = True
        return rows

    # Pruners: a holder of vacuum's horizon this many seconds old pauses the round (run_once). Each row deleted
    # under it is a dead version no vacuum can remove until it ends, which every later round's walk
    # from the oldest finished row would step over again; history waits a little longer instead.
    horizon_pause: float | None = None
    _paused_by: dict[str, Any] | None = None

    async def holder(self, conn: Any) -> dict[str, Any] | None:
        """What holds vacuum's horizon now (rules.HORIZON_KEYS), or None."""
        return horizon_holder(await store.records(conn, self.store.horizon_holder()))

    async def horizon_held(self, conn: Any) -> bool:
        """Whether a session, slot or prepared transaction has held the horizon ``horizon_pause`` seconds
        or more (said once in the log when the pause begins, and when it ends)."""
        holder = await self.holder(conn)
        held = holds_horizon(holder, self.horizon_pause or 0)
        if held and (self._paused_by is None or self._paused_by["who"] != holder["who"]):
            self.log.warning("%s: %s holds back vacuum's horizon: deleting waits until it ends (a row deleted "
                             "now could not be vacuumed away)", self.name, holder_text(holder),
                             extra={"joblane": {"horizon": holder}})
            self._paused_by = holder
        elif not held and self._paused_by is not None:
            self.log.info("%s: the horizon moved on (%s no longer holds it): deleting again", self.name,
                          holder_name(self._paused_by))
            self._paused_by = None
        return held

    def starting(self) -> None:
        """Called once before the first round (a log line, say)."""

    report_level = logging.INFO  # the pruners, whose rounds follow each other while behind, log at DEBUG

    def report(self, done: list) -> None:
        """Log what a round did."""
        if done:
            self.log.log(self.report_level, "%s: %d rows%s", self.name, len(done),
                         " (more to do)" if self.behind else "")

    # Set by a round that stopped with work left (a pruner behind the rate of
    # the workers): the next round comes at once instead of an interval later.
    behind = False

    def next_delay(self) -> float:
        """Seconds until the next round."""
        if self.behind:
            return 0.01
        return self.interval * random.uniform(1 - self.jitter, 1 + self.jitter)

    async def run(self, pool: Any, stopping: asyncio.Event) -> None:
        self.starting()
        while not stopping.is_set():
            try:
                async with pool.acquire() as conn:
                    done = await self.run_once(conn)
                if done:
                    self.report(done)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("%s: %s", self.name, first_line(exc))
            await sleep_unless(stopping, self.next_delay())
