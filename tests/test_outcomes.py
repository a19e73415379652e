"""Each way a task can end lands the job in the state DESIGN.md gives, with an attempts row."""

from __future__ import annotations

import asyncio
import time

import joblane
from joblane.testing import drain

from .conftest import table


def attempts_of(conn, app, job_id):
    return conn.execute(
        f"SELECT attempt, outcome, error, meta FROM {table(app, 'attempts')} WHERE job_id = %s ORDER BY id", (job_id,)
    ).fetchall()


def job_row(conn, app, job_id):
    return conn.execute(
        f"SELECT state, attempts, last_error, result, run_after > now(), lease_until, worker, finished_at IS NOT NULL"
        f" FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)
    ).fetchone()


async def test_success_stores_result_and_metadata(app, conn):
    @app.task("classify")
    async def classify(job: joblane.Job):
        job.record(model="small-1", prompt_version="v3", tokens_in=120, tokens_out=8)
        return {"label": "hot", "echo": job.payload["n"], "attempt": job.attempt}

    @app.task("plain")
    def plain(job):  # a plain function runs in a thread
        return [job.payload["n"] * 2]

    a = app.enqueue(conn, "classify", {"n": 4})
    b = app.enqueue(conn, "plain", {"n": 21})
    stats = await drain(app)
    assert stats["done"] == 2
    state, attempts, last_error, result, _, lease, worker, finished = job_row(conn, app, a)
    assert (state, attempts, last_error, lease, worker, finished) == ("done", 1, None, None, None, True)
    assert result == {"label": "hot", "echo": 4, "attempt": 1}
    assert job_row(conn, app, b)[3] == [42]
    [(n, outcome, error, meta)] = attempts_of(conn, app, a)
    assert (n, outcome, error) == (1, "done", None)
    assert meta == {"model": "small-1", "prompt_version": "v3", "tokens_in": 120, "tokens_out": 8}


async def test_transient_errors_back_off_then_fail_when_the_budget_is_spent(app, conn):
    calls = []

    @app.task("flaky", max_attempts=3, backoff=lambda attempt: 0.0)
    async def flaky(job):
        calls.append(job.attempt)
        raise ConnectionError(f"upstream down on try {job.attempt}")

    job_id = app.enqueue(conn, "flaky", {})
    await drain(app)
    assert calls == [1, 2, 3]
    state, attempts, last_error, *_ = job_row(conn, app, job_id)
    assert (state, attempts) == ("failed", 3)
    assert last_error == "gave up after 3 attempts: ConnectionError: upstream down on try 3"
    rows = attempts_of(conn, app, job_id)
    assert [(r[0], r[1]) for r in rows] == [(1, "retry"), (2, "retry"), (3, "failed")]
    assert "Traceback" in rows[0][3]["traceback"]


async def test_backoff_pushes_run_after_out(app, conn):
    @app.task("slow_retry", backoff=lambda attempt: 3600.0)
    async def slow_retry(job):
        raise ValueError("try later")

    job_id = app.enqueue(conn, "slow_retry", {})
    await drain(app)
    state, attempts, last_error, _, in_future, *_ = job_row(conn, app, job_id)
    assert (state, attempts, last_error, in_future) == ("pending", 1, "ValueError: try later", True)
    delay = conn.execute(f"SELECT extract(epoch FROM run_after - now()) FROM {table(app, 'jobs')} WHERE id = %s",
                         (job_id,)).fetchone()[0]
    assert 3500 < delay <= 3600


def test_default_backoff_grows_with_jitter():
    from joblane.app import exponential_backoff

    backoff = exponential_backoff(base=1.0, cap=60.0, jitter=0.25)
    for attempt, centre in ((1, 1), (2, 2), (5, 16), (10, 60)):
        samples = [backoff(attempt) for _ in range(200)]
        assert centre * 0.75 <= min(samples) and max(samples) <= centre * 1.25
        assert len({round(s, 6) for s in samples}) > 100  # jittered


async def test_retry_after_does_not_spend_the_budget(app, conn):
    seen = []

    @app.task("rate_limited", max_attempts=1)
    async def rate_limited(job):
        seen.append(job.attempt)
        if len(seen) < 4:
            raise joblane.RetryAfter(0, "429 from the model API")
        return "ok"

    job_id = app.enqueue(conn, "rate_limited", {})
    await drain(app)
    # max_attempts=1, yet three 429s did not fail it: each try was refunded
    assert seen == [1, 1, 1, 1]
    assert job_row(conn, app, job_id)[:2] == ("done", 1)
    assert [r[1] for r in attempts_of(conn, app, job_id)] == ["snoozed", "snoozed", "snoozed", "done"]


async def test_retry_after_sets_run_after(app, conn):
    @app.task("later")
    async def later(job):
        raise joblane.RetryAfter(120)

    job_id = app.enqueue(conn, "later", {})
    await drain(app)
    delay = conn.execute(f"SELECT state, attempts, extract(epoch FROM run_after - now()) FROM {table(app, 'jobs')}"
                         " WHERE id = %s", (job_id,)).fetchone()
    assert delay[0] == "pending" and delay[1] == 0 and 110 < delay[2] <= 120


