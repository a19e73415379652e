"""Periodic jobs: ``@app.periodic(cron=...)``, the schedules it declares and the cron rules they follow.

Every worker runs a scheduler (``joblane.maintenance.Scheduler``); however
many there are, each tick of a schedule is enqueued once. Two things make
that so:

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

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import enqueue
from .errors import JoblaneError
from .rules import install_hint
from .maintenance.scheduler import Scheduler  # its documented home until now; joblane.maintenance.Scheduler

if TYPE_CHECKING:  # pragma: no cover
    from .app import App

__all__ = ["Schedule", "Scheduler", "register"]

UTC = dt.timezone.utc
_MICROSECOND = dt.timedelta(microseconds=1)


def _croniter():
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - the [periodic] extra is missing
        raise JoblaneError(f"periodic jobs need croniter: {install_hint('periodic')}") from None
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
        enqueue.prepare(app, task_kind, schedule.payload, queue=queue, priority=priority, run_after=None, delay=None,
                          max_attempts=max_attempts, unique_key=schedule.unique_key(dt.datetime.now(UTC)), held=False)
        app.periodic_tasks[schedule_name] = schedule
        return fn

    return decorate
