from __future__ import annotations

import re
import socket

from joblane.queries import quote_ident

RUNS_DDL = "CREATE TABLE {schema}.runs (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"


def create_runs_table(conn, schema: str) -> None:
    conn.execute(RUNS_DDL.replace("{schema}", quote_ident(schema)))


def run_sql(conn, sql: str, args=()) -> list[tuple]:
    """Run SQL with $n placeholders (a named query's text, EXPLAIN of one) through the store's runner."""
    from joblane import store

    return store.fetch(conn, store.Statement("test", sql, tuple(args)))


def plan_buffers(lines: list[str]) -> int:
    """Shared buffers (hit and read) of the first node with a "Buffers:" line in EXPLAIN (ANALYZE, BUFFERS)."""
    line = next(line for line in lines if "Buffers:" in line)
    return sum(int(part.split("=")[1]) for part in line.split(":", 1)[1].replace(",", " ").split()
               if part.startswith(("hit=", "read=")))


def index_names(conn, schema: str, index: str) -> set[str]:
    """``index`` and, when it is the index of a partitioned table (attempts), the indexes of its partitions."""
    rows = conn.execute("SELECT c.relname FROM pg_partition_tree(%s::regclass) AS t JOIN pg_class AS c ON c.oid = t.relid",
                        (f"{quote_ident(schema)}.{index}",)).fetchall()
    return {index, *(r[0] for r in rows)}


def uses_index(plan: str, conn, schema: str, index: str) -> bool:
    """Whether an EXPLAIN text reads ``index`` (or, on a partitioned table, the index of a partition)."""
    return any(re.search(rf"\b{re.escape(name)}\b", plan) for name in index_names(conn, schema, index))


def seq_scanned(plan: str, conn, schema: str, table: str) -> list[str]:
    """What of ``table`` an EXPLAIN text reads whole: the table, or those of its partitions that may hold
    rows (an empty one, by its statistics, costs nothing to read whole, and the planner says so)."""
    rows = conn.execute("SELECT c.relname, c.reltuples FROM pg_partition_tree(%s::regclass) AS t"
                        " JOIN pg_class AS c ON c.oid = t.relid WHERE t.isleaf",
                        (f"{quote_ident(schema)}.{table}",)).fetchall()
    names = [name for name, tuples in rows if tuples != 0] if rows else [table]
    return [name for name in names if re.search(rf"Seq Scan on {re.escape(name)}\b", plan)]


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
