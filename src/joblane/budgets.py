"""Spend caps: at most so much cost per key (a tenant, say) per day, month or any window, for every worker.

``app.budget("openai", queue="leads", per_day=20.0, key="tenant")`` caps the
cost of the jobs of queue ``leads`` at 20 per tenant per UTC day. A job
reserves its estimate (a number in its payload, ``estimated_cost`` by
default) when it starts; once its try has finished, the cost the task
recorded (``job.record(cost=...)``, the ``cost`` field of ``attempts.meta``,
else the amount of ``job.settle(...)``) replaces the estimate (a try that
recorded neither counts its estimate), so a try that overruns its estimate counts what it
really cost. When a key's spend in the current window reaches the cap, its
jobs stay pending (``joblane jobs show`` says why) until the window rolls or
the cap is raised (``joblane budgets set``); other keys go on.

The database enforces it together with the queue's limits (``ratelimit``),
which a queue with budgets may also have: budgets live in ``budgets``, and
the worker claims a queue with limits, budgets or both through
``claim_jobs_limited`` (sql/limits.sql). The cap an app declares is the
default: a cap an operator sets (``joblane budgets set NAME --cap N``) stands
across worker restarts until ``joblane budgets reset NAME``. A cap is exceeded by at most the
estimates of the tries in flight when it was reached, plus what those tries
cost beyond their estimates. Windows are fixed: per hour and per day start
on the hour and at midnight UTC, per month on the first of the month (UTC),
and ``window="10m"`` counts from the epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import JoblaneError
from .rules import check_queue, format_span, parse_duration

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:")


@dataclass(frozen=True)
class Budget:
    """One spend cap, as stored in ``budgets``."""

    name: str
    queue: str
    cap: float
    window_seconds: float | None  # None: calendar months (UTC)
    key: str | None = None  # payload field (dotted path) of the key; None: the whole queue
    estimate: str | None = "estimated_cost"  # payload field of a job's estimated cost
    default_estimate: float = 0.0
    cost_field: str = "cost"  # attempts.meta field of the settled cost

    def args(self) -> list[Any]:
        """Parameters of ``upsert_budget``."""
        return [self.name, self.queue, float(self.cap), self.window_seconds, _path(self.key), _path(self.estimate),
                float(self.default_estimate), self.cost_field]

    def describe(self) -> str:
        per = describe_window(self.window_seconds)
        return f"{self.cap:g} per {per}" + (f" per {self.key}" if self.key else "") + f" on queue {self.queue}"


def describe_window(window_seconds: float | None) -> str:
    if window_seconds is None:
        return "month"
    return {3600.0: "hour", 86400.0: "day"}.get(float(window_seconds), format_span(float(window_seconds)))


def _path(field: str | None) -> list[str] | None:
    return None if field is None else field.split(".")


def _field(what: str, field: Any) -> str | None:
    if field is None:
        return None
    if not isinstance(field, str) or not field or any(not part for part in field.split(".")):
        raise JoblaneError(f"{what} must be a payload field name such as 'tenant' or 'usage.cost', got {field!r}")
    return field


def check_budget_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 100 or not set(name) <= _NAME_CHARS:
        raise JoblaneError(f"a budget name is 1-100 letters, digits, '_', '-', '.' or ':', got {name!r}")
    return name


def check_cap(cap: Any) -> float:
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap <= 0:
        raise JoblaneError(f"a budget's cap must be a positive number, got {cap!r}")
    return float(cap)


def make_budget(
    name: str,
    *,
    queue: str,
    per_hour: float | None = None,
    per_day: float | None = None,
    per_month: float | None = None,
    cap: float | None = None,
    window: str | float | None = None,
    key: str | None = None,
    estimate: str | None = "estimated_cost",
    default_estimate: float = 0.0,
    cost_field: str = "cost",
) -> Budget:
    """Validate the options of ``App.budget`` / ``joblane budgets set`` into a Budget: give one of
    ``per_hour``, ``per_day``, ``per_month``, or ``cap`` with ``window`` (a duration such as ``"10m"``)."""
    check_budget_name(name)
    check_queue(queue)
    given = [(v, w) for v, w in ((per_hour, 3600.0), (per_day, 86400.0), (per_month, None)) if v is not None]
    if cap is not None or window is not None:
        if cap is None or window is None:
            raise JoblaneError("a budget with a window needs both cap and window (e.g. cap=5.0, window='10m')")
        seconds = parse_duration(window, "window")
        if seconds <= 0:
            raise JoblaneError(f"window must be longer than zero, got {window!r}")
        given.append((cap, seconds))
    if len(given) != 1:
        raise JoblaneError("give one cap: per_hour, per_day, per_month, or cap with window")
    amount, window_seconds = given[0]
    if not isinstance(cost_field, str) or not cost_field:
        raise JoblaneError(f"cost_field must be the name of a field of attempts.meta, got {cost_field!r}")
    if isinstance(default_estimate, bool) or not isinstance(default_estimate, (int, float)) \
            or not math.isfinite(default_estimate) or default_estimate < 0:
        raise JoblaneError(f"default_estimate must be a number >= 0, got {default_estimate!r}")
    return Budget(name=name, queue=queue, cap=check_cap(amount), window_seconds=window_seconds,
                  key=_field("key", key), estimate=_field("estimate", estimate),
                  default_estimate=float(default_estimate), cost_field=cost_field)
