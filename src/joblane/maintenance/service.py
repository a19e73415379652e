"""The one shape of every background service: validated config, run_once(), a jittered loop."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from ..migrations import lock_key

log = logging.getLogger("joblane.maintenance")


class Service:
    """Subclasses set ``name`` and implement ``_work(conn)``.

    ``run_once(conn)`` takes a transaction-scoped advisory lock for
    (schema, name): when another process holds it the call returns None
    at once, so however many workers run, one does the work at a time.
    """

    name = "service"

    def __init__(self, queries: Any, schema: str, *, interval: float, jitter: float = 0.2):
        if interval <= 0:
            raise ValueError(f"{self.name}: interval must be positive")
        if not 0 <= jitter < 1:
            raise ValueError(f"{self.name}: jitter must be in [0, 1)")
        self.queries = queries
        self.schema = schema
        self.interval = interval
        self.jitter = jitter
        self.lock = lock_key(schema, self.name)
        self.runs = 0
        self.total = 0

    async def run_once(self, conn) -> list | None:
        """Do one round on an asyncpg connection; None when another process holds the lock."""
        async with conn.transaction():
            if not await conn.fetchval(self.queries.try_service_lock, self.lock):
                return None
            done = await self._work(conn)
        self.runs += 1
        self.total += len(done)
        return done

    async def _work(self, conn) -> list:
        raise NotImplementedError

    async def run(self, pool, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                async with pool.acquire() as conn:
                    done = await self.run_once(conn)
                if done:
                    log.info("%s: %d rows", self.name, len(done))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: %s", self.name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            delay = self.interval * random.uniform(1 - self.jitter, 1 + self.jitter)
            try:
                await asyncio.wait_for(stopping.wait(), delay)
            except asyncio.TimeoutError:
                pass
