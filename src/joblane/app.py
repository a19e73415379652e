"""App: the task registry, enqueue on the caller's connection, and admin calls."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import psycopg

from . import migrations, store, telemetry
from .errors import JoblaneError
from .queries import Queries, for_schema, validate_schema
from .types import HELD, PENDING, JobSpec

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
_MAX_DELAY = 10 * 365 * 24 * 3600.0
ENQUEUE_CHUNK = 5000


def exponential_backoff(base: float = 1.0, cap: float = 3600.0, jitter: float = 0.25) -> Callable[[int], float]:
    """Delay before retry ``attempt + 1``: base * 2^(attempt-1), capped, with +-jitter."""

    def delay(attempt: int) -> float:
        raw = min(cap, base * (2 ** max(0, attempt - 1)))
        return max(0.0, raw * random.uniform(1 - jitter, 1 + jitter))

    return delay


@dataclass
class Task:
    kind: str
    fn: Callable[..., Any]
    queue: str
    max_attempts: int | None
    backoff: Callable[[int], float]
    timeout: float | None
    priority: int
    is_async: bool


def _check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue):
        raise JoblaneError(
            f"invalid queue name {queue!r}: use 1-63 letters, digits, '_', '.', ':' or '-', starting with a letter or digit"
        )
    return queue


def _check_text(what: str, value: Any, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise JoblaneError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise JoblaneError(f"{what} is {len(value)} characters long; the limit is {limit}")
    if "\x00" in value:
        raise JoblaneError(f"{what} contains a NUL character, which PostgreSQL cannot store")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise JoblaneError(f"{what} contains a lone surrogate (\\ud800-\\udfff), which is not valid UTF-8") from None
    return value


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
# A real \u0000 escape in JSON text: preceded by an even number of backslashes
# (the text "\\u0000", an escaped backslash then "u0000", is fine).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def has_lone_surrogate(text: str) -> bool:
    """True when ASCII JSON text holds a lone surrogate escape (``\\ud800``), which jsonb refuses."""
    if "\\ud" not in text:
        return False
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_json_text(what: str, text: str) -> str:
    """Refuse JSON text PostgreSQL would reject mid-transaction: a NUL or a lone surrogate."""
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise JoblaneError(f"{what} contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
    if has_lone_surrogate(text):
        raise JoblaneError(f"{what} contains a lone surrogate (\\ud800-\\udfff), which PostgreSQL jsonb cannot store")
    return text


def to_json(what: str, value: Any, limit: int | None = None) -> str:
    """Serialise ``value`` for a jsonb column, with one-line errors for what PostgreSQL would refuse."""
    try:
        text = _ENCODER.encode({} if value is None else value)
    except (TypeError, ValueError) as exc:
        raise JoblaneError(f"{what} is not JSON-serialisable: {exc}") from None
    check_json_text(what, text)
    if limit is not None and len(text) > limit:
        raise JoblaneError(f"{what} is {len(text)} bytes as JSON; the limit is {limit} (App(max_payload_bytes=...))")
    return text


_ROW = ('{"queue":%s,"kind":%s,"payload":%s,"priority":%d,"max_attempts":%d,'
        '"run_after":%s,"delay":%r,"unique_key":%s,"state":"%s"}')


def _rows_document(columns: list[list[Any]]) -> str:
    """The JSON array enqueue_many sends: one object per validated job (payloads are already JSON)."""
    encode = _ENCODER.encode
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


class App:
    """A joblane application: tasks, the schema they live in, and how to reach the database.

    ``App()`` reads ``DATABASE_URL`` and ``JOBLANE_SCHEMA`` (default ``joblane``)
    when the DSN or schema is not given.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str | None = None,
        default_queue: str = "default",
        default_max_attempts: int = 10,
        lease_seconds: float = 30.0,
        max_payload_bytes: int = 1_000_000,
        notify: bool = True,
        notify_debounce: float = 0.005,
    ):
        self._dsn = dsn
        if schema is None:
            schema = os.environ.get("JOBLANE_SCHEMA") or "joblane"
        try:
            self.schema = validate_schema(schema)
        except ValueError as exc:
            raise JoblaneError(str(exc)) from None
        self.default_queue = _check_queue(default_queue)
        if default_max_attempts < 1:
            raise JoblaneError("default_max_attempts must be at least 1")
        self.default_max_attempts = default_max_attempts
        if lease_seconds <= 0:
            raise JoblaneError("lease_seconds must be positive")
        self.lease_seconds = float(lease_seconds)
        self.max_payload_bytes = max_payload_bytes
        self.notify = notify
        # NOTIFY takes a cluster-wide lock at commit, so notifying transactions
        # commit one at a time. Within notify_debounce seconds of a notification
        # for a queue, further enqueues skip theirs: the worker a notification
        # wakes claims again that long after it (Worker follow-up), so a job
        # whose enqueue skipped the notification still starts within milliseconds.
        if notify_debounce < 0:
            raise JoblaneError("notify_debounce must be >= 0 seconds")
        self.notify_debounce = float(notify_debounce)
        self._notified_at: dict[str, float] = {}
        self.tasks: dict[str, Task] = {}
        self.periodic_tasks: dict[str, Any] = {}  # schedule name -> periodic.Schedule
        self.rate_limits: dict[str, Any] = {}  # queue -> ratelimit.Limit, written by every worker at start
        self.queries: Queries = for_schema(self.schema)
        self.store: store.Store = store.for_schema_store(self.schema)
        self.channel = f"{self.schema}_jobs"
        self.routes: list[Any] = []  # outbox routes (joblane.outbox.routes.Route), longest prefix wins

    # -- configuration ----------------------------------------------------

    @property
    def dsn(self) -> str:
        dsn = self._dsn or os.environ.get("DATABASE_URL")
        if not dsn:
            raise JoblaneError("no database: set DATABASE_URL or pass App(dsn=...)")
        return dsn

    def task(
        self,
        kind: str | None = None,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        backoff: float | Callable[[int], float] | None = None,
        timeout: float | None = None,
        priority: int = 0,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a task: ``@app.task("enrich_lead", queue="leads", max_attempts=8)``.

        ``backoff`` is a base delay in seconds (doubling per attempt, with
        jitter) or a function of the attempt number returning seconds.
        """
        if max_attempts is not None and max_attempts < 1:
            raise JoblaneError("max_attempts must be at least 1")
        if timeout is not None and not timeout > 0:
            raise JoblaneError("timeout must be a positive number of seconds")
        if backoff is None:
            backoff_fn = exponential_backoff()
        elif callable(backoff):
            backoff_fn = backoff
        else:
            backoff_fn = exponential_backoff(base=float(backoff))

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            name = _check_text("task kind", kind or fn.__name__, 200)
            if name in self.tasks:
                raise JoblaneError(f"task kind {name!r} is registered twice")
            self.tasks[name] = Task(
                kind=name,
                fn=fn,
                queue=_check_queue(queue or self.default_queue),
                max_attempts=max_attempts,
                backoff=backoff_fn,
                timeout=timeout,
                priority=priority,
                is_async=inspect.iscoroutinefunction(fn),
            )
            return fn

        return register

    def queues(self) -> list[str]:
        """The queues the registered tasks live in."""
        return sorted({t.queue for t in self.tasks.values()}) or [self.default_queue]

    def periodic(self, cron: str, *, kind: str | None = None, name: str | None = None, payload: dict | None = None,
                 queue: str | None = None, priority: int | None = None, max_attempts: int | None = None,
                 timezone: Any = None, **task_options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Enqueue a task at each tick of ``cron``: ``@app.periodic(cron="*/5 * * * *", kind="sync_crm")``.

        Registers the task too (unless ``@app.task`` already did). Every
        worker runs the scheduler; each tick is enqueued once across all of
        them, with ``payload`` plus ``"tick"`` (ISO 8601). Six fields put
        seconds last. Missed ticks: see ``joblane.periodic``.
        """
        from .periodic import register

        return register(self, cron, kind=kind, name=name, payload=payload, queue=queue, priority=priority,
                        max_attempts=max_attempts, timezone=timezone, **task_options)

    # -- enqueue ----------------------------------------------------------

    def _enqueue_args(
        self,
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
        _check_text("task kind", kind, 200)
        task = self.tasks.get(kind)
        if queue is None:
            queue = task.queue if task else self.default_queue
        queue = _check_queue(queue)
        if priority is None:
            priority = task.priority if task else 0
        if not isinstance(priority, int) or not -32768 <= priority <= 32767:
            raise JoblaneError(f"priority must be an integer from -32768 to 32767, got {priority!r}")
        if max_attempts is None:
            max_attempts = (task.max_attempts if task else None) or self.default_max_attempts
        if not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100_000:
            raise JoblaneError(f"max_attempts must be an integer from 1 to 100000, got {max_attempts!r}")
        delay = 0.0 if delay is None else delay
        if isinstance(delay, dt.timedelta):
            delay = delay.total_seconds()
        if not isinstance(delay, (int, float)) or not math.isfinite(delay) or not 0 <= delay <= _MAX_DELAY:
            raise JoblaneError(f"delay must be a number of seconds from 0 to {_MAX_DELAY:.0f}, got {delay!r}")
        if run_after is not None:
            if not isinstance(run_after, dt.datetime) or run_after.tzinfo is None:
                raise JoblaneError("run_after must be a timezone-aware datetime")
        if unique_key is not None:
            _check_text("unique_key", unique_key, 1000)
        body = to_json("payload", payload, self.max_payload_bytes)
        state = HELD if held else PENDING
        ready_now = not held and delay == 0 and (run_after is None or run_after <= dt.datetime.now(dt.timezone.utc))
        args = [queue, kind, body, priority, max_attempts, run_after, float(delay), unique_key, state]
        return args, ready_now and self.notify and self._should_notify(queue)

    def _should_notify(self, queue: str) -> bool:
        if not self.notify_debounce:
            return True
        now = time.monotonic()
        if now - self._notified_at.get(queue, -1e9) < self.notify_debounce:
            return False
        self._notified_at[queue] = now
        return True

    def enqueue(
        self,
        conn: Any,
        kind: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_after: dt.datetime | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        held: bool = False,
        replay_of: int | None = None,
    ) -> int:
        """Insert a job on ``conn`` (psycopg 3), inside the caller's transaction; returns its id.

        With ``unique_key``, an unfinished job holding the same key is kept
        and its id returned instead of inserting a second one.
        """
        args, notify = self._enqueue_args(
            kind, payload, queue=queue, priority=priority, run_after=run_after, delay=delay,
            max_attempts=max_attempts, unique_key=unique_key, held=held,
        )
        with telemetry.enqueue_span(kind, args[0]) as headers:  # headers: the trace context, or None
            rows = store.fetch(conn, self.queries.enqueue, [*args, replay_of, notify, self.channel, headers])
        if rows:
            return rows[0][0]
        return store.fetch(conn, self.queries.unfinished_by_unique_key, [unique_key])[0][0]

    async def enqueue_async(
        self,
        conn: Any,
        kind: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_after: dt.datetime | None = None,
        delay: float | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        held: bool = False,
        replay_of: int | None = None,
    ) -> int:
        """``enqueue`` on a psycopg AsyncConnection or an asyncpg connection."""
        args, notify = self._enqueue_args(
            kind, payload, queue=queue, priority=priority, run_after=run_after, delay=delay,
            max_attempts=max_attempts, unique_key=unique_key, held=held,
        )
        with telemetry.enqueue_span(kind, args[0]) as headers:  # headers: the trace context, or None
            rows = await store.fetch_async(conn, self.queries.enqueue,
                                           [*args, replay_of, notify, self.channel, headers])
        if rows:
            return rows[0][0]
        return (await store.fetch_async(conn, self.queries.unfinished_by_unique_key, [unique_key]))[0][0]

    def _many_chunks(self, jobs: Iterable[JobSpec | dict | tuple]) -> Iterable[tuple[list[list[Any]], bool]]:
        """Validate and columnise jobs, ENQUEUE_CHUNK at a time.

        The per-kind defaults (queue, priority, max_attempts) are resolved
        and validated once per kind; each job then costs one JSON encode and
        the checks of the options it sets itself.
        """
        defaults: dict[tuple[str, str | None], tuple[str, int, int]] = {}
        encode = _ENCODER.encode
        limit = self.max_payload_bytes
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
                args, ready = self._enqueue_args(
                    spec.kind, spec.payload, queue=spec.queue, priority=spec.priority, run_after=spec.run_after,
                    delay=spec.delay, max_attempts=spec.max_attempts, unique_key=spec.unique_key, held=spec.held,
                )
                if simple:
                    defaults[(spec.kind, spec.queue)] = (args[0], args[3], args[4])
                notify = notify or ready
                for column, value in zip(columns, args):
                    column.append(value)
            else:
                try:
                    body = encode({} if spec.payload is None else spec.payload)
                except (TypeError, ValueError) as exc:
                    raise JoblaneError(f"payload is not JSON-serialisable: {exc}") from None
                check_json_text("payload", body)
                if limit is not None and len(body) > limit:
                    raise JoblaneError(
                        f"payload is {len(body)} bytes as JSON; the limit is {limit} (App(max_payload_bytes=...))")
                queue_col.append(resolved[0])
                kind_col.append(spec.kind)
                body_col.append(body)
                prio_col.append(resolved[1])
                max_col.append(resolved[2])
                after_col.append(None)
                delay_col.append(0.0)
                key_col.append(None)
                state_col.append(PENDING)
                notify = notify or (self.notify and self._should_notify(resolved[0]))
            if len(queue_col) >= ENQUEUE_CHUNK:
                yield columns, notify
                columns = [[] for _ in range(9)]
                queue_col, kind_col, body_col, prio_col, max_col, after_col, delay_col, key_col, state_col = columns
                notify = False
        if queue_col:
            yield columns, notify

    def enqueue_many(self, conn: Any, jobs: Iterable[JobSpec | dict | tuple]) -> list[int]:
        """Insert many jobs in one statement per 5,000, in the caller's transaction.

        Returns the ids of the jobs inserted; a job whose ``unique_key`` an
        unfinished job already holds is skipped. Every job is validated
        before the first chunk is sent, so bad input writes nothing.
        """
        ids: list[int] = []
        for columns, notify in list(self._many_chunks(jobs)):
            rows = store.fetch(conn, self.queries.enqueue_many, [_rows_document(columns), notify, self.channel])
            ids.extend(r[0] for r in rows)
        return ids

    async def enqueue_many_async(self, conn: Any, jobs: Iterable[JobSpec | dict | tuple]) -> list[int]:
        """``enqueue_many`` on a psycopg AsyncConnection or an asyncpg connection."""
        ids: list[int] = []
        for columns, notify in list(self._many_chunks(jobs)):  # validate all before sending any
            rows = await store.fetch_async(conn, self.queries.enqueue_many,
                                           [_rows_document(columns), notify, self.channel])
            ids.extend(r[0] for r in rows)
        return ids

    # -- outbox and inbox (joblane.outbox) ----------------------------------

    def publish(self, conn: Any, topic: str, payload: Any = None, *, key: str | None = None,
                idempotency_key: str | None = None, headers: dict[str, str] | None = None) -> int:
        """Write an outbox message on ``conn`` (psycopg 3), inside the caller's transaction; returns its id.

        Commit and a relay delivers it; roll back and it never existed. The
        destination receives ``idempotency_key`` (default ``outbox:<id>``) in
        its own dedup field. Rows with the same ``key`` go out in order on a
        route declared ``ordered=True``.
        """
        from .outbox.publish import publish

        return publish(self, conn, topic, payload, key=key, idempotency_key=idempotency_key, headers=headers)

    async def publish_async(self, conn: Any, topic: str, payload: Any = None, *, key: str | None = None,
                            idempotency_key: str | None = None, headers: dict[str, str] | None = None) -> int:
        """``publish`` on a psycopg AsyncConnection or an asyncpg connection."""
        from .outbox.publish import publish_async

        return await publish_async(self, conn, topic, payload, key=key, idempotency_key=idempotency_key,
                                   headers=headers)

    def route(self, topic_prefix: str, sink: Any, *, ordered: bool = False, max_attempts: int = 25,
              backoff: float | Callable[[int], float] | None = None) -> Any:
        """Deliver the topics starting with ``topic_prefix`` through ``sink`` (``joblane relay``).

        The longest matching prefix wins; ``""`` matches every topic. With
        ``ordered=True`` a row waits while an earlier row of its key is unsent.
        After ``max_attempts`` tries a row is ``failed``.
        """
        from .outbox.routes import make_route

        return make_route(self.routes, topic_prefix, sink, ordered=ordered, max_attempts=max_attempts,
                          backoff=backoff)

    def inbox(self, conn: Any, key: str) -> bool:
        """Record ``key`` as received in the caller's transaction: True the first time, False on a repeat.

        Never raises on a repeat, so the caller's transaction stays usable;
        commit it together with the effect of the message.
        """
        from .outbox.publish import inbox

        return inbox(self, conn, key)

    async def inbox_async(self, conn: Any, key: str) -> bool:
        """``inbox`` on a psycopg AsyncConnection or an asyncpg connection."""
        from .outbox.publish import inbox_async

        return await inbox_async(self, conn, key)

    def complete_job(self, conn: Any, job: Any, result: Any = None) -> None:
        """Mark the running ``job`` done inside the task's own transaction on ``conn``.

        Do the task's writes, ``publish`` its events and call this in one
        transaction: commit, and the job is done exactly when its writes are;
        a crash before the commit leaves nothing and the job runs again.
        Raises JoblaneError (roll back!) when the job was rescued or cancelled
        meanwhile. Keep the transaction short: it holds the job's row.
        """
        from .outbox.publish import complete_job

        complete_job(self, conn, job, result)

    async def complete_job_async(self, conn: Any, job: Any, result: Any = None) -> None:
        """``complete_job`` on a psycopg AsyncConnection or an asyncpg connection."""
        from .outbox.publish import complete_job_async

        await complete_job_async(self, conn, job, result)

    # -- schema and admin -------------------------------------------------

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        """A new autocommit psycopg connection to the app's database."""
        try:
            return psycopg.connect(self.dsn, autocommit=True, **kwargs)
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise JoblaneError(f"cannot connect to the database: {first}") from None

    def migrate(self, conn: psycopg.Connection | None = None) -> list[int]:
        """Apply the migrations this schema lacks; returns the versions applied."""
        if conn is not None:
            return migrations.migrate(conn, self.schema)
        with self.connect() as own:
            return migrations.migrate(own, self.schema)

    def _admin(self, conn: Any, name: str, args: Sequence[Any]) -> list[tuple]:
        if conn is not None:
            return store.fetch(conn, getattr(self.queries, name), args)
        with self.connect() as own:
            return store.fetch(own, getattr(self.queries, name), args)

    def status(self, conn: Any = None) -> list[dict[str, Any]]:
        """Jobs per queue and state, with the oldest ready job's age in seconds."""
        return [
            {"queue": q, "state": s, "jobs": n, "oldest_ready_seconds": float(age) if age is not None else None}
            for q, s, n, age in self._admin(conn, "status_counts", [])
        ]

    def list_jobs(
        self,
        conn: Any = None,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Jobs newest first, filtered; page with ``before_id`` (keyset)."""
        rows = self._admin(conn, "list_jobs", [state, kind, queue, before_id, limit])
        keys = ("id", "queue", "kind", "state", "priority", "attempts", "max_attempts", "run_after",
                "last_error", "created_at", "finished_at", "worker", "unique_key", "replay_of")
        return [dict(zip(keys, r)) for r in rows]

    def get_job(self, job_id: int, conn: Any = None) -> dict[str, Any] | None:
        """One job with its attempts, or None."""
        rows = self._admin(conn, "get_job", [job_id])
        if not rows:
            return None
        keys = ("id", "queue", "kind", "payload", "state", "priority", "attempts", "max_attempts", "run_after",
                "last_error", "lease_until", "worker", "unique_key", "replay_of", "result", "created_at",
                "finished_at")
        job = dict(zip(keys, rows[0]))
        job["payload"] = json.loads(job["payload"])
        job["result"] = json.loads(job["result"]) if job["result"] is not None else None
        job["attempt_rows"] = [
            {"attempt": a, "worker": w, "started_at": s, "finished_at": f, "outcome": o, "error": e,
             "meta": json.loads(m) if m else None}
            for a, w, s, f, o, e, m in self._admin(conn, "job_attempts", [job_id])
        ]
        job["replays"] = [{"id": i, "state": s} for i, s in self._admin(conn, "job_replays", [job_id])]
        return job

    def retry(
        self,
        conn: Any = None,
        *,
        ids: Sequence[int] | None = None,
        kind: str | None = None,
        queue: str | None = None,
    ) -> list[int]:
        """Put failed (or, by id, cancelled) jobs back to pending; returns the ids retried."""
        if ids is None and kind is None and queue is None:
            raise JoblaneError("retry needs job ids or a filter (kind, queue)")
        rows = self._admin(conn, "retry_jobs", [list(ids) if ids is not None else None, kind, queue, "failed"])
        return sorted(r[0] for r in rows)

    def cancel(self, conn: Any = None, *, ids: Sequence[int], reason: str | None = None,
               actor: str | None = None) -> list[int]:
        """Cancel pending, held or running jobs; returns the ids cancelled."""
        rows = self._admin(conn, "cancel_jobs", [list(ids), reason, actor or _actor()])
        return sorted(r[0] for r in rows)

    def job_states(self, ids: Sequence[int], conn: Any = None) -> dict[int, str]:
        return {i: s for i, s in self._admin(conn, "job_states", [list(ids)])}

    # -- review, replay, audit, limits (review.py, ratelimit.py) -------------

    def held_jobs(self, conn: Any = None, *, queue: str | None = None, kind: str | None = None,
                  limit: int = 50) -> list[dict[str, Any]]:
        """The review queue: held jobs, longest held first, with the Hold reason and data."""
        from . import review

        return review.held_jobs(self, conn, queue=queue, kind=kind, limit=limit)

    def release(self, conn: Any, job_id: int, payload_patch: dict | None = None, *, actor: str | None = None,
                note: str | None = None) -> int:
        """Send a held job back to pending, its payload merged with ``payload_patch`` (jsonb ``||``).

        Recorded in ``attempts`` as 'released' by ``actor`` (default user@host)
        with ``note``. Raises JoblaneError when the job is not held.
        """
        from . import review

        return review.release(self, conn, job_id, payload_patch, actor=actor, note=note)

    def reject(self, conn: Any, job_id: int, reason: str, *, actor: str | None = None) -> int:
        """Cancel a held job, recorded in ``attempts`` as 'rejected' with ``reason``."""
        from . import review

        return review.reject(self, conn, job_id, reason, actor=actor)

    def replay(self, conn: Any, *, ids: Sequence[int] | None = None, kind: str | None = None,
               queue: str | None = None, state: str | Sequence[str] | None = None, since: Any = None,
               until: Any = None, payload_patch: dict | None = None, skip_replayed: bool = False,
               limit: int | None = None, dry_run: bool = False) -> list[dict[str, Any]]:
        """Insert new jobs copied from the matching ones, payload patched, ``replay_of`` set.

        Old rows are never edited. Without ``state`` only finished jobs match;
        ``since``/``until`` bound when they finished (a datetime, a timedelta
        or text such as "24h"). ``dry_run`` inserts nothing and returns what
        would be inserted (``id`` None).
        """
        from . import review

        return review.replay(self, conn, ids=ids, kind=kind, queue=queue, state=state, since=since, until=until,
                             payload_patch=payload_patch, skip_replayed=skip_replayed, limit=limit, dry_run=dry_run)

    def list_attempts(self, conn: Any = None, **filters: Any) -> list[dict[str, Any]]:
        """Attempts newest first; filters: kind, queue, outcome, model, since, until, job_id, before_id, limit."""
        from . import review

        return review.list_attempts(self, conn, **filters)

    def export_attempts(self, conn: Any = None, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every matching attempt, oldest first, streamed through a server-side cursor (psycopg).

        Filters: kind, queue, outcome, model, since, until. Each row carries
        the job's current state.
        """
        from . import review

        return review.export_attempts(self, conn, **filters)

    def limit(self, queue: str, **options: Any) -> Any:
        """Limit a queue for every worker: ``app.limit("models", per_minute=60, concurrency=8,
        tokens_per_minute=90_000, estimate="estimated_tokens", key="tenant", per_key=2)``.

        Written to the database by each worker at start. See joblane.ratelimit.
        """
        from .ratelimit import make_limit

        limit = make_limit(queue, **options)
        self.rate_limits[queue] = limit
        return limit

    def pause_queue(self, conn: Any, queue: str, seconds: float, reason: str | None = None) -> dt.datetime:
        """Stop every worker from starting jobs of ``queue`` for ``seconds``; returns when the pause ends."""
        if not isinstance(seconds, (int, float)) or not 0 < seconds <= _MAX_DELAY:
            raise JoblaneError(f"pause seconds must be a positive number, got {seconds!r}")
        return self._admin(conn, "pause_queue", [_check_queue(queue), float(seconds), reason])[0][0]

    def resume_queue(self, conn: Any, queue: str) -> bool:
        """End a queue's pause now; False when it was not paused."""
        return bool(self._admin(conn, "resume_queue", [queue]))


def _actor() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def monotonic() -> float:
    return time.monotonic()
