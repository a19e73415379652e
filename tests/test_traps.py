"""Traps a PostgreSQL queue can fall into (PGMQ's, among others), kept closed.

- A completion never waits on another worker's claim or poll transaction.
- The claim stays an index scan as the backlog grows (tests/test_schema.py:
  ``test_the_claim_stays_an_index_scan_with_a_million_jobs_waiting``).
- The wake-up costs bulk enqueue nothing: one notification per queue per
  statement (tests/test_enqueue_many.py, the last two tests), and workload b
  with notifications on and off in ``joblane bench -w b``.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import psycopg

from joblane import store

from .conftest import table


async def test_a_completion_never_waits_on_another_workers_claim_or_poll(app, joblane_dsn, conn, monkeypatch):
    """4 workers, jobs trickling in: every completion is written at once.

    PostgreSQL itself is asked, every few milliseconds, whether a
    ``complete_jobs`` statement is waiting on a lock, and how long the
    running ones have been running; the worker's own timing of each
    completion write backs it up. A completion stuck behind another
    worker's claim or poll transaction would wait for that transaction
    (here up to the 2 s poll interval). The bounds are generous for a
    loaded 2-core machine; the message shows the real figures (a few ms).
    """
    from joblane.worker import Worker

    @app.task("tick")
    async def tick(job):
        await asyncio.sleep(0.002)

    durations: list[float] = []
    real = store.records

    async def timed(c, stmt):
        if stmt.name != "complete_jobs":
            return await real(c, stmt)
        started = time.perf_counter()
        try:
            return await real(c, stmt)
        finally:
            durations.append(time.perf_counter() - started)

    monkeypatch.setattr(store, "records", timed)

    # PostgreSQL's view of the completion statements while they run
    lock_waits: list[tuple] = []
    longest = [0.0]
    stop = threading.Event()

    def watch() -> None:
        with psycopg.connect(joblane_dsn, autocommit=True) as c:
            while not stop.is_set():
                for wait_type, wait_event, running in c.execute(
                        "SELECT wait_event_type, wait_event, extract(epoch FROM clock_timestamp() - query_start)"
                        "  FROM pg_stat_activity"
                        " WHERE state = 'active' AND datname = current_database() AND left(query, 300) = left(%s, 300)",
                        (app.queries.complete_jobs,)).fetchall():
                    longest[0] = max(longest[0], float(running))
                    if wait_type == "Lock":
                        lock_waits.append((wait_event, float(running)))
                time.sleep(0.003)

    jobs = 300
    watcher = threading.Thread(target=watch, daemon=True)
    workers = [Worker(app, concurrency=4, poll_interval=2.0) for _ in range(4)]
    runners = [asyncio.create_task(w.run(install_signals=False)) for w in workers]
    try:
        for w in workers:
            await asyncio.wait_for(w.started.wait(), 30)
        watcher.start()

        def trickle() -> None:  # low traffic: one job every 10 ms, each waking the idle workers
            with psycopg.connect(joblane_dsn, autocommit=True) as c:
                for i in range(jobs):
                    app.enqueue(c, "tick", {"i": i})
                    time.sleep(0.01)

        await asyncio.to_thread(trickle)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE state = 'done'").fetchone()[0]
            if done == jobs:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        for w in workers:
            w.request_stop()
        await asyncio.gather(*runners, return_exceptions=True)
        watcher.join(5)

    assert done == jobs
    claimed_by = conn.execute(f"SELECT count(DISTINCT worker) FROM {table(app, 'attempts')}").fetchone()[0]
    assert claimed_by >= 2, "the workers did not share the work: nothing to collide"
    durations.sort()
    shown = (f"{len(durations)} completion writes: median {statistics.median(durations) * 1000:.1f} ms,"
             f" p99 {durations[int(len(durations) * 0.99)] * 1000:.1f} ms, max {durations[-1] * 1000:.1f} ms;"
             f" longest seen running by PostgreSQL {longest[0] * 1000:.1f} ms")
    assert not lock_waits, f"completions waited on locks: {lock_waits[:5]} ({shown})"
    assert durations[-1] < 0.5, shown  # the target is 100 ms; a wait behind a poll would be ~2 s
    assert longest[0] < 0.5, shown
