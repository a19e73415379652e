"""Several claims in flight per worker, and lean tasks: real worker processes, exactly once, nothing stuck."""

from __future__ import annotations

import signal
import statistics
import time

from joblane import JobSpec

from .conftest import count, table, wait_until
from .helpers import create_runs_table

APP = "tests.apps.runs:app"


def unfinished(conn, app) -> int:
    return count(conn, app, "state IN ('pending', 'running')")


def test_three_claims_in_flight_run_waves_of_jobs_exactly_once(app, conn, spawn_worker):
    """Claims of 5 into 40 places with 3 claim loops per worker: waves with idle gaps between them
    make claims come back short, full and empty in turn; every job runs once and none is left."""
    create_runs_table(conn, app.schema)
    workers = [spawn_worker(APP, app.schema, "--concurrency", "20", "--claim-batch", "5", "--claimers", "3",
                            "--poll-interval", "0.5") for _ in range(2)]
    ids: list[int] = []
    for wave in range(6):
        ids += app.enqueue_many(conn, [JobSpec("record", {"wave": wave, "i": i}) for i in range(250)])
        time.sleep(0.4 if wave % 2 else 0.05)
    wait_until(lambda: unfinished(conn, app) == 0, timeout=90, message="all jobs finished")
    runs = conn.execute(f"SELECT job_id, count(*) FROM {table(app, 'runs')} GROUP BY job_id").fetchall()
    assert sorted(r[0] for r in runs) == sorted(ids), "every job ran"
    assert max(r[1] for r in runs) == 1, "no job ran twice"
    assert count(conn, app, "state = 'done'") == len(ids)
    # a worker that has gone idle still takes a late job (the first claim loop polls and listens)
    late = app.enqueue(conn, "record", {"late": True})
    wait_until(lambda: count(conn, app, f"id = {late} AND state = 'done'") == 1, timeout=10, message="late job done")
    for w in workers:
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()


