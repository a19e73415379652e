"""The store: the one place that runs SQL (migrations aside).

``Store`` has one method per named query of the catalogue (``sql/*.sql``);
a method only binds its arguments and returns a ``Statement``. Runners
execute a statement on whichever connection holds the work:

- the caller's connection, inside the caller's transaction, never committed:
  ``fetch`` (psycopg 3 sync, a SQLAlchemy session or connection, Django's
  connection) and ``fetch_async`` (psycopg ``AsyncConnection``, asyncpg,
  SQLAlchemy's async session);
- the worker's and relay's own asyncpg connections: ``records``, ``value``
  and ``run``;
- a server-side cursor for long reads: ``stream``.

The SQL uses ``$n`` placeholders, which asyncpg takes natively and psycopg
takes through its raw cursors, so each query is written once for all of
them. On a caller's psycopg connection a statement is prepared on the server
only where that is safe (``reaches_server``): the connection may sit behind
PgBouncer in transaction pooling, where a named prepared statement does not
survive the transaction.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import socket
import weakref
from typing import Any, Iterator, NamedTuple, Sequence

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from .errors import JoblaneError, SchemaVersionError
from .queries import for_schema


class Statement(NamedTuple):
    """A named query with its arguments, ready for a runner."""

    name: str
    sql: str
    args: tuple


# -- connections -----------------------------------------------------------------


def _unwrap(conn: Any) -> Any:
    """Find the DB-API connection under a SQLAlchemy session/connection or Django wrapper."""
    if isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        return conn
    module = type(conn).__module__
    if module.startswith("sqlalchemy.ext.asyncio"):
        raise JoblaneError(f"a SQLAlchemy {type(conn).__name__} needs the *_async variant (await app.enqueue_async(...))")
    # SQLAlchemy pooled connection (what Connection.connection holds): the driver's own connection.
    driver = getattr(conn, "driver_connection", None)
    if driver is not None:
        return _unwrap(driver)
    if module.startswith("sqlalchemy"):
        # Session.connection() is a method that joins (or begins) the session's
        # transaction; Connection.connection is the pooled connection under it.
        get = getattr(conn, "connection", None)
        if get is not None:
            return _unwrap(get() if callable(get) else get)
    dbapi = getattr(conn, "dbapi_connection", None)
    if dbapi is not None:
        return _unwrap(dbapi)
    # Django's connection wrapper: its psycopg connection is .connection once opened.
    if module.startswith("django"):
        conn.ensure_connection()
        return _unwrap(conn.connection)
    return conn


async def _unwrap_async(conn: Any) -> Any:
    """``_unwrap`` for SQLAlchemy's AsyncSession/AsyncConnection, whose connection must be awaited."""
    if not type(conn).__module__.startswith("sqlalchemy.ext.asyncio"):
        return _unwrap(conn)
    # AsyncSession.connection() joins (or begins) the session's transaction.
    sa_conn = conn if hasattr(conn, "get_raw_connection") else await conn.connection()
    pooled = await sa_conn.get_raw_connection()
    raw = pooled.driver_connection
    if is_asyncpg(raw) and not raw.is_in_transaction() and not getattr(pooled.dbapi_connection, "autocommit", False):
        # SQLAlchemy's asyncpg adapter sends BEGIN lazily, with the first
        # statement it runs itself; one that runs on the driver before it would
        # commit on its own. Let SQLAlchemy open its transaction first.
        await sa_conn.exec_driver_sql("SELECT 1")
    return raw


def is_asyncpg(conn: Any) -> bool:
    return type(conn).__module__.startswith("asyncpg")


# -- prepared statements on the caller's connection ----------------------------------

# What each caller's connection has shown: the joblane statements it ran so far (int), then whether it
# reaches PostgreSQL with nothing between (bool). Weak: the verdict goes with the connection.
_reach: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# The errors of a prepared statement that a pooler in transaction pooling lost or handed to another client.
_LOST_STATEMENT = (pg_errors.InvalidSqlStatementName, pg_errors.DuplicatePreparedStatement)
# invalid_schema_name and undefined_table, from psycopg or asyncpg: the schema was never migrated (or is older)
_NOT_MIGRATED = ("3F000", "42P01")


def _not_migrated(exc: BaseException) -> JoblaneError:
    """The one-line error for a statement of ours that found no joblane schema, or not all of its tables."""
    text = str(exc)
    found = re.search(r'schema "(.*?)" does not exist', text)
    if found:
        return SchemaVersionError(f"schema {found.group(1)!r} has no joblane tables: run `joblane migrate`")
    found = re.search(r'relation "(?:(.*)\.)?(.*?)" does not exist', text)
    schema, table = (found.group(1), found.group(2)) if found else (None, None)
    where = f"schema {schema!r} has no table {table!r}" if schema else "a joblane table is missing"
    return SchemaVersionError(f"{where} (never migrated, or older than this joblane): run `joblane migrate`")


