"""Rescuer: running jobs whose lease expired (their worker died) go back to pending, or failed;
waits past their deadline time out."""

from __future__ import annotations

from typing import Any

from .. import store
from ..store import Store
from .service import Service


class Rescuer(Service):
    name = "rescuer"

    def __init__(self, store: Store, *, interval: float = 10.0, batch: int = 1000, **kw: Any):
        super().__init__(store, interval=interval, **kw)
        if batch < 1:
            raise ValueError("rescuer: batch must be at least 1")
        self.batch = batch

    async def _work(self, conn: Any) -> list[tuple[int, str]]:
        """(id, new state) of every job rescued."""
        rows = await self._batches(conn, self.store.rescue_expired(self.batch), self.batch)
        # waits past their deadline (WaitFor(timeout=...)): failed, or pending again, by their policy
        rows += await self._batches(conn, self.store.expire_waits(self.batch, f"{self.store.schema}_jobs"),
                                    self.batch)
        # registrations of workers and relays that died (a lease past its end, with a margin)
        await store.records(conn, self.store.prune_processes(self.interval))
        return [(r[0], r[1]) for r in rows]
