"""Run named queries on whatever connection the caller holds.

``enqueue``/``publish`` execute on the caller's own connection, inside the
caller's transaction, and never commit it. Three drivers are accepted: a
psycopg 3 ``Connection`` (sync), a psycopg ``AsyncConnection`` and an
asyncpg ``Connection``. The SQL uses ``$n`` placeholders, which asyncpg takes
natively and psycopg takes through its raw cursors, so each query is written
once for all of them.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import psycopg

from .errors import JoblaneError


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


_OUTCOME = ('{"id":%d,"attempt":%d,"state":"%s","outcome":"%s","error":%s,"delay":%r,"refund":%d,'
            '"result":%s,"started_at":%s,"finished_at":%s,"meta":%s}')


def outcome_rows(outcomes: Sequence[Any]) -> str:
    """The JSON array ``complete_jobs`` takes as $1: one object per Outcome (types.Outcome)."""
    encode = json.JSONEncoder(ensure_ascii=False).encode
    return "[" + ",".join(
        _OUTCOME % (o.job_id, o.attempt, o.state, o.outcome, "null" if o.error is None else encode(o.error),
                    float(o.delay), o.refund, "null" if o.result is None else o.result,
                    "null" if o.started_at is None else repr(float(o.started_at)),
                    "null" if o.finished_at is None else repr(float(o.finished_at)),
                    "null" if o.meta is None else o.meta)
        for o in outcomes
    ) + "]"


def is_asyncpg(conn: Any) -> bool:
    return type(conn).__module__.startswith("asyncpg")


def fetch(conn: Any, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
    """Run ``sql`` on a sync psycopg connection and return every row as a tuple."""
    raw = _unwrap(conn)
    if not isinstance(raw, psycopg.Connection):
        raise JoblaneError(
            f"expected a psycopg 3 Connection, got {type(conn).__name__}: "
            "use the *_async variant for asyncpg or psycopg AsyncConnection"
        )
    with psycopg.RawCursor(raw) as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []


async def fetch_async(conn: Any, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
    """Run ``sql`` on a psycopg AsyncConnection or an asyncpg connection."""
    raw = await _unwrap_async(conn)
    if isinstance(raw, psycopg.AsyncConnection):
        async with psycopg.AsyncRawCursor(raw) as cur:
            await cur.execute(sql, args)
            return await cur.fetchall() if cur.description is not None else []
    if is_asyncpg(raw) or hasattr(raw, "fetch"):
        return [tuple(r) for r in await raw.fetch(sql, *args)]
    if isinstance(raw, psycopg.Connection):
        raise JoblaneError("got a sync psycopg Connection in an *_async call: use the sync variant")
    raise JoblaneError(f"unsupported connection type {type(conn).__name__}")