def _same_ends(fd: int, row: Sequence[Any]) -> bool:
    """Whether the client's socket ``fd`` is the one the server's session sees (``row``: the endpoints query).

    Over TCP both ends must match: the client's address and port as the server sees them are the
    socket's own, and the server's are the socket's peer. A pooler or proxy between them opens a
    connection of its own, from another port. Over a unix socket the socket must be the server's
    own (a directory of its ``unix_socket_directories``, its port), which only a role allowed to read
    that setting can tell; anything else is not known to be direct.
    """
    try:
        return _ends_match(fd, *row)
    except (OSError, ValueError):  # a socket Python cannot look at, an address it cannot read: not known
        return False


def _ends_match(fd: int, client_addr: str | None, client_port: int | None, server_addr: str | None,
                server_port: int | None, port: str, socket_dirs: str | None) -> bool:
    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            if client_addr is None or server_addr is None:
                return False
            local, peer = sock.getsockname(), sock.getpeername()
            return (ipaddress.ip_address(local[0]) == ipaddress.ip_address(client_addr) and local[1] == client_port
                    and ipaddress.ip_address(peer[0]) == ipaddress.ip_address(server_addr)
                    and peer[1] == server_port)
        if sock.family == socket.AF_UNIX and socket_dirs and client_addr is None:
            path = sock.getpeername()
            if not isinstance(path, str) or os.path.basename(path) != f".s.PGSQL.{port}":
                return False
            dirs = {os.path.realpath(d.strip().strip('"')) for d in socket_dirs.split(",") if d.strip()}
            return os.path.realpath(os.path.dirname(path)) in dirs
    return False


def through_pooler(fd: int, row: Sequence[Any]) -> bool:
    """Whether the socket ``fd`` is known to reach the server through a pooler or proxy (``row``: endpoints).

    The reverse of ``_same_ends`` where the ends can be told, and False where they cannot (a unix
    socket whose folder this role may not read): the worker then keeps its direct mode, as before.
    Over TCP the two ends differ; over a unix socket its name carries another port than the server's,
    or it lies in none of the server's socket folders.
    """
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.family == socket.AF_UNIX:
                path = sock.getpeername()
                if not isinstance(path, str) or os.path.basename(path) != f".s.PGSQL.{row[4]}":
                    return True
                return bool(row[5]) and not _ends_match(fd, *row)
        return not _ends_match(fd, *row)
    except (OSError, ValueError):
        return False


async def through_pooler_async(conn: Any) -> bool:
    """``through_pooler`` for an asyncpg connection (the worker's look at start)."""
    stmt = Store("joblane").endpoints()
    row = await conn.fetchrow(stmt.sql, *stmt.args)
    sock = conn._transport.get_extra_info("socket")  # noqa: SLF001 - asyncpg has no public way to its socket
    return sock is not None and through_pooler(sock.fileno(), tuple(row))


async def dsn_through_pooler(dsn: str, application_name: str, timeout: float = 60.0) -> bool:
    """Whether a new asyncpg connection to ``dsn`` reaches the server through a pooler or proxy (one look)."""
    import asyncpg

    conn = await asyncpg.connect(dsn, statement_cache_size=0, server_settings={"application_name": application_name},
                                 timeout=timeout)
    try:
        return await through_pooler_async(conn)
    finally:
        await conn.close()


def _pooling_said() -> bool:
    return os.environ.get("JOBLANE_PGBOUNCER", "").strip().lower() in ("1", "true", "yes", "on")


def _prepare_arg(raw: Any, prepare: bool | None) -> bool | None:
    """psycopg's ``prepare`` for a joblane statement on ``raw``; ``...`` when the endpoints must be asked first.

    ``prepare`` is App(prepare=...): True lets psycopg's ``prepare_threshold`` decide, False never
    prepares, None (the default) does what True does on a connection that ``reaches_server``. The
    question is asked once per connection, at its ``prepare_threshold``-th joblane statement, so a
    connection that enqueues a few jobs and closes pays nothing for it.
    """
    if prepare is not None:
        return None if prepare else False
    seen = _reach.get(raw, 0)
    if seen is True:
        return None
    if seen is False or raw.prepare_threshold is None or _pooling_said():
        return False
    if seen + 1 < raw.prepare_threshold or raw.info.transaction_status == TransactionStatus.INERROR:
        _reach[raw] = seen + 1
        return False
    return ...


def reaches_server(conn: Any) -> bool:
    """Whether a psycopg connection reaches PostgreSQL with no pooler or proxy between (asks the server)."""
    raw = _unwrap(conn)
    with psycopg.RawCursor(raw) as cur:
        stmt = Store("joblane").endpoints()  # it names no schema: any schema's Store binds it
        row = cur.execute(stmt.sql, stmt.args, prepare=False).fetchone()
    verdict = _same_ends(raw.pgconn.socket, row)
    _reach[raw] = verdict
    return verdict


