"""Queue rate limits and pauses, enforced in the database so every worker on every host shares them.

A queue can have, in any combination:

- at most ``N`` job starts in any window of ``interval`` seconds (sliding);
- a concurrency cap: at most ``C`` of its jobs running at once, all workers together;
- a weighted limit: at most ``W`` cost units (tokens, say) per window. A job
  reserves its estimate (a number in its payload, ``estimate`` field) when it
  starts; the task settles the real cost with ``job.settle(cost)`` and the
  settled cost replaces the estimate once the try finishes;
- per-key fairness: at most ``K`` running jobs per key (a payload field, e.g.
  the tenant).

Limits live in ``queue_limits``. ``app.limit(...)`` declares them in code and
every worker writes them at start; ``joblane limits set`` writes them from
the command line. A limited queue is claimed through ``claim_jobs_limited``
(one short transaction, see sql/limits.sql); queues without limits keep the
plain claim, untouched.

``RetryAfter(seconds, pause_queue=True)`` pauses the whole queue: the worker
that caught it stops claiming from the queue at once and writes
``queue_pauses``; a limited claim checks the pause in the same statement,
and workers serving an unlimited queue see it at their next refresh (every
``refresh_interval`` seconds, 2 by default).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from .errors import JoblaneError
from .lifecycle import retry_delay

log = logging.getLogger("joblane.worker")

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}


@dataclass(frozen=True)
class Limit:
    """The limits of one queue, as stored in ``queue_limits``."""

    queue: str
    max_starts: int | None = None
    starts_interval: float = 1.0
    concurrency: int | None = None
    max_cost: float | None = None
    cost_interval: float = 60.0
    estimate: str | None = None  # payload field (dotted path) of a job's estimated cost
    default_estimate: float = 0.0
    key: str | None = None  # payload field (dotted path) of the fairness key
    per_key: int | None = None

    def args(self) -> list[Any]:
        """Parameters of ``upsert_queue_limit``."""
        return [self.queue, self.max_starts, float(self.starts_interval), self.concurrency,
                None if self.max_cost is None else float(self.max_cost), float(self.cost_interval),
                _path(self.estimate), float(self.default_estimate), _path(self.key), self.per_key]

    def describe(self) -> str:
        parts = []
        if self.max_starts is not None:
            parts.append(f"{self.max_starts} starts/{_span(self.starts_interval)}")
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} running")
        if self.max_cost is not None:
            parts.append(f"{self.max_cost:g} cost/{_span(self.cost_interval)} (estimate {self.estimate or '-'},"
                         f" default {self.default_estimate:g})")
        if self.per_key is not None:
            parts.append(f"{self.per_key} running per {self.key}")
        return ", ".join(parts)


def _path(field: str | None) -> list[str] | None:
    return None if field is None else field.split(".")


def _span(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            n = seconds / size
            return unit if n == 1 else f"{n:g}{unit}"
    return "s" if seconds == 1 else f"{seconds:g}s"


def parse_rate(text: str, what: str = "rate") -> tuple[float, float]:
    """``"10/s"``, ``"600/min"``, ``"90000/2m"`` -> (amount, interval seconds)."""
    try:
        amount, _, per = text.strip().partition("/")
        per = per.strip().lower() or "s"
        digits = per.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = per[len(digits):] or "s"
        if unit.endswith("s") and unit[:-1] in _UNITS and unit != "s":
            unit = unit[:-1]
        interval = float(digits or 1) * _UNITS[unit]
        value = float(amount)
    except (KeyError, ValueError):
        raise JoblaneError(f"{what} must look like 10/s, 600/min or 90000/2m, got {text!r}") from None
    if not (math.isfinite(value) and value > 0 and math.isfinite(interval) and interval > 0):
        raise JoblaneError(f"{what} must be positive, got {text!r}")
    return value, interval


def _check_field(what: str, field: str | None) -> str | None:
    if field is None:
        return None
    if not isinstance(field, str) or not field or any(not part for part in field.split(".")):
        raise JoblaneError(f"{what} must be a payload field name such as 'tenant' or 'usage.tokens', got {field!r}")
    return field


def _positive_int(what: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 2_000_000_000:
        raise JoblaneError(f"{what} must be a positive integer, got {value!r}")
    return value


def make_limit(
    queue: str,
    *,
    per_second: int | None = None,
    per_minute: int | None = None,
    per_hour: int | None = None,
    rate: str | None = None,
    concurrency: int | None = None,
    tokens_per_second: float | None = None,
    tokens_per_minute: float | None = None,
    tokens_per_hour: float | None = None,
    cost: str | None = None,
    estimate: str | None = "estimated_tokens",
    default_estimate: float = 0.0,
    key: str | None = None,
    per_key: int | None = None,
) -> Limit:
    """Validate the options of ``App.limit`` / ``joblane limits set`` into a Limit."""
    from .app import _check_queue

    _check_queue(queue)
    starts = [(v, s) for v, s in ((per_second, 1.0), (per_minute, 60.0), (per_hour, 3600.0)) if v is not None]
    if rate is not None:
        amount, interval = parse_rate(rate, "rate")
        if amount != int(amount):
            raise JoblaneError(f"rate counts job starts, a whole number: got {rate!r}")
        starts.append((int(amount), interval))
    if len(starts) > 1:
        raise JoblaneError("give one start rate: per_second, per_minute, per_hour or rate")
    weights = [(v, s) for v, s in ((tokens_per_second, 1.0), (tokens_per_minute, 60.0), (tokens_per_hour, 3600.0))
               if v is not None]
    if cost is not None:
        weights.append(parse_rate(cost, "cost"))
    if len(weights) > 1:
        raise JoblaneError("give one weighted limit: tokens_per_second, tokens_per_minute, tokens_per_hour or cost")
    if (key is None) != (per_key is None):
        raise JoblaneError("per-key fairness needs both key (a payload field) and per_key (running jobs per key)")
    max_starts, starts_interval = starts[0] if starts else (None, 1.0)
    max_cost, cost_interval = weights[0] if weights else (None, 60.0)
    _positive_int("the start rate", max_starts)
    _positive_int("concurrency", concurrency)
    _positive_int("per_key", per_key)
    if max_cost is not None and not (isinstance(max_cost, (int, float)) and math.isfinite(max_cost) and max_cost > 0):
        raise JoblaneError(f"the weighted limit must be a positive number, got {max_cost!r}")
    if not (isinstance(default_estimate, (int, float)) and math.isfinite(default_estimate) and default_estimate >= 0):
        raise JoblaneError(f"default_estimate must be a number >= 0, got {default_estimate!r}")
    if max_starts is None and concurrency is None and max_cost is None and per_key is None:
        raise JoblaneError(f"no limit given for queue {queue!r}: set a start rate, concurrency, a weighted limit or per_key")
    return Limit(
        queue=queue, max_starts=max_starts, starts_interval=float(starts_interval), concurrency=concurrency,
        max_cost=None if max_cost is None else float(max_cost), cost_interval=float(cost_interval),
        estimate=_check_field("estimate", estimate) if max_cost is not None else None,
        default_estimate=float(default_estimate), key=_check_field("key", key), per_key=per_key,
    )


# -- the worker's side -------------------------------------------------------


class Limiter:
    """What a worker needs of limits: which of its queues are limited or paused, and the limited claim.

    ``active`` is False while none of the worker's queues has limits or a
    pause; the worker then uses its plain claim and never calls in here.
    """

    def __init__(self, app: Any, queues: list[str], *, wake: Callable[[], None], refresh_interval: float = 2.0):
        self.app = app
        self.queues = list(queues)
        self.refresh_interval = refresh_interval
        self.limited: set[str] = set()
        self.active = False
        self._wake = wake
        self._paused: dict[str, float] = {}  # queue -> time.monotonic() when the pause ends
        self._recording: set[str] = set()  # queues whose pause this worker is writing (a refresh keeps them)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._turn = 0
        self._pool: Any = None
        q = app.queries
        self._lock_sql = q.lock_queue_limit
        self._limited_sql = q.claim_jobs_limited
        self._controls_sql = q.queue_controls
        self._pause_sql = q.pause_queue
        self._upsert_sql = q.upsert_queue_limit

    async def start(self, pool: Any, stopping: asyncio.Event) -> None:
        """Write the app's declared limits and load which queues are limited or paused (before any claim)."""
        self._pool = pool
        failures = 0
        while True:
            try:
                async with pool.acquire() as conn:
                    for limit in self.app.rate_limits.values():
                        await conn.fetch(self._upsert_sql, *limit.args())
                    await self._refresh(conn)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if stopping.is_set():
                    return
                delay = retry_delay(failures, base=0.2, cap=5.0)
                log.warning("cannot load queue limits (%s); retrying in %.1fs", _first_line(exc), delay)
                await asyncio.sleep(delay)

    async def run(self, stopping: asyncio.Event) -> None:
        """Refresh the limited and paused queues every ``refresh_interval`` seconds (jittered)."""
        try:
            await self._refresh_loop(stopping)
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    async def _refresh_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), self.refresh_interval * random.uniform(0.8, 1.2))
                return
            except asyncio.TimeoutError:
                pass
            try:
                async with self._pool.acquire() as conn:
                    await self._refresh(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("queue limits refresh failed (%s)", _first_line(exc))

    async def _refresh(self, conn: Any) -> None:
        rows = await conn.fetch(self._controls_sql, self.queues)
        now = time.monotonic()
        self.limited = {r[0] for r in rows if r[1]}
        paused = {r[0]: now + float(r[2]) for r in rows if not r[1]}
        for queue in self._recording & self._paused.keys():
            paused[queue] = max(paused.get(queue, 0.0), self._paused[queue])
        self._paused = paused
        self._update()
        if self._paused:
            self._wake_at(min(self._paused.values()))

    def _update(self) -> None:
        self.active = bool(self.limited) or any(q in self.queues for q in self._paused)

    def _wake_at(self, at: float) -> None:
        """Wake the claim loop at monotonic time ``at`` (keeps only the earliest pending wake-up)."""
        if at >= self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, at - time.monotonic()) + 0.002, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._wake()

    async def pause(self, queue: str, seconds: float, reason: str | None) -> None:
        """Pause ``queue`` here at once and for every worker through ``queue_pauses``."""
        until = time.monotonic() + seconds
        self._paused[queue] = max(until, self._paused.get(queue, 0.0))
        self._update()
        self._wake_at(until)
        log.warning("queue %s paused for %.1fs: %s", queue, seconds, reason or "RetryAfter(pause_queue=True)")
        self._recording.add(queue)
        try:
            async with self._pool.acquire() as conn:
                await conn.fetch(self._pause_sql, queue, float(seconds), reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("could not record the pause of queue %s (%s); other workers will not see it",
                        queue, _first_line(exc))
        finally:
            self._recording.discard(queue)

    def paused_for(self, queue: str) -> float:
        """Seconds ``queue`` stays paused, as this worker knows it (0 when it is not paused)."""
        until = self._paused.get(queue)
        return max(0.0, until - time.monotonic()) if until is not None else 0.0

    def put_back(self, job: Any, started: Any) -> Any:
        """The outcome of a job claimed (prefetched) before its queue was paused: pending again
        at the end of the pause, its attempt not spent."""
        from .worker.executor import give_back

        return give_back(job, started, f"queue {job.queue} is paused", delay=self.paused_for(job.queue))

    async def claim(self, conn: Any, n: int, plain_sql: str, worker: str, lease: float, run_free: int) -> list:
        """Claim up to ``n`` jobs: the plain claim for unlimited queues, the limited claim for the others.

        A limited queue claims only into the worker's free run slots
        (``run_free``), never to prefetch: a job that waited locally for a
        slot would start later than the window it was counted in.
        """
        now = time.monotonic()
        if self._paused:
            for queue in [q for q, until in self._paused.items() if until <= now]:
                del self._paused[queue]
            self._update()
        plain = [q for q in self.queues if q not in self.limited and q not in self._paused]
        groups: list[str | None] = [q for q in self.queues if q in self.limited and q not in self._paused]
        if plain:
            groups.append(None)
        if self._paused:
            self._wake_at(min(self._paused.values()))
        if not groups:
            return []
        # take turns at going first, so a busy group cannot starve the others
        self._turn = (self._turn + 1) % len(groups)
        groups = groups[self._turn:] + groups[:self._turn]
        rows: list = []
        for group in groups:
            if group is None:
                want = n - len(rows)
                if want > 0:
                    rows.extend(await conn.fetch(plain_sql, plain, want, worker, lease))
            else:
                want = min(n, run_free) - len(rows)
                if want > 0:
                    rows.extend(await self._claim_limited(conn, group, want, worker, lease))
        return rows

    async def _claim_limited(self, conn: Any, queue: str, n: int, worker: str, lease: float) -> list:
        async with conn.transaction():
            await conn.fetch(self._lock_sql, queue)
            result = await conn.fetch(self._limited_sql, queue, n, worker, lease)
        rows = [r for r in result if r[0] is not None]
        retry_in = result[0]["retry_in"] if result else None
        if len(rows) < n and retry_in is not None and retry_in > 0:
            self._wake_at(time.monotonic() + retry_in)
        return rows


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- admin calls (App.limit writes through these) ----------------------------


def status(app: Any, conn: Any = None) -> list[dict[str, Any]]:
    """Every limited or paused queue with its limits, pause and current usage."""
    keys = ("queue", "max_starts", "starts_interval", "concurrency", "max_cost", "cost_interval", "estimate",
            "default_estimate", "key", "per_key", "paused_until", "pause_reason", "running", "starts", "cost")
    return [dict(zip(keys, r)) for r in app._admin(conn, "queue_limits_status", [])]


def save(app: Any, limit: Limit, conn: Any = None) -> None:
    app._admin(conn, "upsert_queue_limit", limit.args())


def remove(app: Any, queue: str, conn: Any = None) -> bool:
    return bool(app._admin(conn, "delete_queue_limit", [queue]))
