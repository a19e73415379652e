"""Scheduler: enqueue the ticks of the app's periodic schedules that fell due (``joblane.periodic``).

Every worker runs one; a round runs under the services' advisory lock, and
each tick is recorded in ``periodic_ticks`` in the statement that inserts
its job, so each tick is enqueued once however many workers run. Which
ticks are due (the missed-tick policy) is described in ``joblane.periodic``.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import enqueue, store
from .service import Service

if TYPE_CHECKING:  # pragma: no cover
    from ..app import App
    from ..periodic import Schedule

UTC = dt.timezone.utc


def _now() -> dt.datetime:
    return dt.datetime.now(UTC)


class Scheduler(Service):
    """Enqueues the periodic jobs of an app; runs in every worker, one round at a time.

    Rounds run just after each tick (and at least every ``max_sleep``
    seconds). ``clock`` returns an aware datetime; tests pass their own.
    """

    name = "scheduler"
    log = logging.getLogger("joblane.periodic")

    def __init__(
        self,
        app: App,
        *,
        misfire_grace: float = 60.0,
        max_sleep: float = 30.0,
        retention: float = 86400.0,
        prune_every: float = 600.0,
        clock: Callable[[], dt.datetime] = _now,
    ):
        super().__init__(app.store, interval=max_sleep, jitter=0.0)
        if misfire_grace < 0:
            raise ValueError("scheduler: misfire_grace must be >= 0 seconds")
        self.app = app
        self.misfire_grace = dt.timedelta(seconds=misfire_grace)
        self.retention = float(retention)
        self.prune_every = prune_every
        self.clock = clock
        self.started_at = clock()
        self._pruned_at = 0.0

    @property
    def schedules(self) -> list[Schedule]:
        return list(self.app.periodic_tasks.values())

    def due(self, schedule: Schedule, last: dt.datetime | None, now: dt.datetime) -> list[dt.datetime]:
        """The ticks of ``schedule`` to enqueue at ``now``, given its latest recorded tick (joblane.periodic's policy)."""
        window_start = now - self.misfire_grace
        floor = last if last is not None else self.started_at
        recent = schedule.ticks(after=max(floor, window_start), until=now)
        if recent or last is None:
            return recent
        missed = schedule.latest(at_or_before=window_start)
        return [missed] if missed > last else []

    async def _work(self, conn: Any) -> list[tuple[str, dt.datetime, int]]:
        """(schedule name, tick, job id) of every tick enqueued."""
        schedules = self.schedules
        if not schedules:
            return []
        now = self.clock()
        names = [s.name for s in schedules]
        last = {name: tick for name, tick in await store.records(conn, self.store.latest_periodic_ticks(names))}
        cols: list[list[Any]] = [[] for _ in range(8)]
        notify = False
        for schedule in schedules:
            for tick in self.due(schedule, last.get(schedule.name), now):
                key = schedule.unique_key(tick)
                args, ready = enqueue.prepare(
                    self.app, schedule.kind, {**schedule.payload, "tick": tick.isoformat()}, queue=schedule.queue,
                    priority=schedule.priority, run_after=None, delay=None, max_attempts=schedule.max_attempts,
                    unique_key=key, held=False)
                queue, kind, body, priority, max_attempts = args[:5]
                for col, value in zip(cols, (schedule.name, tick, queue, kind, body, priority, max_attempts, key)):
                    col.append(value)
                notify = notify or ready
        enqueued: list[tuple[str, dt.datetime, int]] = []
        if cols[0]:
            rows = await store.records(conn, self.store.enqueue_periodic(*cols, notify, self.app.channel))
            by_key = {r[1]: r[0] for r in rows}
            enqueued = [(n, t, by_key[k]) for n, t, k in zip(cols[0], cols[1], cols[7]) if k in by_key]
            for name, tick, job_id in enqueued:
                self.log.info("periodic %s: tick %s enqueued as job %d", name, tick.isoformat(), job_id)
        if time.monotonic() - self._pruned_at >= self.prune_every:
            await store.run(conn, self.store.prune_periodic_ticks(self.retention))
            self._pruned_at = time.monotonic()
        return enqueued

    def seconds_to_next_tick(self, now: dt.datetime | None = None) -> float:
        now = now or self.clock()
        upcoming = min((s.next_after(now) for s in self.schedules), default=None)
        if upcoming is None:
            return self.interval
        return min(self.interval, max(0.0, (upcoming - now).total_seconds()))

    # -- the loop: Service.run, waking just after each tick -----------------

    def starting(self) -> None:
        self.log.info("scheduler: %d periodic schedules (%s)", len(self.schedules),
                      ", ".join(f"{s.name} '{s.cron}'" for s in self.schedules))

    def report(self, done: list) -> None:
        pass  # _work logs each tick it enqueued

    def next_delay(self) -> float:
        # a few milliseconds past the tick, so that the round sees it as due
        return self.seconds_to_next_tick() + random.uniform(0.005, 0.05)