async def reaches_server_async(raw: Any) -> bool:
    """``reaches_server`` for a psycopg AsyncConnection."""
    async with psycopg.AsyncRawCursor(raw) as cur:
        stmt = Store("joblane").endpoints()
        row = await (await cur.execute(stmt.sql, stmt.args, prepare=False)).fetchone()
    verdict = _same_ends(raw.pgconn.socket, row)
    _reach[raw] = verdict
    return verdict


def _lost(raw: Any, prepare: bool | None) -> bool:
    """After a lost prepared statement: never prepare on ``raw`` again; whether to run the statement again.

    Only where joblane chose to prepare (``prepare=None``), and only outside a transaction (in
    autocommit, where the failed statement changed nothing): inside one the caller's transaction is
    already aborted, and the error is theirs to see.
    """
    if prepare is not None:
        return False
    _reach[raw] = False
    return raw.info.transaction_status == TransactionStatus.IDLE


# -- runners -----------------------------------------------------------------------


def fetch(conn: Any, stmt: Statement, *, prepare: bool | None = False) -> list[tuple]:
    """Run ``stmt`` on a sync psycopg connection (or a wrapper of one); every row as a tuple.

    ``prepare``: App(prepare=...), as ``_prepare_arg`` reads it; the default False never prepares.
    """
    raw = _unwrap(conn)
    if not isinstance(raw, psycopg.Connection):
        raise JoblaneError(
            f"expected a psycopg 3 Connection, got {type(conn).__name__}: "
            "use the *_async variant for asyncpg or psycopg AsyncConnection"
        )
    arg = _prepare_arg(raw, prepare)
    if arg is ...:
        arg = None if reaches_server(raw) else False
    try:
        with psycopg.RawCursor(raw) as cur:
            cur.execute(stmt.sql, stmt.args, prepare=arg)
            # rownumber is None when the statement returned no rows to fetch; description would build
            # a Column per field to say the same (about a tenth of the client's time for one enqueue)
            return cur.fetchall() if cur.rownumber is not None else []
    except _LOST_STATEMENT:
        if arg is False or not _lost(raw, prepare):
            raise
    except (pg_errors.InvalidSchemaName, pg_errors.UndefinedTable) as exc:
        raise _not_migrated(exc) from None
    return fetch(raw, stmt, prepare=False)


async def fetch_async(conn: Any, stmt: Statement, *, prepare: bool | None = False) -> list[tuple]:
    """Run ``stmt`` on a psycopg AsyncConnection or an asyncpg connection; every row as a tuple.

    ``prepare`` applies to psycopg as in ``fetch``; asyncpg prepares by its own statement cache.
    """
    raw = await _unwrap_async(conn)
    if isinstance(raw, psycopg.AsyncConnection):
        arg = _prepare_arg(raw, prepare)
        if arg is ...:
            arg = None if await reaches_server_async(raw) else False
        try:
            async with psycopg.AsyncRawCursor(raw) as cur:
                await cur.execute(stmt.sql, stmt.args, prepare=arg)
                return await cur.fetchall() if cur.rownumber is not None else []
        except _LOST_STATEMENT:
            if arg is False or not _lost(raw, prepare):
                raise
        except (pg_errors.InvalidSchemaName, pg_errors.UndefinedTable) as exc:
            raise _not_migrated(exc) from None
        return await fetch_async(raw, stmt, prepare=False)
    if is_asyncpg(raw) or hasattr(raw, "fetch"):
        try:
            return [tuple(r) for r in await raw.fetch(stmt.sql, *stmt.args)]
        except Exception as exc:
            if getattr(exc, "sqlstate", None) in _NOT_MIGRATED:
                raise _not_migrated(exc) from None
            raise
    if isinstance(raw, psycopg.Connection):
        raise JoblaneError("got a sync psycopg Connection in an *_async call: use the sync variant")
    raise JoblaneError(f"unsupported connection type {type(conn).__name__}")


async def records(conn: Any, stmt: Statement) -> list:
    """Run ``stmt`` on the worker's or relay's own asyncpg connection (or pool); asyncpg Records."""
    return await conn.fetch(stmt.sql, *stmt.args)


def claimed_rows(rows: list) -> tuple[list, bool]:
    """The jobs a claim_jobs call returned, and whether to claim again at once.

    The claim ends with a row of NULLs when it found fewer jobs than asked
    while a lane was busy with another claim, or after it promoted deferred
    jobs that only a later claim can take (migration 0013).
    """
    jobs = [r for r in rows if r[0] is not None]
    return jobs, len(jobs) < len(rows)


async def keep_session(conn: Any) -> None:
    """An asyncpg pool's reset for the worker's and the relay's own pools: nothing beyond asyncpg's rollback.

    Their pooled connections keep no session state but what they set on
    purpose when they connect (no LISTEN: the notifiers have connections of
    their own; advisory locks are transaction-scoped), so asyncpg's default
    reset (RESET ALL, UNLISTEN *, CLOSE ALL, pg_advisory_unlock_all) would be
    one more round trip per use for nothing, and would undo that setting.
    """


