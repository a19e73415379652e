"""Periodic jobs: ``@app.periodic(cron=...)`` and the scheduler every worker runs.

Every worker runs a :class:`Scheduler`; however many there are, each tick of
a schedule is enqueued once. Two things make that so:

* a round runs under the maintenance services' advisory lock, so one worker
  at a time decides what is due;
* each tick is recorded in ``periodic_ticks`` with the primary key
  ``(name, tick)`` in the statement that inserts its job, so a tick that any
  worker recorded, at any time, never yields a second job. The job also
  carries ``unique_key = "periodic:<name>:<tick ISO 8601 UTC>"``.

Missed ticks. A round enqueues every tick that fell due since the
schedule's latest recorded tick and no longer than ``misfire_grace`` ago
(60 s by default), so a round that runs late loses nothing. Ticks older than
that were missed (no worker ran): of those, only the latest is enqueued, and
only when no tick within the grace is due, so a schedule that was down for
a day runs once when workers return, not once per missed tick. A schedule
that has never recorded a tick starts with the first tick after the
scheduler started; it does not backfill.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import JoblaneError
from .maintenance.service import Service

if TYPE_CHECKING:  # pragma: no cover
    from .app import App

log = logging.getLogger("joblane.periodic")

UTC = dt.timezone.utc
_MICROSECOND = dt.timedelta(microseconds=1)


def _croniter():
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - the [periodic] extra is missing
        raise JoblaneError("periodic jobs need croniter: pip install 'joblane[periodic]'") from None
    return croniter


@dataclass
class Schedule:
    """One periodic job: enqueue ``kind`` with ``payload`` at each tick of ``cron``."""

    name: str
    cron: str
    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timezone: dt.tzinfo = UTC

    def ticks(self, after: dt.datetime, until: dt.datetime, limit: int = 10_000) -> list[dt.datetime]:
        """The ticks ``t`` with ``after < t <= until``, in UTC, at most ``limit`` (the latest ones)."""
        it = _croniter()(self.cron, after.astimezone(self.timezone))
        found: list[dt.datetime] = []
        while True:
            tick = it.get_next(dt.datetime).astimezone(UTC)
            if tick > until:
                return found[-limit:]
            found.append(tick)

    def latest(self, at_or_before: dt.datetime) -> dt.datetime:
        """The latest tick at or before ``at_or_before``, in UTC."""
        it = _croniter()(self.cron, (at_or_before + _MICROSECOND).astimezone(self.timezone))
        return it.get_prev(dt.datetime).astimezone(UTC)

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        return _croniter()(self.cron, moment.astimezone(self.timezone)).get_next(dt.datetime).astimezone(UTC)

    def unique_key(self, tick: dt.datetime) -> str:
        return f"periodic:{self.name}:{tick.astimezone(UTC).isoformat()}"


def register(
    app: App,
    cron: str,
    *,
    kind: str | None = None,
    name: str | None = None,
    payload: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timezone: str | dt.tzinfo | None = None,
    **task_options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What ``App.periodic`` does: a decorator registering the task (unless it is already) and its schedule."""
    croniter = _croniter()
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise JoblaneError(
            f"invalid cron expression {cron!r}: use five fields (minute hour day month weekday), "
            "or six with seconds last, e.g. '*/5 * * * *'"
        )
    if payload is not None and not isinstance(payload, dict):
        raise JoblaneError(f"a periodic job's payload must be a dict (the tick is added to it), got {type(payload).__name__}")
    if timezone is None:
        tz: dt.tzinfo = UTC
    elif isinstance(timezone, str):
        try:
            tz = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise JoblaneError(f"unknown time zone {timezone!r}: use an IANA name such as 'Europe/Paris'") from None
    else:
        tz = timezone

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        task_kind = kind or fn.__name__
        existing = app.tasks.get(task_kind)
        if existing is None:
            app.task(task_kind, queue=queue, max_attempts=max_attempts,
                     priority=priority if priority is not None else 0, **task_options)(fn)
        elif existing.fn is not fn:
            raise JoblaneError(f"task kind {task_kind!r} is already registered to another function")
        schedule_name = name or task_kind
        if schedule_name in app.periodic_tasks:
            raise JoblaneError(f"periodic schedule {schedule_name!r} is registered twice: give one of them name=...")
        schedule = Schedule(name=schedule_name, cron=cron, kind=task_kind, payload=dict(payload or {}), queue=queue,
                            priority=priority, max_attempts=max_attempts, timezone=tz)
        # validate what every tick will enqueue now, not at the first tick
        app._enqueue_args(task_kind, schedule.payload, queue=queue, priority=priority, run_after=None, delay=None,
                          max_attempts=max_attempts, unique_key=schedule.unique_key(dt.datetime.now(UTC)), held=False)
        app.periodic_tasks[schedule_name] = schedule
        return fn

    return decorate