async def test_permanent_error_fails_at_once(app, conn):
    @app.task("bad", max_attempts=10)
    async def bad(job):
        raise joblane.PermanentError("lead has no email")

    job_id = app.enqueue(conn, "bad", {})
    await drain(app)
    assert job_row(conn, app, job_id)[:3] == ("failed", 1, "PermanentError: lead has no email")
    assert [r[1] for r in attempts_of(conn, app, job_id)] == ["failed"]


async def test_hold_waits_for_a_person(app, conn):
    @app.task("review")
    async def review(job):
        raise joblane.Hold("confidence 0.41 below 0.6", {"label": "maybe"})

    job_id = app.enqueue(conn, "review", {})
    await drain(app)
    state, attempts, last_error, result, *_ = job_row(conn, app, job_id)
    assert (state, attempts, last_error, result) == ("held", 1, "Hold: confidence 0.41 below 0.6", {"label": "maybe"})
    [(_, outcome, _, meta)] = attempts_of(conn, app, job_id)
    assert outcome == "held" and meta == {"hold_data": {"label": "maybe"}}


async def test_timeout_is_a_transient_failure(app, conn):
    @app.task("hangs", timeout=0.2, max_attempts=2, backoff=0)
    async def hangs(job):
        await asyncio.sleep(30)

    @app.task("hangs_sync", timeout=0.2, max_attempts=1)
    def hangs_sync(job):
        time.sleep(1)

    a = app.enqueue(conn, "hangs", {})
    b = app.enqueue(conn, "hangs_sync", {})
    started = time.monotonic()
    await drain(app)
    assert time.monotonic() - started < 10
    assert job_row(conn, app, a)[:3] == ("failed", 2, "gave up after 2 attempts: TimeoutError: task 'hangs' timed out after 0.2s")
    assert [r[1] for r in attempts_of(conn, app, a)] == ["retry", "failed"]
    assert job_row(conn, app, b)[0] == "failed"


async def test_unknown_kind_fails_clearly_once_no_live_worker_has_known_it_for_long_enough(app, conn):
    job_id = app.enqueue(conn, "nobody_handles_this", {}, queue="default")
    await drain(app, unknown_kind_timeout=0)
    state, attempts, last_error, *_ = job_row(conn, app, job_id)
    assert state == "failed" and attempts == 1
    assert "unknown task kind 'nobody_handles_this'" in last_error and "imported by the worker" in last_error


async def test_a_young_job_of_an_unknown_kind_waits_without_spending_attempts(app, conn, caplog):
    @app.task("known")
    async def known(job):
        return None

    app.declare("nobody_handles_this")  # enqueued by a newer producer; no worker here runs it
    job_id = app.enqueue(conn, "nobody_handles_this", {}, queue="default")
    app.enqueue(conn, "known", {}, queue="default")
    with caplog.at_level("WARNING", logger="joblane.worker"):
        await drain(app, unknown_kind_timeout=600)
    state, attempts, last_error, *_ = job_row(conn, app, job_id)
    assert (state, attempts) == ("pending", 0), "given back, its attempt not spent"
    assert "no live worker knows task kind 'nobody_handles_this'" in last_error
    assert app.get_job(job_id)["last_error"] == last_error  # what `joblane jobs show` prints
    said = [r for r in caplog.records if "does not know task kind 'nobody_handles_this'" in r.getMessage()]
    assert len(said) == 1


async def test_unserialisable_result_fails_the_job(app, conn):
    @app.task("weird")
    async def weird(job):
        return {"x": object()}

    job_id = app.enqueue(conn, "weird", {})
    await drain(app)
    assert job_row(conn, app, job_id)[0] == "failed"
    assert "not JSON-serialisable" in job_row(conn, app, job_id)[2]


async def test_priority_then_age_order(app, conn):
    order = []

    @app.task("ordered")
    async def ordered(job):
        order.append(job.payload["name"])

    for name, priority in (("low-1", 5), ("high-1", -1), ("mid", 0), ("high-2", -1), ("low-2", 5)):
        app.enqueue(conn, "ordered", {"name": name}, priority=priority)
    app.enqueue(conn, "ordered", {"name": "future"}, priority=-10, delay=3600)
    await drain(app, concurrency=1)
    assert order == ["high-1", "high-2", "mid", "low-1", "low-2"]


async def test_worker_serves_only_its_queues(app, conn):
    ran = []

    @app.task("a", queue="alpha")
    async def a(job):
        ran.append("a")

    @app.task("b", queue="beta")
    async def b(job):
        ran.append("b")

    app.enqueue(conn, "a", {})
    app.enqueue(conn, "b", {})
    await drain(app, queues=["beta"])
    assert ran == ["b"]
    await drain(app)  # default: every queue the app's tasks live in
    assert sorted(ran) == ["a", "b"]


async def test_many_jobs_none_twice(app, conn):
    seen = []

    @app.task("count")
    async def count_task(job):
        seen.append(job.id)
        await asyncio.sleep(0)

    ids = app.enqueue_many(conn, [("count", {"i": i}) for i in range(3000)])
    await drain(app, concurrency=50)
    assert sorted(seen) == sorted(ids)
    n_attempts = conn.execute(f"SELECT count(*), count(DISTINCT job_id) FROM {table(app, 'attempts')}").fetchone()
    assert n_attempts == (3000, 3000)
