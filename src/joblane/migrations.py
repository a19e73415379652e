"""Numbered SQL migrations shipped in ``sql/migrations``, applied under an advisory lock."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

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


def all_migrations() -> list[Migration]:
    folder = resources.files("joblane") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    found.sort(key=lambda mig: mig.version)
    for i, mig in enumerate(found, start=1):
        if mig.version != i:
            raise RuntimeError(f"migrations are not numbered 1..n: found {mig.version} at position {i}")
    return found


def latest_version() -> int:
    return len(all_migrations())


def lock_key(schema: str, purpose: str) -> int:
    """A stable signed 64-bit advisory lock key for (schema, purpose)."""
    digest = hashlib.blake2b(f"joblane:{schema}:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _applied_version(conn, schema: str) -> int | None:
    """The schema's version, or None when joblane was never installed there (psycopg, sync)."""
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{quote_ident(schema)}.migrations",)
    ).fetchone()[0]
    if not exists:
        return None
    row = conn.execute(f"SELECT max(version) FROM {quote_ident(schema)}.migrations").fetchone()
    return row[0] or 0


def migrate(conn, schema: str, *, target: int | None = None) -> list[int]:
    """Bring ``schema`` up to date on a psycopg (sync) connection; returns the versions applied.

    Runs in one transaction under an advisory lock, so concurrent runs wait
    for each other and the second finds nothing to do.
    """
    migrations = all_migrations()
    latest = len(migrations)
    target = latest if target is None else target
    quoted = quote_ident(schema)
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema, "migrate"),))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted}.migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = _applied_version(conn, schema) or 0
        if current > latest:
            raise SchemaVersionError(
                f"schema {schema!r} is at version {current}, newer than this joblane knows ({latest}): "
                "upgrade joblane before running it against this database"
            )
        for mig in migrations:
            if current < mig.version <= target:
                conn.execute(mig.render(schema))
                conn.execute(
                    f"INSERT INTO {quoted}.migrations (version, name) VALUES (%s, %s)", (mig.version, mig.name)
                )
                applied.append(mig.version)
    return applied


def check(conn, schema: str) -> int:
    """Raise SchemaVersionError unless the schema is exactly at this code's version."""
    latest = latest_version()
    current = _applied_version(conn, schema)
    if current is None or current < latest:
        raise SchemaVersionError(
            f"schema {schema!r} is at version {current or 0}, this joblane needs {latest}: run `joblane migrate`"
        )
    if current > latest:
        raise SchemaVersionError(
            f"schema {schema!r} is at version {current}, newer than this joblane knows ({latest}): upgrade joblane"
        )
    return current