def _now() -> dt.datetime:
    return dt.datetime.now(UTC)


class Scheduler(Service):
    """Enqueues the periodic jobs of an app; runs in every worker, one round at a time.

    Rounds run just after each tick (and at least every ``max_sleep``
    seconds). ``clock`` returns an aware datetime; tests pass their own.
    """

    name = "scheduler"

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
        super().__init__(app.queries, app.schema, interval=max_sleep, jitter=0.0)
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
        """The ticks of ``schedule`` to enqueue at ``now``, given its latest recorded tick (the policy above)."""
        window_start = now - self.misfire_grace
        floor = last if last is not None else self.started_at
        recent = schedule.ticks(after=max(floor, window_start), until=now)
        if recent or last is None:
            return recent
        missed = schedule.latest(at_or_before=window_start)
        return [missed] if missed > last else []

    async def _work(self, conn) -> list[tuple[str, dt.datetime, int]]:
        schedules = self.schedules
        if not schedules:
            return []
        now = self.clock()
        names = [s.name for s in schedules]
        last = {name: tick for name, tick in await conn.fetch(self.queries.latest_periodic_ticks, names)}
        cols: list[list[Any]] = [[] for _ in range(8)]
        notify = False
        for schedule in schedules:
            for tick in self.due(schedule, last.get(schedule.name), now):
                key = schedule.unique_key(tick)
                args, ready = self.app._enqueue_args(
                    schedule.kind, {**schedule.payload, "tick": tick.isoformat()}, queue=schedule.queue,
                    priority=schedule.priority, run_after=None, delay=None, max_attempts=schedule.max_attempts,
                    unique_key=key, held=False)
                queue, kind, body, priority, max_attempts = args[:5]
                for col, value in zip(cols, (schedule.name, tick, queue, kind, body, priority, max_attempts, key)):
                    col.append(value)
                notify = notify or ready
        enqueued: list[tuple[str, dt.datetime, int]] = []
        if cols[0]:
            rows = await conn.fetch(self.queries.enqueue_periodic, *cols, notify, self.app.channel)
            by_key = {r[1]: r[0] for r in rows}
            enqueued = [(n, t, by_key[k]) for n, t, k in zip(cols[0], cols[1], cols[7]) if k in by_key]
            for name, tick, job_id in enqueued:
                log.info("periodic %s: tick %s enqueued as job %d", name, tick.isoformat(), job_id)
        if time.monotonic() - self._pruned_at >= self.prune_every:
            await conn.fetch(self.queries.prune_periodic_ticks, self.retention)
            self._pruned_at = time.monotonic()
        return enqueued

    def seconds_to_next_tick(self, now: dt.datetime | None = None) -> float:
        now = now or self.clock()
        upcoming = min((s.next_after(now) for s in self.schedules), default=None)
        if upcoming is None:
            return self.interval
        return min(self.interval, max(0.0, (upcoming - now).total_seconds()))

    async def run(self, pool, stopping: asyncio.Event) -> None:
        """Wake just after each tick, run a round; the worker that gets the lock enqueues."""
        log.info("scheduler: %d periodic schedules (%s)", len(self.schedules),
                 ", ".join(f"{s.name} '{s.cron}'" for s in self.schedules))
        while not stopping.is_set():
            try:
                async with pool.acquire() as conn:
                    await self.run_once(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scheduler: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            # a few milliseconds past the tick, so that the round sees it as due
            delay = self.seconds_to_next_tick() + random.uniform(0.005, 0.05)
            try:
                await asyncio.wait_for(stopping.wait(), delay)
            except asyncio.TimeoutError:
                pass
