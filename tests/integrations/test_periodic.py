"""Periodic jobs: one job per tick across schedulers, the missed-tick policy, and two real worker processes."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import time

import asyncpg
import pytest

import joblane
from joblane.maintenance import Scheduler
from joblane.testing import drain
from joblane.worker import Worker

from ..conftest import table
from .examples import load_example

UTC = dt.timezone.utc


class Clock:
    def __init__(self, now: dt.datetime):
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def at(hh: int, mm: int, ss: float = 0.0) -> dt.datetime:
    return dt.datetime(2030, 5, 1, hh, mm, tzinfo=UTC) + dt.timedelta(seconds=ss)


def periodic_jobs(conn, app) -> list[tuple[str, str, str]]:
    return conn.execute(f"SELECT payload->>'tick', unique_key, state FROM {table(app, 'jobs')} ORDER BY id").fetchall()


@pytest.fixture
async def pg(app):
    conns = [await asyncpg.connect(app.dsn) for _ in range(2)]
    yield conns
    for c in conns:
        await c.close()


def test_bad_schedules_are_refused_with_one_line(app):
    with pytest.raises(joblane.JoblaneError, match="invalid cron expression '61 \\* \\* \\* \\*'"):
        app.periodic(cron="61 * * * *", kind="x")
    with pytest.raises(joblane.JoblaneError, match="payload must be a dict"):
        app.periodic(cron="* * * * *", kind="x", payload=[1])
    with pytest.raises(joblane.JoblaneError, match="unknown time zone"):
        app.periodic(cron="* * * * *", kind="x", timezone="Mars/Olympus")

    @app.periodic(cron="* * * * *", kind="report")
    def report(job):
        pass

    with pytest.raises(joblane.JoblaneError, match="registered twice"):
        app.periodic(cron="*/2 * * * *", kind="report")(report)
    app.periodic(cron="0 * * * *", kind="report", name="report_hourly", payload={"span": "hour"})(report)
    assert sorted(app.periodic_tasks) == ["report", "report_hourly"]
    assert app.tasks["report"].fn is report


async def test_each_tick_enqueues_once_even_after_its_job_finished(app, conn, pg):
    app.periodic(cron="*/5 * * * *", kind="sync_crm", payload={"full": False})(lambda job: None)
    clock = Clock(at(12, 3))
    first, second = Scheduler(app, clock=clock), Scheduler(app, clock=clock)

    assert await first.run_once(pg[0]) == []  # a new schedule does not backfill 12:00
    clock.now = at(12, 5, 0.01)
    [(name, tick, job_id)] = await first.run_once(pg[0])
    assert (name, tick) == ("sync_crm", at(12, 5))
    assert await second.run_once(pg[1]) == []  # another worker, same tick: nothing
    assert periodic_jobs(conn, app) == [("2030-05-01T12:05:00+00:00", "periodic:sync_crm:2030-05-01T12:05:00+00:00",
                                         "pending")]
    assert conn.execute(f"SELECT payload FROM {table(app, 'jobs')}").fetchone()[0] == {
        "full": False, "tick": "2030-05-01T12:05:00+00:00"}

    # the job finishes: its unique_key no longer guards the tick, the tick row does
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'done', finished_at = now()")
    assert await second.run_once(pg[1]) == []
    clock.now = at(12, 9, 59)
    assert await first.run_once(pg[0]) == []
    assert len(periodic_jobs(conn, app)) == 1


async def test_tick_rows_guard_without_the_lock(app, conn, pg):
    """Two rounds in concurrent transactions (no advisory lock): the second waits on the tick's key and adds nothing."""
    app.periodic(cron="* * * * *", kind="beat")(lambda job: None)
    clock = Clock(at(8, 0, 30))
    a, b = Scheduler(app, clock=clock), Scheduler(app, clock=clock)
    clock.now = at(8, 1, 0.5)
    tx = pg[0].transaction()
    await tx.start()
    assert [t for _, t, _ in await a._work(pg[0])] == [at(8, 1)]

    async def other():
        async with pg[1].transaction():
            return await b._work(pg[1])

    racing = asyncio.create_task(other())
    await asyncio.sleep(0.3)
    assert not racing.done(), "the second round waits for the first one's tick row"
    await tx.commit()
    assert await racing == []
    assert len(periodic_jobs(conn, app)) == 1


async def test_a_late_round_catches_up_every_tick_within_the_grace(app, conn, pg):
    app.periodic(cron="* * * * *", kind="beat")(lambda job: None)
    clock = Clock(at(9, 0, 30))
    s = Scheduler(app, clock=clock, misfire_grace=300)
    clock.now = at(9, 1, 0.1)
    assert len(await s.run_once(pg[0])) == 1
    clock.now = at(9, 4, 10)  # three rounds were skipped (a busy host, a slow database)
    assert [t for _, t, _ in await s.run_once(pg[0])] == [at(9, 2), at(9, 3), at(9, 4)]
    assert [r[0][11:16] for r in periodic_jobs(conn, app)] == ["09:01", "09:02", "09:03", "09:04"]


