"""The example's own table, ``leads``, next to joblane's tables, and the statements that touch it.

Every write here runs on a connection the caller holds, inside the caller's
transaction, so a step's write, the next step's job and the step's own
completion commit together. ``last_job_id`` points at the job that carries
the lead now (enrich, then classify, then deliver).
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

SCHEMA_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.leads (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text NOT NULL,
    email          text NOT NULL,
    company        text NOT NULL DEFAULT '',
    message        text NOT NULL,
    -- received -> enriched -> (review ->) classified -> qualified | not_qualified
    status         text NOT NULL DEFAULT 'received',
    enrichment     jsonb,
    classification jsonb,
    last_job_id    bigint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
)
"""

DIGESTS_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.digests (
    batch_id     bigint PRIMARY KEY,   -- the nightly re-classification batch it summarises
    summary      jsonb NOT NULL,
    approved_by  text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
)
"""

_STATEMENTS = {
    "insert": "INSERT INTO {schema}.leads (name, email, company, message) VALUES (%s, %s, %s, %s) RETURNING id",
    "get": "SELECT * FROM {schema}.leads WHERE id = %s",
    "set_job": "UPDATE {schema}.leads SET last_job_id = %s WHERE id = %s",
    "enriched": "UPDATE {schema}.leads SET status = 'enriched', enrichment = %s, last_job_id = %s, updated_at = now()"
                " WHERE id = %s",
    "review": "UPDATE {schema}.leads SET status = 'review', classification = %s, updated_at = now()"
              " WHERE id = %s AND status IN ('enriched', 'review')",
    "classified": "UPDATE {schema}.leads SET status = 'classified', classification = %s, last_job_id = %s,"
                  " updated_at = now() WHERE id = %s",
    # guarded: a lead is decided (and published) once, whatever re-runs its deliver job
    "decided": "UPDATE {schema}.leads SET status = %s, updated_at = now() WHERE id = %s AND status = 'classified'"
               " RETURNING id",
    "recent": "SELECT l.id, l.name, l.company, l.status, l.created_at, j.kind AS job_kind, j.state AS job_state"
              "  FROM {schema}.leads AS l LEFT JOIN {schema}.jobs AS j ON j.id = l.last_job_id"
              " ORDER BY l.id DESC LIMIT %s",
    "with_job": "SELECT l.*, j.kind AS job_kind, j.state AS job_state, j.attempts AS job_attempts,"
                "       j.last_error AS job_error"
                "  FROM {schema}.leads AS l LEFT JOIN {schema}.jobs AS j ON j.id = l.last_job_id"
                " WHERE l.id = %s",
    # the leads the demo's closing tour scores
    "enriched_ids": "SELECT id FROM {schema}.leads WHERE enrichment IS NOT NULL ORDER BY id LIMIT %s",
    "decided_ids": "SELECT id FROM {schema}.leads WHERE status IN ('qualified', 'not_qualified') ORDER BY id",
    # the answers of a finished nightly batch (joblane's jobs table: each reclassify job's result)
    "batch_results": "SELECT result FROM {schema}.jobs WHERE batch_id = %s AND state = 'done'",
    "digest": "INSERT INTO {schema}.digests (batch_id, summary, approved_by) VALUES (%s, %s, %s)"
              " ON CONFLICT (batch_id) DO NOTHING",
    "get_digest": "SELECT * FROM {schema}.digests WHERE batch_id = %s",
    "outcomes": "SELECT l.id, l.email, l.status, l.classification, j.kind AS job_kind, j.state AS job_state,"
                "       j.last_error AS job_error"
                "  FROM {schema}.leads AS l LEFT JOIN {schema}.jobs AS j ON j.id = l.last_job_id ORDER BY l.id",
}


@lru_cache(maxsize=None)
def statement(name: str, schema: str) -> sql.Composed:
    return sql.SQL(_STATEMENTS[name]).format(schema=sql.Identifier(schema))


def create_table(conn: Any, schema: str) -> None:
    """Create ``leads`` and ``digests`` in ``schema`` (a sync psycopg connection; safe to run twice)."""
    conn.execute(sql.SQL(SCHEMA_DDL).format(schema=sql.Identifier(schema)))
    conn.execute(sql.SQL(DIGESTS_DDL).format(schema=sql.Identifier(schema)))


async def one(conn: AsyncConnection, name: str, schema: str, *args: Any) -> dict | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(statement(name, schema), args)
    return await cur.fetchone() if cur.description else None


async def rows(conn: AsyncConnection, name: str, schema: str, *args: Any) -> list[dict]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(statement(name, schema), args)
    return await cur.fetchall()


def as_json(value: Any) -> Jsonb:
    return Jsonb(value)


_pools: dict[tuple[str, int], AsyncConnectionPool] = {}
_lock = asyncio.Lock()


async def pool(dsn: str, max_size: int = 8) -> AsyncConnectionPool:
    """One connection pool per process and event loop, opened on first use (workers have no start hook)."""
    key = (dsn, id(asyncio.get_running_loop()))
    found = _pools.get(key)
    if found is None:
        async with _lock:
            found = _pools.get(key)
            if found is None:
                found = AsyncConnectionPool(dsn, min_size=1, max_size=max_size, open=False)
                await found.open(wait=True, timeout=30)
                _pools[key] = found
    return found
