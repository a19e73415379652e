"""Enqueue's checks and encodings: one job's options resolved against its task, and the bulk document.

``App.enqueue``/``enqueue_many`` (and the periodic scheduler) validate here,
then run one statement of the store on the caller's connection.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any, Iterable

from .errors import JoblaneError
from .rules import MAX_DELAY, check_queue, check_text, encode_json, to_json
from .types import HELD, PENDING, JobSpec

CHUNK = 5000  # jobs per enqueue_many statement


class Debounce:
    """Which enqueues notify workers.

    NOTIFY takes a cluster-wide lock at commit, so notifying transactions
    commit one at a time. Within ``seconds`` of a notification for a queue,
    further enqueues skip theirs: the worker a notification wakes claims again
    that long after it (the worker's follow-up), so a job whose enqueue skipped
    the notification still starts within milliseconds.
    """

    def __init__(self, seconds: float):
        if seconds < 0:
            raise JoblaneError("notify_debounce must be >= 0 seconds")
        self.seconds = float(seconds)
        self._notified_at: dict[str, float] = {}

    def should_notify(self, queue: str) -> bool:
        if not self.seconds:
            return True
        now = time.monotonic()
        if now - self._notified_at.get(queue, -1e9) < self.seconds:
            return False
        self._notified_at[queue] = now
        return True


def unknown_kind(app: Any, kind: str) -> str:
    known = sorted({*app.tasks, *app.declared})
    shown = ", ".join(repr(k) for k in known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    return (f"unknown task kind {kind!r}: this App knows {shown}; check the spelling, or declare a kind this "
            f"process enqueues without importing its task: app.declare({kind!r}, queue=...)")


def prepare(
    app: Any,
    kind: str,
    payload: Any,
    *,
    queue: str | None,
    priority: int | None,
    run_after: dt.datetime | None,
    delay: float | None,
    max_attempts: int | None,
    unique_key: str | None,
    held: bool,
) -> tuple[list[Any], bool]:
    """Validate one job's options against its task's defaults: (the enqueue statement's first nine arguments, notify?)."""
    check_text("task kind", kind, 200)
    task = app.known_kind(kind)
    if task is None and (app.tasks or app.declared):
        raise JoblaneError(unknown_kind(app, kind))
    if queue is None:
        queue = task.queue if task else app.default_queue
    queue = check_queue(queue)
    if priority is None:
        priority = task.priority if task else 0
    if not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise JoblaneError(f"priority must be an integer from -32768 to 32767, got {priority!r}")
    if max_attempts is None:
        max_attempts = (task.max_attempts if task else None) or app.default_max_attempts
    if not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100_000:
        raise JoblaneError(f"max_attempts must be an integer from 1 to 100000, got {max_attempts!r}")
    delay = 0.0 if delay is None else delay
    if isinstance(delay, dt.timedelta):
        delay = delay.total_seconds()
    if not isinstance(delay, (int, float)) or not math.isfinite(delay) or not 0 <= delay <= MAX_DELAY:
        raise JoblaneError(f"delay must be a number of seconds from 0 to {MAX_DELAY:.0f}, got {delay!r}")
    if run_after is not None:
        if not isinstance(run_after, dt.datetime) or run_after.tzinfo is None:
            raise JoblaneError("run_after must be a timezone-aware datetime")
    if unique_key is not None:
        check_text("unique_key", unique_key, 1000)
    body = to_json("payload", payload, app.max_payload_bytes)
    state = HELD if held else PENDING
    ready_now = not held and delay == 0 and (run_after is None or run_after <= dt.datetime.now(dt.timezone.utc))
    args = [queue, kind, body, priority, max_attempts, run_after, float(delay), unique_key, state]
    return args, ready_now and app.notify and app.debounce.should_notify(queue)


def chunks(app: Any, jobs: Iterable[JobSpec | dict | tuple]) -> Iterable[tuple[list[list[Any]], bool]]:
    """Validate and columnise jobs, CHUNK at a time.

    The per-kind defaults (queue, priority, max_attempts) are resolved
    and validated once per kind; each job then costs one JSON encode and
    the checks of the options it sets itself.
    """
    defaults: dict[tuple[str, str | None], tuple[str, int, int]] = {}
    limit = app.max_payload_bytes
    columns: list[list[Any]] = [[] for _ in range(9)]
    queue_col, kind_col, body_col, prio_col, max_col, after_col, delay_col, key_col, state_col = columns
    notify = False
    for spec in jobs:
        if type(spec) is not JobSpec:
            if isinstance(spec, dict):
                spec = JobSpec(**spec)
            elif isinstance(spec, tuple):
                spec = JobSpec(*spec)
            elif not isinstance(spec, JobSpec):
                raise JoblaneError(
                    f"enqueue_many takes JobSpec, dict or (kind, payload) tuples, got {type(spec).__name__}")
        simple = (spec.run_after is None and spec.delay is None and spec.unique_key is None
                  and spec.priority is None and spec.max_attempts is None and not spec.held)
        resolved = defaults.get((spec.kind, spec.queue)) if simple else None
        if resolved is None:
            # first job of this kind, or one with its own options: the full checks
            args, ready = prepare(
                app, spec.kind, spec.payload, queue=spec.queue, priority=spec.priority, run_after=spec.run_after,
                delay=spec.delay, max_attempts=spec.max_attempts, unique_key=spec.unique_key, held=spec.held,
            )
            if simple:
                defaults[(spec.kind, spec.queue)] = (args[0], args[3], args[4])
            notify = notify or ready
            for column, value in zip(columns, args):
                column.append(value)
        else:
            body = to_json("payload", spec.payload, limit)
            queue_col.append(resolved[0])
            kind_col.append(spec.kind)
            body_col.append(body)
            prio_col.append(resolved[1])
            max_col.append(resolved[2])
            after_col.append(None)
            delay_col.append(0.0)
            key_col.append(None)
            state_col.append(PENDING)
            notify = notify or (app.notify and app.debounce.should_notify(resolved[0]))
        if len(queue_col) >= CHUNK:
            yield columns, notify
            columns = [[] for _ in range(9)]
            queue_col, kind_col, body_col, prio_col, max_col, after_col, delay_col, key_col, state_col = columns
            notify = False
    if queue_col:
        yield columns, notify


_ROW = ('{"queue":%s,"kind":%s,"payload":%s,"priority":%d,"max_attempts":%d,'
        '"run_after":%s,"delay":%r,"unique_key":%s,"state":"%s"}')


def rows_document(columns: list[list[Any]]) -> str:
    """The JSON array enqueue_many sends: one object per validated job (payloads are already JSON)."""
    encode = encode_json
    names: dict[str, str] = {}

    def name(value: str) -> str:
        found = names.get(value)
        if found is None:
            found = names[value] = encode(value)
        return found

    parts = [
        _ROW % (name(queue), name(kind), body, priority, max_attempts,
                "null" if run_after is None else '"' + run_after.isoformat() + '"', float(delay),
                "null" if unique_key is None else encode(unique_key), state)
        for queue, kind, body, priority, max_attempts, run_after, delay, unique_key, state in zip(*columns)
    ]
    return "[" + ",".join(parts) + "]"