async def value(conn: Any, stmt: Statement) -> Any:
    """The first column of the first row of ``stmt`` on an asyncpg connection."""
    return await conn.fetchval(stmt.sql, *stmt.args)


async def run(conn: Any, stmt: Statement) -> None:
    """Run ``stmt`` for its effect on an asyncpg connection (or pool)."""
    await conn.execute(stmt.sql, *stmt.args)


def check_sync(conn: Any, what: str) -> None:
    """Refuse, before any row is read, a connection that is not (or does not wrap) a sync psycopg one."""
    if not isinstance(_unwrap(conn), psycopg.Connection):
        raise JoblaneError(f"{what} needs a psycopg 3 Connection, got {type(conn).__name__}")


def stream(conn: Any, stmt: Statement, *, page: int = 2000) -> Iterator[tuple]:
    """Rows of ``stmt`` through a server-side cursor on a psycopg connection, ``page`` at a time.

    The cursor lives in a transaction (a savepoint when the caller has one open).
    """
    raw = _unwrap(conn)
    if not isinstance(raw, psycopg.Connection):
        raise JoblaneError(f"streaming needs a psycopg 3 Connection, got {type(conn).__name__}")
    with raw.transaction():
        with psycopg.RawServerCursor(raw, f"joblane_{stmt.name}") as cur:
            cur.itersize = page
            cur.execute(stmt.sql, stmt.args)
            yield from cur


# -- outcome documents ----------------------------------------------------------

_OUTCOME = ('{"id":%d,"attempt":%d,"state":"%s","outcome":"%s","error":%s,"delay":%r,"refund":%d,'
            '"result":%s,"started_at":%s,"finished_at":%s,"meta":%s}')
# A try with nothing to add to its state and times (most successes): its object leaves out the fields
# that would be null or zero, which complete_jobs reads as such; a third less to send and to parse.
_PLAIN = '{"id":%d,"attempt":%d,"state":"%s","outcome":"%s","started_at":%s,"finished_at":%s}'


def outcome_rows(outcomes: Sequence[Any]) -> str:
    """The JSON array ``complete_jobs`` takes: one object per Outcome (types.Outcome)."""
    encode = json.JSONEncoder(ensure_ascii=False).encode
    return "[" + ",".join(
        _PLAIN % (o.job_id, o.attempt, o.state, o.outcome,
                  "null" if o.started_at is None else repr(float(o.started_at)),
                  "null" if o.finished_at is None else repr(float(o.finished_at)))
        if o.error is None and o.result is None and o.meta is None and not o.refund and not o.delay else
        _OUTCOME % (o.job_id, o.attempt, o.state, o.outcome, "null" if o.error is None else encode(o.error),
                    float(o.delay), o.refund, "null" if o.result is None else o.result,
                    "null" if o.started_at is None else repr(float(o.started_at)),
                    "null" if o.finished_at is None else repr(float(o.finished_at)),
                    "null" if o.meta is None else o.meta)
        for o in outcomes
    ) + "]"


# -- the named queries -------------------------------------------------------------


