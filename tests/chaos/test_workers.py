"""Real worker (and relay) processes under load while faults land on a schedule; invariants checked after each.

Sized for two shared cores: 10,000 jobs and 5,000 outbox rows in the
SIGKILL storm, a few hundred jobs in the others, leases of two seconds so
that a dead process's work comes back quickly.
"""

from __future__ import annotations

import random
import time

import pytest

from joblane.queries import quote_ident

from . import chaos_app
from ..conftest import wait_until
from ..deploy.pgbouncer import pgbouncer
from .harness import (RELAY_ARGS, TALLY, WORKER_ARGS, Destination, Fleet, Ledger, check, check_outbox, check_spans, enqueue,
                      wait_outbox_sent, wait_quiet)



@pytest.fixture
def app(app):
    """The test's App enqueues with the chaos app's task settings (queue, max_attempts)."""
    app.tasks.update(chaos_app.app.tasks)
    return app


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
def fleet_factory(app, joblane_dsn, tmp_path):
    fleets: list[Fleet] = []

    def make(args=WORKER_ARGS, *, command: str = "worker", env: dict | None = None, dsn: str | None = None) -> Fleet:
        fleet = Fleet(app.schema, dsn or joblane_dsn, tmp_path / "runs.log", tmp_path, list(args), env=env,
                      command=command)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


def mix(n: int, rng: random.Random) -> list[tuple[str, dict]]:
    """Mostly quick successes, with the other endings sprinkled in."""
    out = []
    for i in range(n):
        roll = rng.random()
        kind = "ok" if roll < 0.94 else "flaky" if roll < 0.97 else "bad" if roll < 0.985 else "review"
        out.append((kind, {"n": i}))
    return out


def assert_no_violations(violations: list[str], fleet: Fleet) -> None:
    if violations:
        logs = "\n".join(w.output()[-1500:] for w in (fleet.workers + fleet.retired)[-2:])
        pytest.fail(f"{len(violations)} invariant violations:\n" + "\n".join(violations[:15]) + "\n" + logs)


@pytest.fixture
def bouncer(joblane_dsn):
    """PgBouncer in transaction pooling in front of the suite's database, for one of the storm's workers."""
    with pgbouncer(joblane_dsn, pool_mode="transaction", pool_size=4) as dsn:
        yield dsn


def _registered(conn, schema: str, proc) -> bool:
    """The process registered itself (through PgBouncer its connections carry no application name to wait on)."""
    return bool(conn.execute(f"SELECT 1 FROM {quote_ident(schema)}.processes WHERE pid = %s", (proc.pid,)).fetchone())


