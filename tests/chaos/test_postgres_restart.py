"""PostgreSQL restarts under the workers' and relays' feet: a clean restart, then a crash and recovery.

The server is one this test started (an embedded cluster in a temporary
directory), never the machine's shared one.
"""

from __future__ import annotations

import random
import time

import joblane
from joblane.queries import quote_ident
from joblane.testing import isolated_schema

from . import chaos_app
from .harness import (RELAY_ARGS, TALLY, WORKER_ARGS, Destination, Fleet, Ledger, check, check_outbox, connect,
                      enqueue, wait_outbox_sent, wait_quiet)
from .test_workers import assert_no_violations, mix


def finished(conn, schema: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {quote_ident(schema)}.jobs WHERE state <> 'pending'").fetchone()[0]


def test_workers_and_relays_ride_out_a_restart_and_a_crash_of_postgresql(own_postgres, tmp_path):
    dsn = own_postgres.dsn
    rng = random.Random(9)
    runs = tmp_path / "runs.log"
    destination = Destination(tmp_path / "destination.log")
    ledger = Ledger()
    with isolated_schema(dsn) as schema:
        app = joblane.App(dsn, schema=schema)
        app.tasks.update(chaos_app.app.tasks)
        enqueue(app, dsn, ledger, mix(3000, rng), messages=1000)
        workers = Fleet(schema, dsn, runs, tmp_path, WORKER_ARGS)
        relays = Fleet(schema, dsn, runs, tmp_path, RELAY_ARGS, env={"CHAOS_SINK": str(destination.path)},
                       command="relay")
        violations: list[str] = []
        try:
            conn = connect(dsn)
            workers.start(2)
            relays.start(1)
            workers.wait_ready(conn)
            relays.wait_ready(conn)
            for step, (mode, at) in enumerate((("fast", 900), ("immediate", 1900))):
                deadline = time.monotonic() + 120
                while finished(conn, schema) < at and time.monotonic() < deadline:
                    time.sleep(0.05)
                conn.close()
                own_postgres.restart(mode)
                TALLY.faults[f"postgres_restart_{mode}"] += 1
                conn = connect(dsn)
                # new work arrives while the workers and relays reconnect
                enqueue(app, dsn, ledger, mix(300, rng), messages=150)
                enqueue(app, dsn, ledger, mix(20, rng), messages=10, rollback=True)
                label = f"after restart {step + 1} ({mode})"
                violations += check(conn, schema, ledger, runs, final=False, label=label)
                violations += check_outbox(conn, schema, ledger, destination, final=False, label=label)
            if not wait_quiet(conn, schema, workers, timeout=150):
                violations.append("the queue did not drain after the restarts")
            if not wait_outbox_sent(conn, schema, relays):
                violations.append("the outbox did not drain after the restarts")
            codes = workers.sigterm_all(conn) + relays.sigterm_all(conn)
            assert all(c == 0 for c in codes), codes
            violations += check(conn, schema, ledger, runs, final=True, label="postgres restart, final")
            violations += check_outbox(conn, schema, ledger, destination, final=True, label="postgres restart, final")
            TALLY.jobs += len(ledger.committed)
            TALLY.messages += len(ledger.messages)
            assert_no_violations(violations, workers)
            assert len(workers.retired) == 2 and len(relays.retired) == 1, "the same processes carried on throughout"
            conn.close()
        finally:
            workers.close()
            relays.close()