class Store:
    """One method per named query of one schema; each returns a Statement for a runner."""

    def __init__(self, schema: str):
        self.schema = schema
        self.sql = for_schema(schema)

    def _s(self, name: str, *args: Any) -> Statement:
        return Statement(name, getattr(self.sql, name), args)

    # -- jobs.sql: the job lifecycle -----------------------------------------

    def enqueue(self, queue, kind, payload_json, priority, max_attempts, run_after, delay, unique_key, state,
                replay_of, notify, channel, headers_json) -> Statement:
        return self._s("enqueue", queue, kind, payload_json, priority, max_attempts, run_after, delay, unique_key,
                       state, replay_of, notify, channel, headers_json)

    def enqueue_plain(self, queue, kind, payload_json, priority, max_attempts, run_after, delay, state, replay_of,
                      notify, channel, headers_json) -> Statement:
        return self._s("enqueue_plain", queue, kind, payload_json, priority, max_attempts, run_after, delay, state,
                       replay_of, notify, channel, headers_json)

    def endpoints(self) -> Statement:
        return self._s("endpoints")

    def unfinished_by_unique_key(self, unique_key) -> Statement:
        return self._s("unfinished_by_unique_key", unique_key)

    def enqueue_many(self, payloads_json, queue, kind, priority, max_attempts, run_after, delay, state, channel,
                     wake_queues) -> Statement:
        return self._s("enqueue_many", payloads_json, queue, kind, priority, max_attempts, run_after, delay, state,
                       channel, wake_queues)

    def enqueue_many_varied(self, payloads_json, queue, kind, priority, max_attempts, run_after, delay, unique_key,
                            state, queues_json, kinds_json, priorities_json, max_attempts_json, run_afters_json,
                            delays_json, unique_keys_json, states_json, channel, wake_queues) -> Statement:
        return self._s("enqueue_many_varied", payloads_json, queue, kind, priority, max_attempts, run_after, delay,
                       unique_key, state, queues_json, kinds_json, priorities_json, max_attempts_json,
                       run_afters_json, delays_json, unique_keys_json, states_json, channel, wake_queues)

    def enqueue_many_unique(self, payloads_json, queue, kind, priority, max_attempts, run_after, delay, unique_key,
                            state, queues_json, kinds_json, priorities_json, max_attempts_json, run_afters_json,
                            delays_json, unique_keys_json, states_json, channel, wake_queues) -> Statement:
        return self._s("enqueue_many_unique", payloads_json, queue, kind, priority, max_attempts, run_after, delay,
                       unique_key, state, queues_json, kinds_json, priorities_json, max_attempts_json,
                       run_afters_json, delays_json, unique_keys_json, states_json, channel, wake_queues)

    def claim_jobs(self, queues, limit, worker, lease_seconds) -> Statement:
        return self._s("claim_jobs", queues, limit, worker, lease_seconds)

    def complete_jobs(self, outcomes_json, worker) -> Statement:
        return self._s("complete_jobs", outcomes_json, worker)

    def delete_done(self, job_ids, attempts, worker) -> Statement:
        return self._s("delete_done", job_ids, attempts, worker)

    def extend_leases(self, job_ids, worker, lease_seconds) -> Statement:
        return self._s("extend_leases", job_ids, worker, lease_seconds)

    def rotate_ready(self, turn_every) -> Statement:
        return self._s("rotate_ready", turn_every)

    def prune_deferred(self, limit) -> Statement:
        return self._s("prune_deferred", limit)

    def rescue_expired(self, limit) -> Statement:
        return self._s("rescue_expired", limit)

    def prune_finished(self, retention_seconds, prune_failed, limit) -> Statement:
        return self._s("prune_finished", retention_seconds, prune_failed, limit)

    def ensure_attempt_generations(self) -> Statement:
        return self._s("ensure_attempt_generations")

    def attempt_generations(self) -> Statement:
        return self._s("attempt_generations")

    def retire_attempt_generation(self, partition, retention_seconds, prune_failed) -> Statement:
        return self._s("retire_attempt_generation", partition, retention_seconds, prune_failed)

    def short_lock_timeout(self) -> Statement:
        return self._s("short_lock_timeout")

    def lock_holder(self, table) -> Statement:
        return self._s("lock_holder", table)

    def job_steps(self, job_id) -> Statement:
        return self._s("job_steps", job_id)

    def save_step(self, job_id, name, attempt, result_json) -> Statement:
        return self._s("save_step", job_id, name, attempt, result_json)

    def vacuum_due(self, tables, min_dead, idle_seconds) -> Statement:
        return self._s("vacuum_due", self.schema, tables, min_dead, idle_seconds)

    def dead_rows(self, table) -> Statement:
        return self._s("dead_rows", self.schema, table)

    def horizon_holder(self) -> Statement:
        return self._s("horizon_holder")

    def vacuum_jobs(self) -> Statement:
        return self._s("vacuum_jobs")

    def vacuum_outbox(self) -> Statement:
        return self._s("vacuum_outbox")

    def try_service_lock(self, key) -> Statement:
        return self._s("try_service_lock", key)

    def note_late_outcomes(self, outcomes_json, worker) -> Statement:
        return self._s("note_late_outcomes", outcomes_json, worker)

    def register_process(self, name, role, host, pid, version, queues, kinds, concurrency,
                         lease_seconds) -> Statement:
        return self._s("register_process", name, role, host, pid, version, queues, kinds, concurrency, lease_seconds)

    def heartbeat_process(self, name, running, lease_seconds, stopping=None) -> Statement:
        return self._s("heartbeat_process", name, running, lease_seconds, stopping)

    def deregister_process(self, name) -> Statement:
        return self._s("deregister_process", name)

    def kind_known_live(self, kind, other_than) -> Statement:
        return self._s("kind_known_live", kind, other_than)

    def prune_processes(self, grace_seconds) -> Statement:
        return self._s("prune_processes", grace_seconds)

    # -- flows.sql: dependencies, batches, durable waits -------------------------

    def link_jobs(self, children, parents, policies) -> Statement:
        return self._s("link_jobs", children, parents, policies)

    def create_batch(self, name, kind, queue, payload_json, priority, max_attempts) -> Statement:
        return self._s("create_batch", name, kind, queue, payload_json, priority, max_attempts)

    def add_to_batch(self, batch_id, job_ids) -> Statement:
        return self._s("add_to_batch", batch_id, job_ids)

    def seal_batch(self, batch_id) -> Statement:
        return self._s("seal_batch", batch_id)

    def batch_progress(self, batch_id) -> Statement:
        return self._s("batch_progress", batch_id)

    def list_batches(self, before_id, limit, unfinished) -> Statement:
        return self._s("list_batches", before_id, limit, unfinished)

    def batch_jobs(self, batch_id, state, limit, after_id=None) -> Statement:
        return self._s("batch_jobs", batch_id, state, limit, after_id)

    def job_flow(self, job_id) -> Statement:
        return self._s("job_flow", job_id)

    def signal(self, key, data_json) -> Statement:
        return self._s("signal", key, data_json)

    def park_jobs(self, outcomes_json, worker) -> Statement:
        return self._s("park_jobs", outcomes_json, worker)

    def expire_waits(self, limit, channel) -> Statement:
        return self._s("expire_waits", limit, channel)

    def prune_flows(self, retention_seconds, limit) -> Statement:
        return self._s("prune_flows", retention_seconds, limit)

    def waiting_jobs(self, limit, queue) -> Statement:
        return self._s("waiting_jobs", limit, queue)

    # -- admin.sql: reading and steering jobs ----------------------------------

    def status_counts(self) -> Statement:
        return self._s("status_counts")

    def list_jobs(self, state, kind, queue, before_id, limit, created_from=None, created_before=None) -> Statement:
        return self._s("list_jobs", state, kind, queue, before_id, limit, created_from, created_before)

    def get_job(self, job_id) -> Statement:
        return self._s("get_job", job_id)

    def job_attempts(self, job_id) -> Statement:
        return self._s("job_attempts", job_id)

    def retry_jobs(self, ids, kind, queue, states, created_from=None, created_before=None, more_tries=1) -> Statement:
        return self._s("retry_jobs", ids, kind, queue, states, created_from, created_before, more_tries)

    def cancel_jobs(self, ids, reason, actor, states=None, kind=None, queue=None, created_from=None,
                    created_before=None) -> Statement:
        return self._s("cancel_jobs", ids, reason, actor, states, kind, queue, created_from, created_before)

    def count_jobs(self, ids, states, kind, queue, created_from, created_before, sample) -> Statement:
        return self._s("count_jobs", ids, states, kind, queue, created_from, created_before, sample)

    def job_states(self, ids) -> Statement:
        return self._s("job_states", ids)

    def table_health(self, schema) -> Statement:
        return self._s("table_health", schema)

    def database_health(self) -> Statement:
        return self._s("database_health")

    def list_processes(self) -> Statement:
        return self._s("list_processes")

    def unfinished_count(self, queues) -> Statement:
        return self._s("unfinished_count", queues)

    def jobs_of_kind(self, kind, state) -> Statement:
        return self._s("jobs_of_kind", kind, state)

    # -- review.sql: held jobs, replays, attempts --------------------------------

    def held_jobs(self, queue, kind, limit) -> Statement:
        return self._s("held_jobs", queue, kind, limit)

    def release_jobs(self, ids, kind, queue, created_from, created_before, patch_json, actor, note, notify,
                     channel) -> Statement:
        return self._s("release_jobs", ids, kind, queue, created_from, created_before, patch_json, actor, note,
                       notify, channel)

    def reject_jobs(self, ids, kind, queue, created_from, created_before, reason, actor) -> Statement:
        return self._s("reject_jobs", ids, kind, queue, created_from, created_before, reason, actor)

    def job_replays(self, job_id) -> Statement:
        return self._s("job_replays", job_id)

    def replay_jobs(self, ids, kind, queue, states, since, until, skip_replayed, limit, patch_json, dry_run,
                    notify, channel, tag=None) -> Statement:
        return self._s("replay_jobs", ids, kind, queue, states, since, until, skip_replayed, limit, patch_json,
                       dry_run, notify, channel, tag)

    def list_attempts(self, kind, queue, outcome, model, since, until, job_id, before_id, limit) -> Statement:
        return self._s("list_attempts", kind, queue, outcome, model, since, until, job_id, before_id, limit)

    def export_attempts(self, kind, queue, outcome, model, since, until) -> Statement:
        return self._s("export_attempts", kind, queue, outcome, model, since, until)

    # -- limits.sql: queue limits and pauses ------------------------------------

    def upsert_queue_limit(self, queue, max_starts, starts_interval, concurrency, max_cost, cost_interval,
                           estimate_path, default_estimate, key_path, per_key) -> Statement:
        return self._s("upsert_queue_limit", queue, max_starts, starts_interval, concurrency, max_cost,
                       cost_interval, estimate_path, default_estimate, key_path, per_key)

    def delete_queue_limit(self, queue) -> Statement:
        return self._s("delete_queue_limit", queue)

    def pause_queue(self, queue, seconds, reason) -> Statement:
        return self._s("pause_queue", queue, seconds, reason)

    def resume_queue(self, queue) -> Statement:
        return self._s("resume_queue", queue)

    def queue_controls(self, queues) -> Statement:
        return self._s("queue_controls", queues)

    def lock_queue_claims(self, key) -> Statement:
        return self._s("lock_queue_claims", key)

    def claim_jobs_limited(self, queue, limit, worker, lease_seconds) -> Statement:
        return self._s("claim_jobs_limited", queue, limit, worker, lease_seconds)

    def queue_limits_status(self) -> Statement:
        return self._s("queue_limits_status")

    def job_queue_holds(self, job_id) -> Statement:
        return self._s("job_queue_holds", job_id)

    # -- ai.sql: budgets, cached steps, the dataset export, replay comparisons ---

    def declare_budget(self, name, queue, cap, window_seconds, key_path, estimate_path, default_estimate,
                       cost_field) -> Statement:
        return self._s("declare_budget", name, queue, cap, window_seconds, key_path, estimate_path,
                       default_estimate, cost_field)

    def upsert_budget(self, name, queue, cap, window_seconds, key_path, estimate_path, default_estimate,
                      cost_field) -> Statement:
        return self._s("upsert_budget", name, queue, cap, window_seconds, key_path, estimate_path,
                       default_estimate, cost_field)

    def set_budget_cap(self, name, cap) -> Statement:
        return self._s("set_budget_cap", name, cap)

    def reset_budget_cap(self, name) -> Statement:
        return self._s("reset_budget_cap", name)

    def delete_budget(self, name) -> Statement:
        return self._s("delete_budget", name)

    def fold_budget_holds(self, queue) -> Statement:
        return self._s("fold_budget_holds", queue)

    def budget_spend(self, job_id) -> Statement:
        return self._s("budget_spend", job_id)

    def settle_lean_costs(self, document) -> Statement:
        return self._s("settle_lean_costs", document)

    def prune_budget_usage(self, limit) -> Statement:
        return self._s("prune_budget_usage", limit)

    def prune_step_cache(self, limit) -> Statement:
        return self._s("prune_step_cache", limit)

    def ai_table_health(self) -> Statement:
        return self._s("ai_table_health")

    def cache_claim(self, key, step, job_id, attempt, claim_seconds) -> Statement:
        return self._s("cache_claim", key, step, job_id, attempt, claim_seconds)

    def cache_hit(self, key) -> Statement:
        return self._s("cache_hit", key)

    def cache_fill(self, key, job_id, attempt, result_json, meta_json, ttl_seconds) -> Statement:
        return self._s("cache_fill", key, job_id, attempt, result_json, meta_json, ttl_seconds)

    def cache_release(self, key, job_id, attempt) -> Statement:
        return self._s("cache_release", key, job_id, attempt)

    def cache_stats(self) -> Statement:
        return self._s("cache_stats")

    def cache_clear(self, stored_before, step) -> Statement:
        return self._s("cache_clear", stored_before, step)

    def dataset_rows(self, kind, queue, since, until) -> Statement:
        return self._s("dataset_rows", kind, queue, since, until)

    def compare_replay(self, tag) -> Statement:
        return self._s("compare_replay", tag)

    def replay_tags(self, limit) -> Statement:
        return self._s("replay_tags", limit)

    # -- periodic.sql: the scheduler --------------------------------------------

    def latest_periodic_ticks(self, names) -> Statement:
        return self._s("latest_periodic_ticks", names)

    def enqueue_periodic(self, names, ticks, queues, kinds, payloads, priorities, max_attempts, unique_keys,
                         notify, channel) -> Statement:
        return self._s("enqueue_periodic", names, ticks, queues, kinds, payloads, priorities, max_attempts,
                       unique_keys, notify, channel)

    def prune_periodic_ticks(self, retention_seconds) -> Statement:
        return self._s("prune_periodic_ticks", retention_seconds)

    # -- outbox.sql: publish, relay, inbox ---------------------------------------

    def publish(self, topic, key, idempotency_key, payload_json, headers_json, notify, channel) -> Statement:
        return self._s("publish", topic, key, idempotency_key, payload_json, headers_json, notify, channel)

    def inbox_record(self, key) -> Statement:
        return self._s("inbox_record", key)

    def claim_outbox(self, limit, prefixes, ordered, relay, lease_seconds) -> Statement:
        return self._s("claim_outbox", limit, prefixes, ordered, relay, lease_seconds)

    def requeue_lost_outbox(self) -> Statement:
        return self._s("requeue_lost_outbox")

    def finish_outbox(self, ids, outcomes, attempts, delays, errors, relay) -> Statement:
        return self._s("finish_outbox", ids, outcomes, attempts, delays, errors, relay)

    def hash_joins_only(self) -> Statement:
        return self._s("hash_joins_only")

    def plan_for_arguments(self) -> Statement:
        return self._s("plan_for_arguments")

    def extend_outbox_leases(self, ids, relay, lease_seconds) -> Statement:
        return self._s("extend_outbox_leases", ids, relay, lease_seconds)

    def list_outbox(self, state, topic_prefix, before_id, limit) -> Statement:
        return self._s("list_outbox", state, topic_prefix, before_id, limit)

    def get_outbox(self, message_id) -> Statement:
        return self._s("get_outbox", message_id)

    def outbox_counts(self) -> Statement:
        return self._s("outbox_counts")

    def unrouted_outbox(self, prefixes, limit) -> Statement:
        return self._s("unrouted_outbox", prefixes, limit)

    def retry_outbox(self, ids, topic_prefix, all_failed, extra_attempts) -> Statement:
        return self._s("retry_outbox", ids, topic_prefix, all_failed, extra_attempts)

    def discard_outbox(self, ids) -> Statement:
        return self._s("discard_outbox", ids)

    def prune_outbox(self, retention_seconds, limit) -> Statement:
        return self._s("prune_outbox", retention_seconds, limit)

    def complete_job_in_transaction(self, job_id, attempt, result_json, meta_json) -> Statement:
        return self._s("complete_job_in_transaction", job_id, attempt, result_json, meta_json)

    # -- dashboard.sql: the dashboard's reads -------------------------------------

    def dashboard_queue_counts(self) -> Statement:
        return self._s("dashboard_queue_counts")

    def dashboard_table_estimate(self, schema) -> Statement:
        return self._s("dashboard_table_estimate", schema)

    def dashboard_finished_counts(self) -> Statement:
        return self._s("dashboard_finished_counts")

    def dashboard_throughput(self, minutes) -> Statement:
        return self._s("dashboard_throughput", minutes)

    def dashboard_workers(self, ids_per_worker) -> Statement:
        return self._s("dashboard_workers", ids_per_worker)


    def dashboard_job_steps(self, job_id) -> Statement:
        return self._s("dashboard_job_steps", job_id)

    def dashboard_held_jobs(self, after_held_since, after_id, queue, limit) -> Statement:
        return self._s("dashboard_held_jobs", after_held_since, after_id, queue, limit)

    def dashboard_attempt_outcomes(self, seconds) -> Statement:
        return self._s("dashboard_attempt_outcomes", seconds)

    def dashboard_outbox_topics(self, sent_within_seconds) -> Statement:
        return self._s("dashboard_outbox_topics", sent_within_seconds)

    def dashboard_outbox_failed(self, before_id, topic, limit) -> Statement:
        return self._s("dashboard_outbox_failed", before_id, topic, limit)

    def dashboard_paused_queues(self) -> Statement:
        return self._s("dashboard_paused_queues")

    # -- history.sql: hourly roll-ups of the attempts --------------------------

    def history_no_jit(self) -> Statement:
        return self._s("history_no_jit")

    def history_hours_todo(self, hours, limit) -> Statement:
        return self._s("history_hours_todo", hours, limit)

    def history_minutes_todo(self, settle_seconds, hours, limit) -> Statement:
        return self._s("history_minutes_todo", settle_seconds, hours, limit)

    def history_rollup(self, start, seconds) -> Statement:
        return self._s("history_rollup", start, seconds)

    def history_full_hours(self) -> Statement:
        return self._s("history_full_hours")

    def history_merge_attempts(self, hour) -> Statement:
        return self._s("history_merge_attempts", hour)

    def history_merge_latency(self, hour) -> Statement:
        return self._s("history_merge_latency", hour)

    def history_merge_slices(self, hour) -> Statement:
        return self._s("history_merge_slices", hour)

    def history_prune(self, keep_seconds) -> Statement:
        return self._s("history_prune", keep_seconds)

    def history_slices_since(self, since) -> Statement:
        return self._s("history_slices_since", since)

    def history_first_attempt(self, since) -> Statement:
        return self._s("history_first_attempt", since)

    def history_counts(self, slice_starts, live_from, live_to) -> Statement:
        return self._s("history_counts", slice_starts, live_from, live_to)

    def history_latency_buckets(self, slice_starts, live_from, live_to) -> Statement:
        return self._s("history_latency_buckets", slice_starts, live_from, live_to)

    def history_series(self, slice_starts, live_from, live_to, bucket_seconds) -> Statement:
        return self._s("history_series", slice_starts, live_from, live_to, bucket_seconds)

    def history_latency_series(self, slice_starts, live_from, live_to, bucket_seconds) -> Statement:
        return self._s("history_latency_series", slice_starts, live_from, live_to, bucket_seconds)

    def dashboard_outbox_retrying(self, topic, limit) -> Statement:
        return self._s("dashboard_outbox_retrying", topic, limit)

    def dashboard_failed_recent(self, seconds) -> Statement:
        return self._s("dashboard_failed_recent", seconds)

    def dashboard_job_id_range(self) -> Statement:
        return self._s("dashboard_job_id_range")

    def dashboard_search_jobs(self, states, kind, queue, since, until, payload, error, before_id, limit,
                              from_id) -> Statement:
        return self._s("dashboard_search_jobs", states, kind, queue, since, until, payload, error, before_id, limit,
                       from_id)

    def dashboard_search_ids(self, states, kind, queue, since, until, payload, error, limit) -> Statement:
        return self._s("dashboard_search_ids", states, kind, queue, since, until, payload, error, limit)


@functools.lru_cache(maxsize=None)
def for_schema_store(schema: str) -> Store:
    """The Store of ``schema`` (one per schema per process)."""
    return Store(schema)