def test_sigkill_and_dropped_connections_while_10000_jobs_and_5000_messages_flow(app, conn, joblane_dsn, ledger,
                                                                                 fleet_factory, tmp_path, bouncer):
    """Jobs and outbox rows are written together, as an application does; workers and relays are killed.

    One more worker goes through PgBouncer in transaction pooling (``--pgbouncer``) and is SIGKILLed too.
    """
    rng = random.Random(6)
    runs = tmp_path / "runs.log"
    destination = Destination(tmp_path / "destination.log")
    enqueue(app, joblane_dsn, ledger, mix(2000, rng), messages=1000)
    workers = fleet_factory()
    relays = fleet_factory(RELAY_ARGS, command="relay", env={"CHAOS_SINK": str(destination.path)})
    bounced = fleet_factory([*WORKER_ARGS, "--pgbouncer"], dsn=bouncer)
    workers.start(3)
    relays.start(2)
    bounced.start(1)
    violations: list[str] = []
    graceful: list[int] = []
    schedule = [
        lambda: workers.sigkill(), lambda: relays.sigkill(), lambda: workers.terminate_connections(conn),
        lambda: workers.sigkill(), lambda: relays.terminate_connections(conn),
        lambda: graceful.append(workers.sigterm(conn)),  # mid-burst: finish or give back, exit 0
        lambda: bounced.sigkill(),
    ]
    for round_no in range(12):
        # work arrives faster than three workers finish it, so each fault lands on busy processes
        enqueue(app, joblane_dsn, ledger, mix(670, rng), messages=335)
        enqueue(app, joblane_dsn, ledger, mix(30, rng), messages=15, rollback=True)  # must never run or arrive
        time.sleep(rng.uniform(0.3, 0.7))
        schedule[round_no % len(schedule)]()  # a fresh process takes a killed one's place
        label = f"after fault {round_no + 1}"
        violations += check(conn, app.schema, ledger, runs, final=False, label=label)
        violations += check_outbox(conn, app.schema, ledger, destination, final=False, label=label)
    # a kill right after a terminate, aimed at a worker that is running jobs right now
    enqueue(app, joblane_dsn, ledger, [("slow", {"seconds": 2.0}) for _ in range(30)])
    busy = wait_until(lambda: conn.execute(
        f"SELECT worker FROM {quote_ident(app.schema)}.jobs WHERE state = 'running' AND kind = 'slow' LIMIT 1"
    ).fetchone(), timeout=60, message="a worker running the slow jobs")
    pid = int(busy[0].split(":")[1])  # worker names are host:pid:suffix
    victim = next((w for w in workers.workers if w.proc.pid == pid), None)
    workers.terminate_connections(conn)
    workers.sigkill(victim)
    if not wait_quiet(conn, app.schema, workers, timeout=150):
        violations.append("the queue did not drain after the faults stopped")
    if not wait_outbox_sent(conn, app.schema, relays):
        violations.append("the outbox did not drain after the faults stopped")
    for proc in bounced.workers:
        wait_until(lambda: _registered(conn, app.schema, proc), timeout=60, message="the PgBouncer worker up")
    codes = graceful + workers.sigterm_all(conn) + relays.sigterm_all(conn) + bounced.sigterm_all()
    assert codes and all(c == 0 for c in codes), codes
    violations += check(conn, app.schema, ledger, runs, final=True, label="storm, final")
    violations += check_outbox(conn, app.schema, ledger, destination, final=True, label="storm, final")
    TALLY.jobs += len(ledger.committed)
    TALLY.messages += len(ledger.messages)
    assert_no_violations(violations, workers)
    through = {int(w.split(":")[1]) for (w,) in conn.execute(
        f"SELECT DISTINCT worker FROM {quote_ident(app.schema)}.attempts WHERE worker LIKE '%:%:%'")}
    assert through & {w.pid for w in bounced.workers + bounced.retired}, "the PgBouncer worker ran jobs"
    lost = conn.execute(f"SELECT count(*) FROM {quote_ident(app.schema)}.attempts WHERE outcome = 'lost'").fetchone()[0]
    assert lost > 0, "the SIGKILLs hit running jobs, which came back through the rescuer"
    # the ring of ready entries turned and its slots were emptied while the faults landed, so the
    # invariants above held through TRUNCATEs under load
    cleared = conn.execute(f"SELECT count(*) FROM {quote_ident(app.schema)}.ready_turns"
                           " WHERE cleared_at IS NOT NULL").fetchone()[0]
    assert cleared >= 3, f"the ring's slots were emptied {cleared} times during the storm"
    assert len(ledger.committed) >= 10_000 and len(ledger.messages) >= 5_000


