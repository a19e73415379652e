"""Enqueue's checks and encodings: one job's options resolved against its task, and the bulk document.

``App.enqueue``/``enqueue_many`` (and the periodic scheduler) validate here,
then run one statement of the store on the caller's connection.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any, Iterable, NamedTuple

from .errors import JoblaneError
from .rules import MAX_DELAY, check_json_text, check_queue, check_text, encode_json, to_json
from .types import HELD, PENDING, WAITING, JobSpec

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


def check_options(
    app: Any,
    kind: str,
    *,
    queue: str | None,
    priority: int | None,
    run_after: dt.datetime | None,
    delay: float | None,
    max_attempts: int | None,
    unique_key: str | None,
    held: bool,
) -> tuple[str, int, int, dt.datetime | None, float, str | None, str, bool]:
    """Validate one job's options against its task's defaults.

    Returns (queue, priority, max_attempts, run_after, delay, unique_key,
    state, ready now?), everything but the payload.
    """
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
    state = HELD if held else PENDING
    ready_now = not held and delay == 0 and (run_after is None or run_after <= dt.datetime.now(dt.timezone.utc))
    return queue, priority, max_attempts, run_after, float(delay), unique_key, state, ready_now


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
    queue, priority, max_attempts, run_after, delay, unique_key, state, ready_now = check_options(
        app, kind, queue=queue, priority=priority, run_after=run_after, delay=delay, max_attempts=max_attempts,
        unique_key=unique_key, held=held)
    body = to_json("payload", payload, app.max_payload_bytes)
    args = [queue, kind, body, priority, max_attempts, run_after, delay, unique_key, state]
    return args, ready_now and app.notify and app.debounce.should_notify(queue)


# -- enqueue_many -------------------------------------------------------------------


class Chunk(NamedTuple):
    """Up to CHUNK validated jobs: the arguments of one enqueue_many statement.

    Each column is either one value the jobs share (``queue`` ... ``state``)
    or, when they differ, a JSON array with one element per job (``queues``
    ... ``states``, None when shared).
    """

    payloads: str  # JSON array, one payload per job
    queue: str | None
    kind: str | None
    priority: int | None
    max_attempts: int | None
    run_after: dt.datetime | None  # None: now
    delay: float | None
    unique_key: str | None
    state: str | None
    queues: str | None
    kinds: str | None
    priorities: str | None
    max_attempts_each: str | None
    run_afters: str | None  # ISO 8601 texts, or null for now
    delays: str | None
    unique_keys: str | None
    states: str | None
    wake: list[str] | None  # the queues to notify
    unique: bool  # some job has a unique key: the statement with the arbiter
    flows: bool = False  # some job has parents (after=) or a batch: App links them once inserted


def statement(app: Any, chunk: Chunk) -> Any:
    """The store statement that inserts ``chunk``.

    enqueue_many when the jobs differ only in payload, enqueue_many_varied
    when other columns differ too, enqueue_many_unique when some job has a
    unique key.
    """
    if chunk.unique:
        return app.store.enqueue_many_unique(*chunk[:17], app.channel, chunk.wake)
    if chunk[9:17] == _SHARED:
        return app.store.enqueue_many(chunk.payloads, chunk.queue, chunk.kind, chunk.priority, chunk.max_attempts,
                                      chunk.run_after, chunk.delay, chunk.state, app.channel, chunk.wake)
    return app.store.enqueue_many_varied(*chunk[:17], app.channel, chunk.wake)


_SHARED = (None,) * 8  # no column given job by job


def chunks(app: Any, jobs: Iterable[JobSpec | dict | tuple]) -> list[Chunk]:
    """Validate every job, CHUNK at a time, before the first is sent.

    A bad job raises JoblaneError naming its place in ``jobs`` (``jobs[3]:
    ...``); nothing is written.
    """
    specs = jobs if isinstance(jobs, list) else list(jobs)
    out = []
    for start in range(0, len(specs), CHUNK):
        part = specs[start:start + CHUNK]
        chunk = _plain_chunk(app, part)
        if chunk is None:
            chunk = _full_chunk(app, part, start)
        out.append(chunk)
    return out


def payload_chunks(app: Any, kind: str, payloads: Iterable[Any], *, queue: str | None = None,
                   priority: int | None = None, run_after: dt.datetime | None = None, delay: float | None = None,
                   max_attempts: int | None = None, held: bool = False) -> list[Chunk]:
    """Chunks of jobs of one kind that share their options and differ only in payload (``task.enqueue_many``)."""
    queue, priority, max_attempts, run_after, delay, _, state, ready = check_options(
        app, kind, queue=queue, priority=priority, run_after=run_after, delay=delay, max_attempts=max_attempts,
        unique_key=None, held=bool(held))
    values = payloads if isinstance(payloads, list) else list(payloads)
    out = []
    for start in range(0, len(values), CHUNK):
        part = values[start:start + CHUNK]
        document = _payload_document(app, part)
        if document is None:  # find the bad payload, and say which
            for i, payload in enumerate(part):
                try:
                    to_json("payload", payload, app.max_payload_bytes)
                except JoblaneError as exc:
                    raise JoblaneError(f"payloads[{start + i}]: {exc}") from None
            document = "[" + ",".join(to_json("payload", p) for p in part) + "]"
        out.append(Chunk(document, queue, kind, priority, max_attempts, run_after, delay, None, state,
                         None, None, None, None, None, None, None, None, _wake(app, [queue] if ready else []), False))
    return out


_PLAIN_DICT_KEYS = frozenset(("kind", "payload"))


def _plain_chunk(app: Any, specs: list[Any]) -> Chunk | None:
    """The fast path: jobs with a kind and a payload and no options of their own.

    Kinds are checked once each, and the payloads are encoded as one JSON
    array in one call. Anything else (a job with its own options, a bad
    kind, a payload that does not encode or that PostgreSQL would refuse)
    answers None, and ``_full_chunk`` checks job by job.
    """
    kinds: list[Any] = []
    payloads: list[Any] = []
    add_kind = kinds.append
    add_payload = payloads.append
    try:
        for spec in specs:
            t = type(spec)
            if t is JobSpec:
                if (spec.queue is not None or spec.priority is not None or spec.run_after is not None
                        or spec.delay is not None or spec.max_attempts is not None or spec.unique_key is not None
                        or spec.held or spec.after is not None or spec.batch is not None):
                    return None
                add_kind(spec.kind)
                add_payload(spec.payload)
            elif t is tuple and len(spec) == 2:
                add_kind(spec[0])
                add_payload(spec[1])
            elif t is dict and "kind" in spec and spec.keys() <= _PLAIN_DICT_KEYS:
                add_kind(spec["kind"])
                add_payload(spec.get("payload"))
            else:
                return None
        defaults = {}
        for kind in set(kinds):
            queue, priority, max_attempts, _, _, _, _, _ = check_options(
                app, kind, queue=None, priority=None, run_after=None, delay=None, max_attempts=None,
                unique_key=None, held=False)
            defaults[kind] = (queue, priority, max_attempts)
        document = _payload_document(app, payloads)
    except Exception:  # noqa: BLE001 - the job-by-job path raises the precise error
        return None
    if document is None:
        return None
    if len(defaults) == 1:
        (kind, (queue, priority, max_attempts)), = defaults.items()
        return Chunk(document, queue, kind, priority, max_attempts, None, 0.0, None, PENDING,
                     None, None, None, None, None, None, None, None, _wake(app, [queue]), False)
    shared = {}
    for i, name in enumerate(("queue", "priority", "max_attempts")):
        values = {d[i] for d in defaults.values()}
        shared[name] = (values.pop(), None) if len(values) == 1 else (None, encode_json([defaults[k][i] for k in kinds]))
    queue, queues = shared["queue"]
    priority, priorities = shared["priority"]
    max_attempts, max_attempts_each = shared["max_attempts"]
    return Chunk(document, queue, None, priority, max_attempts, None, 0.0, None, PENDING,
                 queues, encode_json(kinds), priorities, max_attempts_each, None, None, None, None,
                 _wake(app, sorted({d[0] for d in defaults.values()})), False)


def _payload_document(app: Any, payloads: list[Any]) -> str | None:
    """The payloads as one JSON array, checked as ``rules.to_json`` checks each; None when one fails a check.

    The checks for NUL and lone surrogates read the whole array at once; the
    size limit holds for every payload when it holds for the array, and is
    measured payload by payload only when the array is longer.
    """
    try:
        if None in payloads:
            payloads = [{} if p is None else p for p in payloads]
        document = encode_json(payloads)
        check_json_text("payload", document)
        limit = app.max_payload_bytes
        if limit is not None and len(document) > limit and any(len(encode_json(p)) > limit for p in payloads):
            return None
    except Exception:  # noqa: BLE001 - to_json, payload by payload, says what is wrong
        return None
    return document


def _full_chunk(app: Any, specs: list[Any], offset: int) -> Chunk:
    """Check job by job (each job's own options, its payload alone), as ``prepare`` does for one job."""
    defaults: dict[tuple[str, str | None], tuple[str, int, int]] = {}
    limit = app.max_payload_bytes
    columns: list[list[Any]] = [[] for _ in range(8)]
    queue_col, kind_col, prio_col, max_col, after_col, delay_col, key_col, state_col = columns
    bodies: list[str] = []
    ready_queues: set[str] = set()
    flows = False
    for i, spec in enumerate(specs):
        try:
            if type(spec) is not JobSpec:
                if isinstance(spec, dict):
                    spec = JobSpec(**spec)
                elif isinstance(spec, tuple):
                    spec = JobSpec(*spec)
                elif not isinstance(spec, JobSpec):
                    raise JoblaneError(
                        f"enqueue_many takes JobSpec, dict or (kind, payload) tuples, got {type(spec).__name__}")
            # the kind's defaults, checked once per (kind, queue); a unique key alone is checked per job
            simple = (spec.run_after is None and spec.delay is None and spec.priority is None
                      and spec.max_attempts is None and not spec.held)
            try:
                resolved = defaults.get((spec.kind, spec.queue)) if simple else None
            except TypeError:  # an unhashable kind or queue: check_options says what is wrong
                resolved = simple = None
            if resolved is None:
                # first job of this kind, or one with its own options: the full checks
                queue, priority, max_attempts, run_after, delay, unique_key, state, ready = check_options(
                    app, spec.kind, queue=spec.queue, priority=spec.priority, run_after=spec.run_after,
                    delay=spec.delay, max_attempts=spec.max_attempts, unique_key=spec.unique_key, held=spec.held)
                if simple:
                    defaults[(spec.kind, spec.queue)] = (queue, priority, max_attempts)
            else:
                queue, priority, max_attempts = resolved
                run_after, delay, unique_key, state, ready = None, 0.0, spec.unique_key, PENDING, True
                if unique_key is not None:
                    check_text("unique_key", unique_key, 1000)
            if spec.after is not None or spec.batch is not None:
                flows = True
                if spec.unique_key is not None:
                    raise JoblaneError("a job with after= or batch= cannot have a unique_key in enqueue_many")
                if spec.after is not None:
                    if spec.held:
                        raise JoblaneError("a job with after= cannot be enqueued held")
                    state, ready = WAITING, False  # until link_jobs counts its parents
            bodies.append(to_json("payload", spec.payload, limit))
        except JoblaneError as exc:
            raise JoblaneError(f"jobs[{offset + i}]: {exc}") from None
        queue_col.append(queue)
        kind_col.append(spec.kind)
        prio_col.append(priority)
        max_col.append(max_attempts)
        after_col.append(run_after)
        delay_col.append(delay)
        key_col.append(unique_key)
        state_col.append(state)
        if ready:
            ready_queues.add(queue)
    shared: list[Any] = []
    each: list[str | None] = []
    for n, column in enumerate(columns):
        first = column[0]
        if column.count(first) == len(column):
            shared.append(first)
            each.append(None)
        else:
            if n == 4:  # run_after: ISO 8601 text, exact to the microsecond
                column = [None if v is None else v.isoformat() for v in column]
            shared.append(None)
            each.append(encode_json(column))
    return Chunk("[" + ",".join(bodies) + "]", *shared, *each, _wake(app, sorted(ready_queues)),
                 any(k is not None for k in key_col), flows)


def _wake(app: Any, queues: list[str]) -> list[str] | None:
    """The queues this statement notifies: the ones with jobs ready now, past their debounce."""
    if not app.notify:
        return None
    woken = [q for q in queues if app.debounce.should_notify(q)]
    return woken or None
