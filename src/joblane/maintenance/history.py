"""History: roll each closed hour of attempts up once (per queue, kind and outcome; latency histograms)."""

from __future__ import annotations

from typing import Any

from .. import store
from ..store import Store
from .service import Service

WEEK_HOURS = 7 * 24


class History(Service):
    """Rolls up the closed hours of the last week that are not rolled up yet, oldest first.

    An hour is closed ``settle`` seconds after it ends (a try that finished
    in it has committed by then). A round rolls up at most ``max_hours``
    hours, each one statement (its attempts joined to their jobs), and comes
    back at once while there are more (``behind``): a first start on a big
    history catches up in short transactions. Roll-ups older than ``keep``
    seconds are deleted.
    """

    name = "history"

    def __init__(self, store: Store, *, interval: float = 60.0, settle: float = 120.0, max_hours: int = 4,
                 keep: float = 35 * 86400.0, **kw: Any):
        super().__init__(store, interval=interval, **kw)
        if settle < 0 or max_hours < 1 or keep < WEEK_HOURS * 3600:
            raise ValueError("history: settle >= 0, max_hours >= 1, keep at least a week")
        self.settle = float(settle)
        self.max_hours = max_hours
        self.keep = float(keep)

    async def _work(self, conn: Any) -> list[Any]:
        """The hours rolled up."""
        hours = [r[0] for r in await store.records(conn, self.store.history_hours_todo(self.settle, WEEK_HOURS,
                                                                                      self.max_hours + 1))]
        self.behind = len(hours) > self.max_hours
        done = []
        for hour in hours[:self.max_hours]:
            await store.records(conn, self.store.history_rollup(hour))
            done.append(hour)
        await store.records(conn, self.store.history_prune(self.keep))
        return done