def test_tasks_that_hang_raise_or_exit_the_process(app, conn, joblane_dsn, ledger, fleet_factory, tmp_path):
    rng = random.Random(7)
    runs = tmp_path / "runs.log"
    work = (mix(500, rng) + [("hang", {})] * 8 + [("flaky", {})] * 30 + [("bad", {})] * 10 + [("exit", {})] * 3
            + [("plain_hang", {})] * 6 + [("plain", {"seconds": 0.05})] * 40 + [("child", {"seconds": 0.05})] * 12)
    rng.shuffle(work)
    enqueue(app, joblane_dsn, ledger, work)
    fleet = fleet_factory()
    fleet.start(2)
    violations: list[str] = []
    exits = 0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        replaced = fleet.replace_dead()  # a task's os._exit took its worker down
        exits += replaced
        if replaced:
            violations += check(conn, app.schema, ledger, runs, final=False, label="after a task exited its worker")
        if wait_quiet(conn, app.schema, None, timeout=0.5):
            break
    else:
        violations.append("the queue did not drain")
    TALLY.faults["os_exit_in_task"] += exits
    TALLY.faults["task_timeout"] += conn.execute(
        f"SELECT count(*) FROM {quote_ident(app.schema)}.attempts WHERE error LIKE '%%timed out%%'").fetchone()[0]
    TALLY.faults["task_raised"] += conn.execute(
        f"SELECT count(*) FROM {quote_ident(app.schema)}.attempts WHERE outcome IN ('retry', 'failed', 'held')"
        " AND error NOT LIKE '%%timed out%%'").fetchone()[0]
    codes = fleet.sigterm_all(conn)
    assert all(c == 0 for c in codes), codes
    violations += check(conn, app.schema, ledger, runs, final=True, label="task faults, final")
    violations += check_spans(runs, label="task faults, spans", killed=exits > 0)
    TALLY.jobs += len(ledger.committed)
    assert_no_violations(violations, fleet)
    # each exit job took its worker down (check() finds a lost try on each); two that ran in one worker
    # took it down together
    assert exits >= 1, "the exit jobs took their workers down"


def test_sigterm_during_a_burst_gives_back_and_nothing_is_lost(app, conn, joblane_dsn, ledger, fleet_factory, tmp_path):
    rng = random.Random(8)
    runs = tmp_path / "runs.log"
    fleet = fleet_factory(["--concurrency", "10", "--lease", "2", "--poll-interval", "0.2", "--grace", "1"])
    fleet.start(2)
    fleet.wait_ready(conn)
    violations: list[str] = []
    burst = [("slow", {"seconds": rng.choice([0.05, 0.2])}) for _ in range(200)] + mix(600, rng)
    rng.shuffle(burst)
    burst = [("plain", {"seconds": rng.choice([0.05, 0.2])}) for _ in range(60)] + burst
    burst += [("child", {"seconds": 0.05}) for _ in range(20)]
    rng.shuffle(burst)
    # claimed first: still running when SIGTERM lands, so each is told to stop after the grace
    burst = [("slow", {"seconds": 2.0})] * 12 + [("plain", {"seconds": 2.0})] * 8 + [("child", {"seconds": 2.0})] * 4 + burst
    enqueue(app, joblane_dsn, ledger, burst)
    s = quote_ident(app.schema)
    deadline = time.monotonic() + 60
    while conn.execute(f"SELECT count(*) FROM {s}.jobs WHERE state = 'running'").fetchone()[0] < 10:
        assert time.monotonic() < deadline, "the burst never got going"
        time.sleep(0.05)
    codes = fleet.sigterm_all(conn, timeout=30)
    TALLY.faults["sigterm_worker"] += len(codes)
    assert codes and all(c == 0 for c in codes), codes
    assert conn.execute(f"SELECT count(*) FROM {s}.jobs WHERE state = 'running'").fetchone()[0] == 0, \
        "a graceful stop leaves nothing running"
    given_back = conn.execute(f"SELECT count(*) FROM {s}.attempts WHERE outcome = 'snoozed'").fetchone()[0]
    violations += check(conn, app.schema, ledger, runs, final=False, label="after SIGTERM")
    fleet.start(2)
    if not wait_quiet(conn, app.schema, fleet, timeout=120):
        violations.append("the queue did not drain after the restart")
    codes = fleet.sigterm_all(conn)
    assert all(c == 0 for c in codes), codes
    violations += check(conn, app.schema, ledger, runs, final=True, label="sigterm burst, final")
    violations += check_spans(runs, label="sigterm burst, spans")
    TALLY.jobs += len(ledger.committed)
    assert_no_violations(violations, fleet)
    assert given_back > 0, "the 2-second tasks outlived the 1-second grace and were given back"
