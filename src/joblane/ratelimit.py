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

A queue may also have spend caps (``app.budget``, ``joblane.budgets``): the
one limited claim enforces both together.

Limits live in ``queue_limits``. ``app.limit(...)`` declares them in code and
every worker writes them at start; ``joblane limits set`` writes them from
the command line. This module is the declaration side (``Limit``,
``make_limit``, ``parse_rate``) and the admin calls; the worker enforces
limits and pauses through ``joblane.worker.limiter``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import JoblaneError
from .rules import check_queue, format_span

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
            parts.append(f"{self.max_starts} starts/{format_span(self.starts_interval)}")
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} running")
        if self.max_cost is not None:
            parts.append(f"{self.max_cost:g} cost/{format_span(self.cost_interval)} (estimate {self.estimate or '-'},"
                         f" default {self.default_estimate:g})")
        if self.per_key is not None:
            parts.append(f"{self.per_key} running per {self.key}")
        return ", ".join(parts)


def _path(field: str | None) -> list[str] | None:
    return None if field is None else field.split(".")


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
    check_queue(queue)
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
