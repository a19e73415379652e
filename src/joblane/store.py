"""Run named queries on whatever connection the caller holds.

``enqueue``/``publish`` execute on the caller's own connection, inside the
caller's transaction, and never commit it. Three drivers are accepted: a
psycopg 3 ``Connection`` (sync), a psycopg ``AsyncConnection`` and an
asyncpg ``Connection``. The SQL uses ``$n`` placeholders, which asyncpg takes
natively and psycopg takes through its raw cursors, so each query is written
once for all of them.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg

from .errors import JoblaneError


def _unwrap(conn: Any) -> Any:
    """Find the DB-API connection under a SQLAlchemy session/connection or Django wrapper."""
    if isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        return conn
    # SQLAlchemy Session / AsyncSession / Connection: reach the driver connection
    # without starting a second transaction.
    get = getattr(conn, "connection", None)
    if get is not None and callable(get) and type(conn).__module__.startswith("sqlalchemy"):
        return _unwrap(get())
    driver = getattr(conn, "driver_connection", None)
    if driver is not None:
        return _unwrap(driver)
    dbapi = getattr(conn, "dbapi_connection", None)
    if dbapi is not None:
        return _unwrap(dbapi)
    # Django's connection wrapper: its psycopg connection is .connection once opened.
    if type(conn).__module__.startswith("django"):
        conn.ensure_connection()
        return _unwrap(conn.connection)
    return conn


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
    raw = _unwrap(conn)
    if isinstance(raw, psycopg.AsyncConnection):
        async with psycopg.AsyncRawCursor(raw) as cur:
            await cur.execute(sql, args)
            return await cur.fetchall() if cur.description is not None else []
    if is_asyncpg(raw) or hasattr(raw, "fetch"):
        return [tuple(r) for r in await raw.fetch(sql, *args)]
    if isinstance(raw, psycopg.Connection):
        raise JoblaneError("got a sync psycopg Connection in an *_async call: use the sync variant")
    raise JoblaneError(f"unsupported connection type {type(conn).__name__}")
