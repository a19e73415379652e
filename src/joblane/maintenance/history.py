"""History: roll the attempts up once per slice of time, for the dashboard's history page."""

from __future__ import annotations

import logging
from typing import Any

from .. import store
from ..store import Store
from .service import Service

WEEK_HOURS = 7 * 24


class History(Service):
    """Rolls up what the last week's slices of attempts hold, oldest first.

    An hour before the last one that nothing covers yet (a first start, a
    worker that was down) is rolled up whole, unless it ends before the
    oldest attempt (nothing to roll up); the current and the last hour
    go in five-minute slices, so a page (the 1 h window too) reads the
    attempts of a few minutes at most; once an hour before the last one has
    all twelve, they are merged into one. A slice is
    closed ``settle`` seconds after it ends (a try that finished in it has
    committed by then). A round rolls up at most ``max_slices`` slices and
    comes back at once while there are more (``behind``): a first start on a
    big history catches up in short transactions. Roll-ups older than
    ``keep`` seconds are deleted.
    """

    name = "history"
    report_level = logging.DEBUG  # a round every few minutes, rows rolled up: nothing for an operator to act on

    def __init__(self, store: Store, *, interval: float = 30.0, settle: float = 60.0, max_slices: int = 6,
                 keep: float = 35 * 86400.0, **kw: Any):
        super().__init__(store, interval=interval, **kw)
        if settle < 0 or max_slices < 1 or keep < WEEK_HOURS * 3600:
            raise ValueError("history: settle >= 0, max_slices >= 1, keep at least a week")
        self.settle = float(settle)
        self.max_slices = max_slices
        self.keep = float(keep)

    async def _work(self, conn: Any) -> list[Any]:
        """The starts of the slices rolled up."""
        done: list[Any] = []
        await store.run(conn, self.store.history_no_jit())
        hours = [r[0] for r in await store.records(conn, self.store.history_hours_todo(WEEK_HOURS, self.max_slices + 1))]
        for start in hours[:self.max_slices]:
            await store.records(conn, self.store.history_rollup(start, 3600))
            done.append(start)
        left = self.max_slices - len(done)
        minutes = [r[0] for r in await store.records(
            conn, self.store.history_minutes_todo(self.settle, WEEK_HOURS, left + 1))] if left else []
        for start in minutes[:left]:
            await store.records(conn, self.store.history_rollup(start, 300))
            done.append(start)
        self.behind = len(hours) > self.max_slices or len(minutes) > left or (not left and bool(hours))
        for (hour,) in await store.records(conn, self.store.history_full_hours()):
            await store.records(conn, self.store.history_merge_attempts(hour))
            await store.records(conn, self.store.history_merge_latency(hour))
            await store.records(conn, self.store.history_merge_slices(hour))
        await store.records(conn, self.store.history_prune(self.keep))
        return done