def test_lean_task_leaves_no_row_for_a_success_and_keeps_failures(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    ok = app.enqueue_many(conn, [JobSpec("record_lean", {"i": i}) for i in range(300)])
    retried = app.enqueue(conn, "record_lean", {"fail_first": True}, max_attempts=3)
    failed = app.enqueue(conn, "record_lean", {"fail": True}, max_attempts=1)
    worker = spawn_worker(APP, app.schema, "--concurrency", "20")
    wait_until(lambda: unfinished(conn, app) == 0 and count(conn, app, f"id = {retried}") == 0, timeout=60,
               message="lean jobs finished")
    runs = dict(conn.execute(f"SELECT job_id, count(*) FROM {table(app, 'runs')} GROUP BY job_id").fetchall())
    assert all(runs.get(i) == 1 for i in ok), "every lean job ran once"
    assert runs[retried] == 2
    # successes are gone, with the attempts row of the retried job's failed first try
    assert count(conn, app, f"id = ANY(ARRAY{ok + [retried]})") == 0
    attempts = conn.execute(f"SELECT job_id, outcome FROM {table(app, 'attempts')} ORDER BY id").fetchall()
    assert attempts == [(failed, "failed")], "only the failure keeps its attempts row"
    assert conn.execute(f"SELECT state FROM {table(app, 'jobs')} WHERE id = %s", (failed,)).fetchone() == ("failed",)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def leased(conn, app) -> int:
    return count(conn, app, "state = 'running'")


def held_while_jobs_wait(conn, app) -> list[int]:
    """The jobs leased, sampled while some still wait to be claimed (a finished job stays leased for the
    few milliseconds until its outcome is written, so single samples may be above the steady count)."""
    held = []
    while count(conn, app, "state = 'pending'"):
        held.append(leased(conn, app))
        time.sleep(0.02)
    return held


def test_prefetch_follows_how_fast_tasks_finish(app, conn, spawn_worker):
    """Slow tasks: once the first ones end, a worker leases one job beyond its slots, not as many as it runs;
    fast tasks: its claims grow past twice its concurrency, up to four times. Every job runs once."""
    create_runs_table(conn, app.schema)
    slow = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 0.4, "i": i}) for i in range(24)])
    worker = spawn_worker(APP, app.schema, "--concurrency", "3")
    wait_until(lambda: count(conn, app, "state = 'done'") >= 3, timeout=30, message="the first slow jobs done")
    time.sleep(0.2)
    held = held_while_jobs_wait(conn, app)
    assert statistics.median(held) <= 4, f"jobs leased by a worker of 3 slots whose tasks take 0.4 s: {held}"
    fast = app.enqueue_many(conn, [JobSpec("record", {"i": i}) for i in range(3000)])
    wait_until(lambda: unfinished(conn, app) == 0, timeout=120, message="the fast jobs done")
    # the jobs of one claim share its transaction's now(): started_at groups them by claim
    sizes = [r[0] for r in conn.execute(
        f"SELECT count(*) FROM {table(app, 'jobs')} WHERE id = ANY(%s) GROUP BY started_at", (fast,))]
    assert 6 < max(sizes) <= 12, f"claims of fast tasks: largest {max(sizes)}"
    runs = conn.execute(f"SELECT job_id, count(*) FROM {table(app, 'runs')} GROUP BY job_id").fetchall()
    assert sorted(r[0] for r in runs) == sorted(slow + fast) and max(r[1] for r in runs) == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def test_fixed_prefetch_holds_as_many_jobs_as_asked(app, conn, spawn_worker):
    """--prefetch 0 leases no job beyond the running slots; --prefetch 5 keeps five more leased while
    slow tasks run; SIGTERM lets the running ones finish and gives the prefetched back, attempts unspent."""
    create_runs_table(conn, app.schema)
    app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 0.3, "i": i}) for i in range(12)])
    worker = spawn_worker(APP, app.schema, "--concurrency", "2", "--prefetch", "0")
    wait_until(lambda: leased(conn, app) > 0, timeout=30, message="the first claim")
    held = held_while_jobs_wait(conn, app)
    assert statistics.median(held) <= 2, f"jobs leased with --prefetch 0 and 2 slots: {held}"
    wait_until(lambda: unfinished(conn, app) == 0, timeout=30, message="the jobs done")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 3, "i": i}) for i in range(12)])
    worker = spawn_worker(APP, app.schema, "--concurrency", "2", "--prefetch", "5")
    wait_until(lambda: leased(conn, app) == 7, timeout=30, message="2 running and 5 prefetched")
    time.sleep(0.5)
    assert leased(conn, app) == 7
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    # the two running finish within the grace period; the five prefetched go back with the five never claimed
    assert count(conn, app, "state = 'done' AND payload->>'seconds' = '3'") == 2
    assert count(conn, app, "state = 'pending' AND attempts = 0") == 10, "the prefetched jobs, attempts unspent"


async def test_claims_resume_when_the_outcome_backlog_clears(app, conn):
    """The completer backlogged while the last claimed jobs finish: no job is left to free a place, so the
    claim loop must look again when the outcomes are written, not at the next poll (30 s here)."""
    import asyncio

    from joblane.worker import Worker

    ran = 0

    @app.task("quick")
    async def quick(job):
        nonlocal ran
        ran += 1

    ids = app.enqueue_many(conn, [JobSpec("quick", {"i": i}) for i in range(3000)])
    worker = Worker(app, concurrency=50, claim_batch=50, poll_interval=30.0, listen=False)
    worker.completer.batcher.max_pending = 40  # backlogged after less than one claim's outcomes
    write = worker.completer.write

    async def slow_write(batch):  # outcomes are written well after their jobs finished
        await asyncio.sleep(0.02)
        return await write(batch)

    worker.completer.batcher._flush = slow_write
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        for _ in range(300):
            if await asyncio.to_thread(unfinished, conn, app) == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await runner
    assert count(conn, app, "state = 'done'") == len(ids), "claims stopped with jobs left"
    assert ran == len(ids)
