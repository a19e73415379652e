"""Real relay processes deliver 5,000 outbox rows while they are SIGKILLed and cut off from PostgreSQL.

Delivery is at least once: a relay killed after sending and before
recording re-sends with the same idempotency key. The invariants
(harness.check_outbox): every committed row arrives with its payload and
ends sent; no rolled-back row ever arrives; a row arrives more than once
only if its attempts show a re-send.
"""

from __future__ import annotations

import random
import time

import pytest

from joblane.queries import quote_ident

from .harness import RELAY_ARGS, TALLY, Destination, Fleet, Ledger, check_outbox, enqueue, wait_outbox_sent


def relay_fleet(schema: str, dsn: str, tmp_path, destination: Destination) -> Fleet:
    return Fleet(schema, dsn, tmp_path / "runs.log", tmp_path, RELAY_ARGS,
                 env={"CHAOS_SINK": str(destination.path)}, command="relay")


def test_relays_deliver_every_committed_row_through_sigkills_and_dropped_connections(app, conn, joblane_dsn,
                                                                                      tmp_path):
    rng = random.Random(11)
    ledger = Ledger()
    destination = Destination(tmp_path / "destination.log")
    enqueue(app, joblane_dsn, ledger, [], messages=1000)
    fleet = relay_fleet(app.schema, joblane_dsn, tmp_path, destination)
    violations: list[str] = []
    try:
        fleet.start(2)
        fleet.wait_ready(conn)
        for round_no in range(10):
            enqueue(app, joblane_dsn, ledger, [], messages=400)
            enqueue(app, joblane_dsn, ledger, [], messages=20, rollback=True)  # must never arrive
            time.sleep(rng.uniform(0.2, 0.5))
            if round_no % 3 == 2:
                fleet.terminate_connections(conn)
            elif round_no == 4:
                code = fleet.sigterm(conn)  # graceful: its batches in flight are delivered and recorded
                if code != 0:
                    violations.append(f"a relay stopped with SIGTERM exited {code}")
            else:
                fleet.sigkill()
            violations += check_outbox(conn, app.schema, ledger, destination, final=False,
                                       label=f"after relay fault {round_no + 1}")
        if not wait_outbox_sent(conn, app.schema, fleet):
            violations.append("the outbox did not drain after the faults stopped")
        codes = fleet.sigterm_all(conn)
        assert codes and all(c == 0 for c in codes), codes
        violations += check_outbox(conn, app.schema, ledger, destination, final=True, label="relays, final")
        if violations:
            logs = "\n".join(p.output()[-1500:] for p in (fleet.workers + fleet.retired)[-2:])
            pytest.fail(f"{len(violations)} invariant violations:\n" + "\n".join(violations[:15]) + "\n" + logs)
        TALLY.messages += len(ledger.messages)
        assert len(ledger.messages) >= 5000
        s = quote_ident(app.schema)
        retried = conn.execute(f"SELECT count(*) FROM {s}.outbox WHERE attempts > 1").fetchone()[0]
        assert retried > 0, "the destination turned some away, and they were retried"
    finally:
        fleet.close()
