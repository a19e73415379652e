from __future__ import annotations

import socket

from joblane.queries import quote_ident

RUNS_DDL = "CREATE TABLE {schema}.runs (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"


def create_runs_table(conn, schema: str) -> None:
    conn.execute(RUNS_DDL.replace("{schema}", quote_ident(schema)))


def run_sql(conn, sql: str, args=()) -> list[tuple]:
    """Run SQL with $n placeholders (a named query's text, EXPLAIN of one) through the store's runner."""
    from joblane import store

    return store.fetch(conn, store.Statement("test", sql, tuple(args)))


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
