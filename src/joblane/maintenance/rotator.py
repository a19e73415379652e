"""Rotator: turns the ring of ``ready`` and ``cursors`` and empties the slots no claim can need again.

The claim reads jobs from a cursor per lane (migration 0013). Its entries and
cursor rows are appended, never deleted one by one: the ring has four slots,
the rows go into the current one, and a slot left behind is emptied with
TRUNCATE once every transaction that wrote into it has ended and every lane
with entries there is claimed past them. TRUNCATE gives the space back
whatever snapshot another session holds; it waits at most 100 ms for the
slot's lock, and a slot it cannot take is left for the next round.
"""

from __future__ import annotations

from typing import Any

from .. import store
from ..errors import JoblaneError
from ..store import Store
from .service import Service


class Rotator(Service):
    name = "rotator"

    def __init__(self, store: Store, *, turn_every: float = 10.0, interval: float | None = None, **kw: Any):
        if not turn_every > 0:
            raise JoblaneError("ring_turn_seconds must be a positive number of seconds")
        # a slot left behind is emptied on a later round: every 2 s, or twice a turn when turns are quicker
        super().__init__(store, interval=min(2.0, turn_every / 2) if interval is None else interval, **kw)
        self.turn_every = turn_every
        self.waiting: str | None = None  # why the oldest slot left behind is not emptied yet, if it is not

    async def _work(self, conn: Any) -> list[str]:
        """What the round did: 'turned to slot N', 'cleared slot N', or why a slot waits."""
        done = list(await store.value(conn, self.store.rotate_ready(self.turn_every)) or [])
        waits = [d for d in done if " wait" in d or "in use" in d]
        if waits and waits[0] != self.waiting:
            self.log.info("%s: %s", self.name, waits[0])
        self.waiting = waits[0] if waits else None
        return [d for d in done if d.startswith(("turned", "cleared"))]

    def report(self, done: list) -> None:
        if done:
            self.log.debug("%s: %s", self.name, "; ".join(done))
