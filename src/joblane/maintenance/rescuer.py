"""Rescuer: running jobs whose lease expired (their worker died) go back to pending, or failed."""

from __future__ import annotations

from .service import Service


class Rescuer(Service):
    name = "rescuer"

    def __init__(self, queries, schema: str, *, interval: float = 10.0, batch: int = 1000, **kw):
        super().__init__(queries, schema, interval=interval, **kw)
        if batch < 1:
            raise ValueError("rescuer: batch must be at least 1")
        self.batch = batch

    async def _work(self, conn) -> list[tuple[int, str]]:
        rescued: list[tuple[int, str]] = []
        while True:
            rows = await conn.fetch(self.queries.rescue_expired, self.batch)
            rescued.extend((r[0], r[1]) for r in rows)
            if len(rows) < self.batch:
                return rescued