async def test_after_downtime_only_the_latest_missed_tick_runs(app, conn, pg):
    app.periodic(cron="*/5 * * * *", kind="sync_crm")(lambda job: None)
    clock = Clock(at(12, 4))
    before = Scheduler(app, clock=clock)
    clock.now = at(12, 5, 0.2)
    assert len(await before.run_once(pg[0])) == 1
    # every worker was down from 12:06 to 15:02:30; a new one starts
    clock.now = at(15, 2, 30)
    restarted = Scheduler(app, clock=clock, misfire_grace=60)
    assert [t for _, t, _ in await restarted.run_once(pg[0])] == [at(15, 0)]
    clock.now = at(15, 4)
    assert await restarted.run_once(pg[0]) == []
    clock.now = at(15, 5, 0.01)
    assert [t for _, t, _ in await restarted.run_once(pg[0])] == [at(15, 5)]
    assert [r[0][11:16] for r in periodic_jobs(conn, app)] == ["12:05", "15:00", "15:05"]


def test_cron_in_a_time_zone(app):
    app.periodic(cron="0 9 * * *", kind="digest", timezone="Europe/Paris")(lambda job: None)
    schedule = app.periodic_tasks["digest"]
    # 09:00 in Paris is 07:00 UTC in summer and 08:00 UTC in winter
    assert schedule.ticks(at(0, 0), at(23, 0)) == [at(7, 0)]
    winter = dt.datetime(2030, 1, 10, tzinfo=UTC)
    assert schedule.ticks(winter, winter + dt.timedelta(hours=23)) == [winter.replace(hour=8)]


async def test_the_worker_runs_its_scheduler(app, conn):
    ran = []

    @app.periodic(cron="* * * * * *", kind="every_second")
    async def every_second(job):
        ran.append(job.payload["tick"])

    worker = Worker(app, poll_interval=0.05, listen=True)
    runner = asyncio.create_task(worker.run(install_signals=False))
    deadline = time.monotonic() + 10
    while len(ran) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    worker.request_stop()
    await runner
    assert len(ran) >= 2 and len(set(ran)) == len(ran)


def test_the_docs_example_schedules():
    app = load_example("periodic_jobs.py").app
    assert sorted(app.periodic_tasks) == ["daily_digest", "heartbeat", "sync_crm"]
    assert app.tasks["daily_digest"].queue == "reports"
    assert app.periodic_tasks["sync_crm"].ticks(at(12, 0), at(12, 15)) == [at(12, 5), at(12, 10), at(12, 15)]
    assert app.periodic_tasks["heartbeat"].ticks(at(12, 0), at(12, 0, 30)) == [at(12, 0, 10), at(12, 0, 20),
                                                                              at(12, 0, 30)]
    # 2030-05-01 is a Wednesday: 09:00 in Paris is 07:00 UTC
    assert app.periodic_tasks["daily_digest"].ticks(at(0, 0), at(23, 0)) == [at(7, 0)]


DURATION = float(os.environ.get("JOBLANE_PERIODIC_TEST_SECONDS", "15"))


def test_two_worker_processes_enqueue_exactly_one_job_per_tick(app, conn, spawn_worker):
    """Two workers run the per-second schedule; each tick becomes exactly one job, none is skipped.

    The duration is JOBLANE_PERIODIC_TEST_SECONDS (default 15; the acceptance run uses 180).
    """
    app_spec = "tests.integrations.apps.periodic_app:app"
    workers = [spawn_worker(app_spec, app.schema, "--poll-interval", "0.2") for _ in range(2)]
    time.sleep(DURATION)
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(30) == 0, w.output()
        assert '"scheduler: 1 periodic schedules' in w.output()
    rows = conn.execute(
        f"SELECT payload->>'tick', unique_key, state FROM {table(app, 'jobs')} ORDER BY payload->>'tick'").fetchall()
    ticks = [dt.datetime.fromisoformat(r[0]) for r in rows]
    assert len(ticks) >= DURATION / 2, f"only {len(ticks)} ticks in {DURATION}s"
    assert len(set(ticks)) == len(ticks), "a tick was enqueued twice"
    assert all(key == f"periodic:tick:{tick}" for tick, key, _ in rows)
    gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b - a != dt.timedelta(seconds=1)]
    assert not gaps, f"ticks were skipped: {gaps}"
    recorded = conn.execute(f"SELECT count(*) FROM {table(app, 'periodic_ticks')}").fetchone()[0]
    assert recorded == len(ticks)
    assert {state for *_, state in rows} <= {"done", "pending"}
