"""Numbered SQL migrations shipped in ``sql/migrations``, applied under an advisory lock."""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from psycopg import sql

from .errors import SchemaVersionError
from .queries import quote_ident

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str  # with the {schema} placeholder

    def render(self, schema: str) -> str:
        return self.sql.replace("{schema}", quote_ident(schema))


@functools.lru_cache(maxsize=None)
def all_migrations() -> tuple[Migration, ...]:
    folder = resources.files("joblane") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    found.sort(key=lambda mig: mig.version)
    for before, mig in zip(found, found[1:]):
        if mig.version == before.version:
            raise RuntimeError(f"two migrations are numbered {mig.version}: {before.name} and {mig.name}")
    return tuple(found)


def versions() -> list[int]:
    """The version of every migration shipped, in the order they apply."""
    return [mig.version for mig in all_migrations()]


def latest_version() -> int:
    return all_migrations()[-1].version


def lock_key(schema: str, purpose: str) -> int:
    """A stable signed 64-bit advisory lock key for (schema, purpose)."""
    digest = hashlib.blake2b(f"joblane:{schema}:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _version_sql(schema: str) -> tuple[str, str]:
    """The two probes of a schema's version: does its migrations table exist ($1), and its highest version."""
    table = sql.SQL("{}.migrations").format(sql.Identifier(schema)).as_string(None)
    return table, sql.SQL("SELECT coalesce(max(version), 0) FROM {}").format(sql.SQL(table)).as_string(None)


def _applied_version(conn, schema: str) -> int | None:
    """The schema's version, or None when joblane was never installed there (psycopg, sync)."""
    table, highest = _version_sql(schema)
    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]:
        return None
    return conn.execute(highest).fetchone()[0]


def migrate(conn, schema: str, *, target: int | None = None) -> list[int]:
    """Bring ``schema`` up to date on a psycopg (sync) connection; returns the versions applied.

    Runs in one transaction under an advisory lock, so concurrent runs wait
    for each other and the second finds nothing to do.
    """
    migrations = all_migrations()
    latest = migrations[-1].version
    target = latest if target is None else target
    ident = sql.Identifier(schema)
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema, "migrate"),))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(ident))
        current = _applied_version(conn, schema) or 0
        if current > latest:
            raise SchemaVersionError(
                f"schema {schema!r} is at version {current}, newer than this joblane knows ({latest}): "
                "upgrade joblane before running it against this database"
            )
        for mig in migrations:
            if current < mig.version <= target:
                conn.execute(mig.render(schema))
                conn.execute(sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(ident),
                             (mig.version, mig.name))
                applied.append(mig.version)
    return applied


def verify(schema: str, current: int | None) -> int:
    """Raise SchemaVersionError unless ``current`` is exactly this code's version; return it."""
    latest = latest_version()
    if current is None:
        raise SchemaVersionError(f"schema {schema!r} has no joblane tables: run `joblane migrate`")
    if current < latest:
        raise SchemaVersionError(
            f"schema {schema!r} is at version {current}, this joblane needs {latest}: run `joblane migrate`"
        )
    if current > latest:
        raise SchemaVersionError(
            f"schema {schema!r} is at version {current}, newer than this joblane knows ({latest}): upgrade joblane"
        )
    return current


def check(conn, schema: str) -> int:
    """Raise SchemaVersionError unless the schema is exactly at this code's version (psycopg, sync)."""
    return verify(schema, _applied_version(conn, schema))


async def check_async(conn, schema: str) -> int:
    """``check`` on an asyncpg connection (the worker and the relay at start)."""
    table, highest = _version_sql(schema)
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
        return verify(schema, None)
    return verify(schema, await conn.fetchval(highest))


def drop_schema(conn, schema: str) -> None:
    """Drop ``schema`` and everything in it (joblane.testing's isolated schemas)."""
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
