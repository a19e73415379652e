"""App: the task registry, enqueue on the caller's connection, and admin calls."""

from __future__ import annotations

import datetime as dt
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import psycopg

from . import admin, enqueue, flows, migrations, store, telemetry
from .errors import JoblaneError
from .queries import Queries, for_schema, validate_schema
from .rules import check_queue, check_text, exponential_backoff, first_line, normalize_dsn
from .types import JobSpec
from .outbox import publish as outbox_writes

ENQUEUE_CHUNK = enqueue.CHUNK


@dataclass
class Task:
    kind: str
    fn: Callable[..., Any] | None  # None for a kind declared with App.declare
    queue: str
    max_attempts: int | None
    backoff: Callable[[int], float]
    timeout: float | None
    priority: int
    is_async: bool
    lean: bool = False  # a done job is deleted at once and writes no attempts row
    executor: str | None = None  # "process": each try in a child; None: async def on the loop, def in a thread


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
        prepare: bool | None = None,
    ):
        self._dsn = dsn
        if schema is None:
            schema = os.environ.get("JOBLANE_SCHEMA") or "joblane"
        try:
            self.schema = validate_schema(schema)
        except ValueError as exc:
            raise JoblaneError(str(exc)) from None
        self.default_queue = check_queue(default_queue)
        if default_max_attempts < 1:
            raise JoblaneError("default_max_attempts must be at least 1")
        self.default_max_attempts = default_max_attempts
        if lease_seconds <= 0:
            raise JoblaneError("lease_seconds must be positive")
        self.lease_seconds = float(lease_seconds)
        self.max_payload_bytes = max_payload_bytes
        self.notify = notify
        self.debounce = enqueue.Debounce(notify_debounce)  # which enqueues notify (enqueue.Debounce)
        # enqueue and publish on the caller's psycopg connection: prepared on the server (after psycopg's
        # prepare_threshold) when True; never when False; when None, only on a connection that reaches
        # PostgreSQL with nothing between (store.reaches_server). Behind PgBouncer in transaction pooling
        # a prepared statement does not survive the transaction.
        self.prepare = None if prepare is None else bool(prepare)
        self.tasks: dict[str, Task] = {}
        # kinds this process enqueues but does not run (app.declare): their defaults, no function
        self.declared: dict[str, Task] = {}
        self.periodic_tasks: dict[str, Any] = {}  # schedule name -> periodic.Schedule
        self.rate_limits: dict[str, Any] = {}  # queue -> ratelimit.Limit, written by every worker at start
        self.budgets: dict[str, Any] = {}  # name -> budgets.Budget, written by every worker at start
        self.queries: Queries = for_schema(self.schema)
        self.store: store.Store = store.for_schema_store(self.schema)
        self.channel = f"{self.schema}_jobs"
        self.routes: list[Any] = []  # outbox routes (joblane.outbox.routes.Route), longest prefix wins

    # -- configuration ----------------------------------------------------

    @property
    def notify_debounce(self) -> float:
        """Seconds after a queue's notification in which further enqueues skip theirs (enqueue.Debounce)."""
        return self.debounce.seconds

    @notify_debounce.setter
    def notify_debounce(self, seconds: float) -> None:
        self.debounce = enqueue.Debounce(seconds)

    @property
    def dsn(self) -> str:
        dsn = self._dsn or os.environ.get("DATABASE_URL")
        if not dsn:
            raise JoblaneError("no database: set DATABASE_URL, or pass --database-url URL to joblane, "
                               "or App(dsn=...) in code")
        return normalize_dsn(dsn)

    @dsn.setter
    def dsn(self, dsn: str | None) -> None:
        self._dsn = dsn

    def task(
        self,
        kind: str | None = None,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        backoff: float | Callable[[int], float] | None = None,
        timeout: float | None = None,
        priority: int = 0,
        lean: bool = False,
        executor: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a task: ``@app.task("enrich_lead", queue="leads", max_attempts=8)``.

        ``backoff`` is a base delay in seconds (doubling per attempt, with
        jitter) or a function of the attempt number returning seconds.

        ``lean=True`` trades the history of successes for speed: a job that
        ends ``done`` is deleted in the completing statement (with its steps
        and the attempts rows of earlier tries) and writes no attempts row,
        so its result, its meta and the job itself cannot be read, counted,
        exported or replayed afterwards. Every other outcome (retry, snooze,
        hold, failure, a lost worker) is written as for any task. What a
        lean try recorded as its cost (``job.record(cost=...)``,
        ``job.settle(...)``) still counts, at that cost, against its queue's
        budgets and weighted limit.

        ``executor="process"`` runs each try in a child process of its own
        (worker/child.py), for work that blocks in C code and must still stop
        on a timeout, a cancel or a shutdown: the child is sent SIGTERM, then
        SIGKILL. The payload, the result and ``job.record`` fields travel as
        JSON; ``job.step`` and ``job.wait_for`` are not available there. By
        default an ``async def`` runs on the worker's event loop and a plain
        ``def`` in a thread, where a stop is raised at its next Python line.
        """
        if max_attempts is not None and max_attempts < 1:
            raise JoblaneError("max_attempts must be at least 1")
        if timeout is not None and not timeout > 0:
            raise JoblaneError("timeout must be a positive number of seconds")
        if executor not in (None, "thread", "process"):
            raise JoblaneError(f"executor must be 'thread' or 'process', got {executor!r}")
        if backoff is None:
            backoff_fn = exponential_backoff()
        elif callable(backoff):
            backoff_fn = backoff
        else:
            backoff_fn = exponential_backoff(base=float(backoff))

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            name = check_text("task kind", kind or fn.__name__, 200)
            if name in self.tasks:
                raise JoblaneError(f"task kind {name!r} is registered twice")
            self.tasks[name] = Task(
                kind=name,
                fn=fn,
                queue=check_queue(queue or self.default_queue),
                max_attempts=max_attempts,
                backoff=backoff_fn,
                timeout=timeout,
                priority=priority,
                is_async=inspect.iscoroutinefunction(fn),
                lean=bool(lean),
                executor=_executor(fn, executor),
            )
            _attach_enqueue(self, fn, name)
            return fn

        return register

    def declare(self, kind: str, *, queue: str | None = None, priority: int = 0,
                max_attempts: int | None = None) -> None:
        """Name a task kind this process enqueues but does not import (a web process, say), with its defaults.

        Once an App knows a kind (a task or a declaration), ``enqueue`` refuses
        kinds it does not know, so a misspelt kind fails at once instead of
        waiting forever. Workers still need the task itself.
        """
        name = check_text("task kind", kind, 200)
        if max_attempts is not None and max_attempts < 1:
            raise JoblaneError("max_attempts must be at least 1")
        self.declared[name] = Task(kind=name, fn=None, queue=check_queue(queue or self.default_queue),
                                   max_attempts=max_attempts, backoff=exponential_backoff(), timeout=None,
                                   priority=priority, is_async=False)

    def known_kind(self, kind: str) -> Task | None:
        """The task or declaration of ``kind``; None when this App knows no such kind."""
        return self.tasks.get(kind) or self.declared.get(kind)

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
        after: Iterable[int] | int | None = None,
        on_parent_failure: str | None = None,
        batch: Any = None,
    ) -> int:
        """Insert a job on ``conn`` (psycopg 3), inside the caller's transaction; returns its id.

        With ``unique_key``, an unfinished job holding the same key is kept
        and its id returned instead of inserting a second one. With ``after``
        (job ids) it waits until every parent finished; ``on_parent_failure``
        says what a parent that failed or was cancelled does to it:
        ``"cancel"`` (default), ``"run"`` (anyway) or ``"hold"`` (for a
        person). ``batch`` (App.batch) adds it to a batch.
        """
        args, notify = enqueue.prepare(
            self, kind, payload, queue=queue, priority=priority, run_after=run_after, delay=delay,
            max_attempts=max_attempts, unique_key=unique_key, held=held,
        )
        if after is not None or batch is not None:
            return self._enqueue_flow(conn, kind, args, replay_of, after, on_parent_failure, batch)
        with telemetry.enqueue_span(kind, args[0]) as headers:  # headers: the trace context, or None
            rows = store.fetch(conn, self._enqueue_statement(args, replay_of, notify, headers),
                               prepare=self.prepare)
        if rows:
            return rows[0][0]
        return store.fetch(conn, self.store.unfinished_by_unique_key(unique_key))[0][0]

    def _enqueue_statement(self, args: list[Any], replay_of: int | None, notify: bool, headers: str | None) -> Any:
        """The statement inserting one job of ``enqueue.prepare``'s args: a plain insert when it has no unique key."""
        if args[7] is None:
            return self.store.enqueue_plain(*args[:7], args[8], replay_of, notify, self.channel, headers)
        return self.store.enqueue(*args, replay_of, notify, self.channel, headers)

    def _enqueue_flow(self, conn: Any, kind: str, args: list[Any], replay_of: int | None, after: Any,
                      policy: str | None, batch: Any) -> int:
        """``enqueue`` of a job with parents or a batch: insert (waiting, when it has parents), then link."""
        parents, policy, notify = flows.check_enqueue(args, after, policy, batch)
        with telemetry.enqueue_span(kind, args[0]) as headers:
            rows = store.fetch(conn, self._enqueue_statement(args, replay_of, notify and self.notify, headers))
        job_id = rows[0][0] if rows else store.fetch(conn, self.store.unfinished_by_unique_key(args[7]))[0][0]
        if parents is not None:
            store.fetch(conn, flows.link_statement(self, [job_id], [parents], [policy]))
        if batch is not None:
            flows.add(self, conn, batch, [job_id])
        return job_id

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
        after: Iterable[int] | int | None = None,
        on_parent_failure: str | None = None,
        batch: Any = None,
    ) -> int:
        """``enqueue`` on a psycopg AsyncConnection or an asyncpg connection."""
        args, notify = enqueue.prepare(
            self, kind, payload, queue=queue, priority=priority, run_after=run_after, delay=delay,
            max_attempts=max_attempts, unique_key=unique_key, held=held,
        )
        if after is not None or batch is not None:
            return await self._enqueue_flow_async(conn, kind, args, replay_of, after, on_parent_failure, batch)
        with telemetry.enqueue_span(kind, args[0]) as headers:  # headers: the trace context, or None
            rows = await store.fetch_async(conn, self._enqueue_statement(args, replay_of, notify, headers),
                                           prepare=self.prepare)
        if rows:
            return rows[0][0]
        return (await store.fetch_async(conn, self.store.unfinished_by_unique_key(unique_key)))[0][0]

    async def _enqueue_flow_async(self, conn: Any, kind: str, args: list[Any], replay_of: int | None, after: Any,
                                  policy: str | None, batch: Any) -> int:
        """``_enqueue_flow`` on a psycopg AsyncConnection or an asyncpg connection."""
        parents, policy, notify = flows.check_enqueue(args, after, policy, batch)
        with telemetry.enqueue_span(kind, args[0]) as headers:
            statement = self._enqueue_statement(args, replay_of, notify and self.notify, headers)
            rows = await store.fetch_async(conn, statement)
        if not rows:
            rows = await store.fetch_async(conn, self.store.unfinished_by_unique_key(args[7]))
        job_id = rows[0][0]
        if parents is not None:
            await store.fetch_async(conn, flows.link_statement(self, [job_id], [parents], [policy]))
        if batch is not None:
            await flows.add_async(self, conn, batch, [job_id])
        return job_id

    def enqueue_many(self, conn: Any, jobs: Iterable[JobSpec | dict | tuple], *, batch: Any = None) -> list[int]:
        """Insert many jobs in one statement per 5,000, in the caller's transaction.

        Returns the ids of the jobs inserted, in order; a job whose
        ``unique_key`` an unfinished job already holds is skipped. Every job
        is validated before the first chunk is sent, so bad input writes
        nothing; the error names the job (``jobs[3]: ...``). A JobSpec's
        ``after`` may name other JobSpecs of the same call (fan-out and
        fan-in in one transaction); ``batch`` adds every job to a batch.
        """
        specs = jobs if isinstance(jobs, list) else list(jobs)
        chunks = enqueue.chunks(self, specs)
        ids = self._insert_chunks(conn, chunks)
        if batch is not None or any(c.flows for c in chunks):
            self._link_many(conn, specs, ids, batch)
        return ids

    def _link_many(self, conn: Any, specs: list[Any], ids: list[int], batch: Any) -> None:
        children, parents, policies = flows.spec_flows(specs, ids)
        if children:
            store.fetch(conn, flows.link_statement(self, children, parents, policies))
        for batch_id, members in flows.batch_members(specs, ids, batch).items():
            flows.add(self, conn, batch_id, members)

    # -- workflows (flows.py) -------------------------------------------------

    def batch(self, conn: Any, *, name: str | None = None, on_complete: tuple | None = None) -> flows.Batch:
        """A new batch on ``conn``: add jobs to it (``batch.enqueue``, ``batch=``) until ``batch.seal(conn)``.

        ``on_complete=(kind, payload)``: when the last job of the sealed batch
        finishes, a job of that kind is inserted in the same transaction, once,
        its payload extended with ``"batch"``: id, name, total, done, failed,
        cancelled, failed_ids, cancelled_ids.
        """
        return flows.create(self, conn, name=name, on_complete=on_complete)

    async def batch_async(self, conn: Any, *, name: str | None = None,
                          on_complete: tuple | None = None) -> flows.Batch:
        """``batch`` on a psycopg AsyncConnection or an asyncpg connection."""
        return await flows.create_async(self, conn, name=name, on_complete=on_complete)

    def get_batch(self, batch_id: int) -> flows.Batch:
        """The Batch of an existing id (to add jobs in a later transaction, or seal it)."""
        return flows.Batch(self, flows.batch_id(batch_id))

    def seal_batch(self, conn: Any, batch: Any) -> bool:
        return flows.seal(self, conn, batch)

    def batch_progress(self, batch: Any, conn: Any = None) -> dict[str, Any] | None:
        """A batch with its jobs counted by state, or None."""
        return flows.progress(self, batch, conn)

    def list_batches(self, conn: Any = None, *, before_id: int | None = None, limit: int = 50,
                     unfinished: bool = False) -> list[dict[str, Any]]:
        return flows.list_batches(self, conn, before_id=before_id, limit=limit, unfinished=unfinished)

    def batch_jobs(self, batch: Any, conn: Any = None, *, state: str | None = None,
                   limit: int = 200, after_id: int | None = None) -> list[dict[str, Any]]:
        """The batch's jobs by id (state ``state``, or any), at most ``limit``, above ``after_id`` for the next page."""
        return flows.batch_jobs(self, batch, conn, state=state, limit=limit, after_id=after_id)

    def job_flow(self, job_id: int, conn: Any = None) -> dict[str, Any] | None:
        """What job ``job_id`` waits on: its wait key and deadline, parents left, batch, parents, children."""
        return flows.job_flow(self, job_id, conn)

    def waiting_jobs(self, conn: Any = None, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return flows.waiting_jobs(self, conn, queue=queue, limit=limit)

    def signal(self, conn: Any, key: str, data: Any = None) -> int:
        """Wake the jobs waiting for ``key`` (WaitFor) with ``data``, in the caller's transaction.

        Returns how many jobs woke; with none waiting the signal is kept, and
        the first job that waits for ``key`` consumes it.
        """
        return store.fetch(conn, flows.signal_statement(self, key, data))[0][0]

    async def signal_async(self, conn: Any, key: str, data: Any = None) -> int:
        """``signal`` on a psycopg AsyncConnection or an asyncpg connection."""
        return (await store.fetch_async(conn, flows.signal_statement(self, key, data)))[0][0]

    async def enqueue_many_async(self, conn: Any, jobs: Iterable[JobSpec | dict | tuple], *,
                                 batch: Any = None) -> list[int]:
        """``enqueue_many`` on a psycopg AsyncConnection or an asyncpg connection."""
        specs = jobs if isinstance(jobs, list) else list(jobs)
        chunks = enqueue.chunks(self, specs)
        ids = await self._insert_chunks_async(conn, chunks)
        if batch is not None or any(c.flows for c in chunks):
            children, parents, policies = flows.spec_flows(specs, ids)
            if children:
                await store.fetch_async(conn, flows.link_statement(self, children, parents, policies))
            for batch_id, members in flows.batch_members(specs, ids, batch).items():
                await flows.add_async(self, conn, batch_id, members)
        return ids

    def _insert_chunks(self, conn: Any, chunks: list[enqueue.Chunk]) -> list[int]:
        ids: list[int] = []
        for chunk in chunks:
            ids.extend(r[0] for r in store.fetch(conn, enqueue.statement(self, chunk)))
        return ids

    async def _insert_chunks_async(self, conn: Any, chunks: list[enqueue.Chunk]) -> list[int]:
        ids: list[int] = []
        for chunk in chunks:
            ids.extend(r[0] for r in await store.fetch_async(conn, enqueue.statement(self, chunk)))
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
        return outbox_writes.publish(self, conn, topic, payload, key=key, idempotency_key=idempotency_key, headers=headers)

    async def publish_async(self, conn: Any, topic: str, payload: Any = None, *, key: str | None = None,
                            idempotency_key: str | None = None, headers: dict[str, str] | None = None) -> int:
        """``publish`` on a psycopg AsyncConnection or an asyncpg connection."""
        return await outbox_writes.publish_async(self, conn, topic, payload, key=key, idempotency_key=idempotency_key,
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
        return outbox_writes.inbox(self, conn, key)

    async def inbox_async(self, conn: Any, key: str) -> bool:
        """``inbox`` on a psycopg AsyncConnection or an asyncpg connection."""
        return await outbox_writes.inbox_async(self, conn, key)

    def complete_job(self, conn: Any, job: Any, result: Any = None) -> None:
        """Mark the running ``job`` done inside the task's own transaction on ``conn``.

        Do the task's writes, ``publish`` its events and call this in one
        transaction: commit, and the job is done exactly when its writes are;
        a crash before the commit leaves nothing and the job runs again.
        Raises JoblaneError (roll back!) when the job was rescued or cancelled
        meanwhile. Keep the transaction short: it holds the job's row.
        """
        outbox_writes.complete_job(self, conn, job, result)

    async def complete_job_async(self, conn: Any, job: Any, result: Any = None) -> None:
        """``complete_job`` on a psycopg AsyncConnection or an asyncpg connection."""
        await outbox_writes.complete_job_async(self, conn, job, result)

    # -- schema and admin -------------------------------------------------

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        """A new autocommit psycopg connection to the app's database."""
        try:
            # prepare_threshold=None: nothing prepared on the server, so PgBouncer in transaction pooling works
            return psycopg.connect(self.dsn, **{"autocommit": True, "prepare_threshold": None, **kwargs})
        except psycopg.OperationalError as exc:
            raise JoblaneError(f"cannot connect to the database: {first_line(exc)}") from None

    def migrate(self, conn: psycopg.Connection | None = None) -> list[int]:
        """Apply the migrations this schema lacks; returns the versions applied."""
        if conn is not None:
            return migrations.migrate(conn, self.schema)
        with self.connect() as own:
            return migrations.migrate(own, self.schema)

    def status(self, conn: Any = None) -> list[dict[str, Any]]:
        """Jobs per queue and state, with the oldest ready job's age in seconds."""
        return admin.status(self, conn)

    def list_jobs(
        self,
        conn: Any = None,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        since: Any = None,
        until: Any = None,
    ) -> list[dict[str, Any]]:
        """Jobs newest first, filtered (``since``/``until`` bound when they were created); page with ``before_id``."""
        return admin.list_jobs(self, conn, state=state, kind=kind, queue=queue, before_id=before_id, limit=limit,
                               since=since, until=until)

    def get_job(self, job_id: int, conn: Any = None) -> dict[str, Any] | None:
        """One job with its attempts, or None."""
        return admin.get_job(self, job_id, conn)

    def retry(
        self,
        conn: Any = None,
        *,
        ids: Sequence[int] | None = None,
        kind: str | None = None,
        queue: str | None = None,
        all_failed: bool = False,
        state: str | Sequence[str] | None = None,
        since: Any = None,
        until: Any = None,
        attempts: int = 1,
    ) -> list[int]:
        """Put failed (or, by id, cancelled) jobs back to pending; returns the ids retried.

        ``all_failed=True`` with no ids or filter retries every failed job. The
        filters match every job, not a page: ``state`` (failed by default, or
        cancelled), ``kind``, ``queue``, and ``since``/``until`` on when it was created.
        A job whose budget is spent gets ``attempts`` more tries (one by default: 3/3 becomes 3/4).
        """
        return admin.retry(self, conn, ids=ids, kind=kind, queue=queue, all_failed=all_failed, state=state,
                           since=since, until=until, attempts=attempts)

    def cancel(self, conn: Any = None, *, ids: Sequence[int] | None = None, reason: str | None = None,
               actor: str | None = None, kind: str | None = None, queue: str | None = None,
               state: str | Sequence[str] | None = None, since: Any = None, until: Any = None) -> list[int]:
        """Cancel pending, held or running jobs, by id or every one matching the filters; returns the ids cancelled.

        Filters: ``state`` (pending, held or running; all three by default),
        ``kind``, ``queue``, and ``since``/``until`` on when it was created.
        """
        return admin.cancel(self, conn, ids=ids, reason=reason, actor=actor, kind=kind, queue=queue, state=state,
                            since=since, until=until)

    def count_matching(self, conn: Any = None, *, action: str, ids: Sequence[int] | None = None,
                       kind: str | None = None, queue: str | None = None, state: str | Sequence[str] | None = None,
                       since: Any = None, until: Any = None, sample: int = 20) -> tuple[int, list[int]]:
        """How many jobs ``action`` ("retry", "cancel", "release", "reject") would touch with these filters,
        with the first ``sample`` ids."""
        return admin.count_matching(self, conn, action=action, ids=ids, kind=kind, queue=queue, state=state,
                                    since=since, until=until, sample=sample)

    def job_states(self, ids: Sequence[int], conn: Any = None) -> dict[int, str]:
        return admin.job_states(self, ids, conn)

    # -- review, replay, audit, limits (review.py, ratelimit.py) -------------

    def held_jobs(self, conn: Any = None, *, queue: str | None = None, kind: str | None = None,
                  limit: int = 50) -> list[dict[str, Any]]:
        """The review queue: held jobs, longest held first, with the Hold reason and data."""
        return admin.held_jobs(self, conn, queue=queue, kind=kind, limit=limit)

    def release(self, conn: Any, job_id: int, payload_patch: dict | None = None, *, actor: str | None = None,
                note: str | None = None) -> int:
        """Send a held job back to pending, its payload merged with ``payload_patch`` (jsonb ``||``).

        Recorded in ``attempts`` as 'released' by ``actor`` (default user@host)
        with ``note``. Raises JoblaneError when the job is not held.
        """
        return admin.release(self, conn, job_id, payload_patch, actor=actor, note=note)

    def reject(self, conn: Any, job_id: int, reason: str, *, actor: str | None = None) -> int:
        """Cancel a held job, recorded in ``attempts`` as 'rejected' with ``reason``."""
        return admin.reject(self, conn, job_id, reason, actor=actor)

    def release_held(self, conn: Any, *, kind: str | None = None, queue: str | None = None, since: Any = None,
                     until: Any = None, payload_patch: dict | None = None, actor: str | None = None,
                     note: str | None = None, ids: Sequence[int] | None = None) -> list[int]:
        """``release`` every held job matching the filters (``since``/``until`` on when it was created), or the
        held ones of ``ids``; returns the ids released. With a patch, a job whose payload is not a JSON object
        stays held."""
        return admin.release_held(self, conn, kind=kind, queue=queue, since=since, until=until,
                                  payload_patch=payload_patch, actor=actor, note=note, ids=ids)

    def reject_held(self, conn: Any, reason: str, *, kind: str | None = None, queue: str | None = None,
                    since: Any = None, until: Any = None, actor: str | None = None,
                    ids: Sequence[int] | None = None) -> list[int]:
        """``reject`` every held job matching the filters (or the held ones of ``ids``); returns the ids rejected."""
        return admin.reject_held(self, conn, reason, kind=kind, queue=queue, since=since, until=until, actor=actor,
                                 ids=ids)

    def replay(self, conn: Any, *, ids: Sequence[int] | None = None, kind: str | None = None,
               queue: str | None = None, state: str | Sequence[str] | None = None, since: Any = None,
               until: Any = None, payload_patch: dict | None = None, skip_replayed: bool = False,
               limit: int | None = None, dry_run: bool = False, tag: str | None = None) -> list[dict[str, Any]]:
        """Insert new jobs copied from the matching ones, payload patched, ``replay_of`` set.

        Old rows are never edited. Without ``state`` only finished jobs match;
        ``since``/``until`` bound when they finished (a datetime, a timedelta
        or text such as "24h"). ``dry_run`` inserts nothing and returns what
        would be inserted (``id`` None). ``tag`` names the replay, for
        ``compare_replay`` (``joblane compare TAG``).
        """
        return admin.replay(self, conn, ids=ids, kind=kind, queue=queue, state=state, since=since, until=until,
                             payload_patch=payload_patch, skip_replayed=skip_replayed, limit=limit, dry_run=dry_run,
                             tag=tag)

    def compare_replay(self, tag: str, conn: Any = None) -> dict[str, Any]:
        """The replays tagged ``tag`` against their originals: a summary per side and one row per pair."""
        return admin.compare_replay(self, tag, conn)

    def list_attempts(self, conn: Any = None, **filters: Any) -> list[dict[str, Any]]:
        """Attempts newest first; filters: kind, queue, outcome, model, since, until, job_id, before_id, limit."""
        return admin.list_attempts(self, conn, **filters)

    def export_attempts(self, conn: Any = None, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every matching attempt, oldest first, streamed through a server-side cursor (psycopg).

        Filters: kind, queue, outcome, model, since, until. Each row carries
        the job's current state.
        """
        return admin.export_attempts(self, conn, **filters)

    def limit(self, queue: str, **options: Any) -> Any:
        """Limit a queue for every worker: ``app.limit("models", per_minute=60, concurrency=8,
        tokens_per_minute=90_000, estimate="estimated_tokens", key="tenant", per_key=2)``.

        Written to the database by each worker at start. See joblane.ratelimit.
        """
        from .ratelimit import make_limit

        limit = make_limit(queue, **options)
        self.rate_limits[queue] = limit
        return limit

    def dataset(self, conn: Any = None, **filters: Any) -> Iterator[dict[str, Any]]:
        """One record per finished try (kind, queue, since, until), oldest first, streamed: input, output,
        steps, model, prompt version, tokens, cost, latency, outcome and review label (admin.dataset)."""
        return admin.dataset(self, conn, **filters)

    def budget(self, name: str, **options: Any) -> Any:
        """Cap the spend of a queue's jobs per key for every worker: ``app.budget("openai", queue="leads",
        per_day=20.0, key="tenant", estimate="estimated_cost")``.

        Written to the database by each worker at start, as the default: a cap an operator set
        (``joblane budgets set NAME --cap N``, ``set_budget_cap``) stands until ``reset_budget_cap``.
        A queue may have limits (``limit``) and budgets together. See joblane.budgets.
        """
        from .budgets import make_budget

        budget = make_budget(name, **options)
        self.budgets[name] = budget
        return budget

    def budget_status(self, conn: Any = None) -> list[dict[str, Any]]:
        """Every budget with each key's spend in the current window (see joblane.budgets)."""
        return admin.budget_status(self, conn)

    def set_budget_cap(self, name: str, cap: float, conn: Any = None) -> bool:
        """Set a budget's cap in the database as an operator (running workers use it at their next claim);
        False when there is no such budget. It stands over the cap the app declares, across worker restarts,
        until ``reset_budget_cap``."""
        return admin.set_budget_cap(self, name, cap, conn)

    def reset_budget_cap(self, name: str, conn: Any = None) -> float | None:
        """Drop the cap an operator set: the cap the app declares is in force again, and returned; None when the
        budget has no declared cap (made from the command line alone) or does not exist."""
        return admin.reset_budget_cap(self, name, conn)

    def pause_queue(self, conn: Any, queue: str, seconds: float, reason: str | None = None) -> dt.datetime:
        """Stop every worker from starting jobs of ``queue`` for ``seconds``; returns when the pause ends."""
        return admin.pause_queue(self, conn, queue, seconds, reason)

    def resume_queue(self, conn: Any, queue: str) -> bool:
        """End a queue's pause now; False when it was not paused."""
        return admin.resume_queue(self, conn, queue)

    def save_limit(self, conn: Any, queue: str, **options: Any) -> Any:
        """Write a queue's limits to the database now, for every worker (``joblane limits set``); the options
        are those of ``limit``. Returns the ``Limit`` written."""
        from .ratelimit import make_limit

        limit = make_limit(queue, **options)
        admin.save_limit(self, limit, conn)
        return limit

    def remove_limit(self, conn: Any, queue: str) -> bool:
        """Drop a queue's limits from the database; False when it had none."""
        return admin.remove_limit(self, queue, conn)

    def retry_outbox(self, conn: Any = None, *, ids: Sequence[int] | None = None, topic: str | None = None,
                     all_failed: bool = False, attempts: int = 10) -> list[int]:
        """Failed outbox rows back to pending with ``attempts`` more tries: by id, by topic prefix, or all."""
        return admin.retry_outbox(self, conn, ids=ids, topic=topic, all_failed=all_failed, attempts=attempts)

    def discard_outbox(self, conn: Any = None, *, ids: Sequence[int]) -> list[int]:
        """Delete unsent outbox messages (pending or failed): they are never delivered. Returns the ids discarded."""
        return admin.discard_outbox(self, conn, ids=ids)


def _attach_enqueue(app: App, fn: Callable[..., Any], kind: str) -> None:
    """Typed enqueue on the decorated function: ``enrich_lead.enqueue(conn, payload, **options)``,
    and in bulk: ``enrich_lead.enqueue_many(conn, payloads, **options)``."""

    def enqueue_job(conn: Any, payload: Any = None, **options: Any) -> int:
        return app.enqueue(conn, kind, payload, **options)

    async def enqueue_job_async(conn: Any, payload: Any = None, **options: Any) -> int:
        return await app.enqueue_async(conn, kind, payload, **options)

    def as_specs(payloads: Iterable[Any], options: dict[str, Any]) -> list[JobSpec]:
        """The jobs of a typed enqueue_many with parents (after=, on_parent_failure=): every job waits for them."""
        after, policy = options.pop("after", None), options.pop("on_parent_failure", None)
        return [JobSpec(kind, p, after=after, on_parent_failure=policy, **options) for p in payloads]

    def enqueue_many(conn: Any, payloads: Iterable[Any], *, batch: Any = None, **options: Any) -> list[int]:
        if "after" in options or "on_parent_failure" in options:
            return app.enqueue_many(conn, as_specs(payloads, options), batch=batch)
        chunks = enqueue.payload_chunks(app, kind, payloads, **options)
        ids = app._insert_chunks(conn, chunks)
        if batch is not None:
            flows.add(app, conn, batch, ids)
        return ids

    async def enqueue_many_async(conn: Any, payloads: Iterable[Any], *, batch: Any = None,
                                 **options: Any) -> list[int]:
        if "after" in options or "on_parent_failure" in options:
            return await app.enqueue_many_async(conn, as_specs(payloads, options), batch=batch)
        ids = await app._insert_chunks_async(conn, enqueue.payload_chunks(app, kind, payloads, **options))
        if batch is not None:
            await flows.add_async(app, conn, batch, ids)
        return ids

    enqueue_job.__doc__ = f"Enqueue a {kind!r} job on ``conn`` in the caller's transaction (App.enqueue)."
    enqueue_job_async.__doc__ = f"Enqueue a {kind!r} job on an async connection (App.enqueue_async)."
    enqueue_many.__doc__ = (
        f"Enqueue one {kind!r} job per payload on ``conn`` in the caller's transaction; returns their ids in order.\n\n"
        "The options (queue, priority, run_after, delay, max_attempts, held; after, on_parent_failure, batch) "
        "hold for every job; one statement per 5,000 jobs (App.enqueue_many).")
    enqueue_many_async.__doc__ = f"``enqueue_many`` of {kind!r} jobs on an async connection."
    try:
        fn.enqueue = enqueue_job
        fn.enqueue_async = enqueue_job_async
        fn.enqueue_many = enqueue_many
        fn.enqueue_many_async = enqueue_many_async
        fn.kind = kind
    except (AttributeError, TypeError):  # a callable that takes no attributes: enqueue by name only
        pass


def _executor(fn: Callable[..., Any], asked: str | None) -> str | None:
    """Where ``fn``'s tries run: ``asked``, else the event loop for an async def and a thread for a plain one."""
    if asked == "process":
        from .worker.child import function_ref

        function_ref(fn)  # refused now, not at the first try, when a child could not find it
        return "process"
    if asked == "thread" and inspect.iscoroutinefunction(fn):
        raise JoblaneError("executor='thread' is for a plain def task; an async def runs on the worker's loop")
    return None
