"""Queue limits enforced in the database: shared by worker processes, weighted, fair per key, pausable."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import joblane
from joblane import JobSpec
from joblane.testing import drain
from joblane.worker import Worker

from ..conftest import wait_until
from .helpers import cli_json, rows, run_cli, run_until

APP = "tests.review.app:app"


def _most_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` inside any half-open window [t, t + window)."""
    times = sorted(times)
    best = end = 0
    for i, start in enumerate(times):
        while end < len(times) and times[end] < start + window:
            end += 1
        best = max(best, end - i)
    return best


def _most_overlapping(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans], key=lambda e: (e[0], e[1]))
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_two_worker_processes_share_the_rate_concurrency_and_per_key_limits(app, conn, spawn_worker):
    app.enqueue_many(conn, [JobSpec("tick", {"i": i}, queue="rated") for i in range(150)])
    # tenant a's jobs come first: only the per-key cap keeps a third one of them from running
    app.enqueue_many(conn, [JobSpec("slot", {"tenant": "a" if i < 20 else "b", "seconds": 0.2}, queue="capped")
                            for i in range(30)])
    workers = [spawn_worker(APP, app.schema, "--concurrency", "6", "--poll-interval", "0.5") for _ in range(2)]

    def started(queue: str) -> int:
        return rows(conn, app, "SELECT count(*) AS n FROM {attempts} a JOIN {jobs} j ON j.id = a.job_id"
                    " WHERE j.queue = %s", (queue,))[0]["n"]

    # 5 starts a second: 50 starts take about ten seconds
    wait_until(lambda: started("rated") >= 50, timeout=40, message="50 rate-limited starts")
    wait_until(lambda: started("capped") >= 30, timeout=30, message="every capped job")
    for w in workers:
        w.stop()
        assert w.wait(30) == 0, w.output()

    rated = rows(conn, app, "SELECT extract(epoch FROM a.started_at)::float8 AS s, a.worker FROM {attempts} a"
                   " JOIN {jobs} j ON j.id = a.job_id WHERE j.queue = 'rated' AND a.outcome = 'done'")
    starts = [r["s"] for r in rated]
    # no window of one second holds more than 5 starts (0.1 s off the window for the
    # time between the claim, counted in the database, and the task's own start)
    assert _most_in_window(starts, 0.9) <= 5, sorted(starts)
    assert len(starts) >= 50 and (len(starts) - 1) / (max(starts) - min(starts)) < 6
    assert len({r["worker"] for r in rated}) == 2, "both workers took part"

    capped = rows(conn, app, "SELECT extract(epoch FROM a.started_at)::float8 AS s,"
                    " extract(epoch FROM a.finished_at)::float8 AS f, j.payload->>'tenant' AS tenant"
                    " FROM {attempts} a JOIN {jobs} j ON j.id = a.job_id WHERE j.queue = 'capped'")
    assert len(capped) == 30 and rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE queue = 'capped'"
                                      " AND state = 'done'") == [{"n": 30}]
    assert _most_overlapping([(c["s"], c["f"]) for c in capped]) <= 3
    for tenant in ("a", "b"):
        assert _most_overlapping([(c["s"], c["f"]) for c in capped if c["tenant"] == tenant]) <= 2


async def test_weighted_limit_reserves_the_estimate_and_frees_what_was_settled(app, conn):
    app.limit("llm", cost="100/1s")  # estimate read from payload field "estimated_tokens"

    @app.task("complete", queue="llm")
    async def complete(job: joblane.Job):
        await asyncio.sleep(0.01)
        job.settle(10)  # the call used far less than estimated

    app.enqueue_many(conn, [JobSpec("complete", {"estimated_tokens": 40, "i": i}) for i in range(14)])
    await drain(app, concurrency=4, timeout=30)
    starts = [r["s"] for r in rows(conn, app, "SELECT extract(epoch FROM started_at)::float8 AS s FROM {attempts}")]
    assert len(starts) == 14
    # a start needs settled (10 each) + unsettled estimates (40 each) + its 40 <= 100: at most 7 a second,
    # and never more than 2 if settled costs did not replace the estimates
    most = _most_in_window(starts, 0.9)
    assert 3 <= most <= 7, sorted(starts)
    meta = rows(conn, app, "SELECT DISTINCT meta->>'settled_cost' AS c FROM {attempts}")
    assert meta == [{"c": "10.0"}]

    # a job larger than the whole budget is not starved: it starts alone in an empty window
    big = app.enqueue(conn, "complete", {"estimated_tokens": 500})
    await drain(app, timeout=30)
    assert rows(conn, app, "SELECT state FROM {jobs} WHERE id = %s", (big,)) == [{"state": "done"}]


async def test_retry_after_with_pause_queue_stops_the_queue_and_spends_no_attempt(app, conn):
    tripped: list[float] = []

    @app.task("ask", queue="api")  # an unlimited queue
    async def ask(job: joblane.Job):
        if job.payload.get("trip") and not tripped:
            tripped.append(time.time())
            raise joblane.RetryAfter(1.0, "429 Too Many Requests", pause_queue=True)

    trip = app.enqueue(conn, "ask", {"trip": True}, priority=-1)
    others = [app.enqueue(conn, "ask", {"i": i}) for i in range(3)]
    await run_until(app, lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'done'")[0]["n"] == 4,
                    concurrency=1)
    [pause] = rows(conn, app, "SELECT queue, extract(epoch FROM until)::float8 AS until, reason FROM {queue_pauses}")
    assert pause["queue"] == "api" and pause["reason"] == "RetryAfter: 429 Too Many Requests"
    runs = rows(conn, app, "SELECT job_id, outcome, attempt, extract(epoch FROM started_at)::float8 AS s"
                  " FROM {attempts} WHERE outcome = 'done'")
    assert sorted(r["job_id"] for r in runs) == sorted([trip, *others])
    assert all(r["s"] >= pause["until"] - 0.05 for r in runs), (runs, pause)
    assert rows(conn, app, "SELECT attempts FROM {jobs} WHERE id = %s", (trip,)) == [{"attempts": 1}]


def test_a_pause_reaches_the_other_worker_process(app, conn, spawn_worker):
    workers = [spawn_worker(APP, app.schema, "--concurrency", "4", "--poll-interval", "0.2") for _ in range(2)]
    wait_until(lambda: conn.execute("SELECT count(DISTINCT application_name) FROM pg_stat_activity"
                                    " WHERE application_name = ANY(%s)",
                                    ([f"joblane worker {w.proc.pid}" for w in workers],)).fetchone()[0] == 2,
               timeout=30, message="both workers connected")
    wait_until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {queue_limits}")[0]["n"] == 4, timeout=10)
    trip = app.enqueue(conn, "model_call", {"trip_until": time.time() + 0.5, "pause": 2.0}, queue="models")
    wait_until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {attempts} WHERE outcome = 'snoozed'")[0]["n"],
               timeout=20, message="the 429")
    [pause] = rows(conn, app, "SELECT extract(epoch FROM until)::float8 AS until FROM {queue_pauses}")
    others = app.enqueue_many(conn, [JobSpec("model_call", {"i": i}, queue="models") for i in range(6)])
    wait_until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'done'")[0]["n"] == 7,
               timeout=30, message="every job after the pause")
    runs = rows(conn, app, "SELECT job_id, extract(epoch FROM started_at)::float8 AS s, worker FROM {attempts}"
                  " WHERE outcome = 'done'")
    assert sorted(r["job_id"] for r in runs) == sorted([trip, *others])
    assert all(r["s"] >= pause["until"] - 0.05 for r in runs), (runs, pause)
    for w in workers:
        w.stop()
        assert w.wait(30) == 0, w.output()


async def test_limits_command_line_and_pauses_set_by_hand(app, conn):
    result = run_cli(app, "limits", "set", "api", "--rate", "600/min", "--concurrency", "4",
                     "--cost", "90000/min", "--key", "tenant.id", "--per-key", "2")
    assert result.exit_code == 0, result.output
    assert "600 starts/min, 4 running, 90000 cost/min" in result.stdout
    [row] = rows(conn, app, "SELECT max_starts, starts_interval, concurrency, max_cost, cost_interval, cost_path,"
                 " key_path, per_key FROM {queue_limits}")
    assert row == {"max_starts": 600, "starts_interval": 60.0, "concurrency": 4, "max_cost": 90000.0,
                   "cost_interval": 60.0, "cost_path": ["estimated_tokens"], "key_path": ["tenant", "id"],
                   "per_key": 2}
    for args, message in [
        (["limits", "set", "api"], "no limit given for queue 'api'"),
        (["limits", "set", "api", "--rate", "fast"], "rate must look like 10/s"),
        (["limits", "set", "api", "--per-key", "2"], "needs both key"),
        (["limits", "set", "bad queue!", "--concurrency", "1"], "invalid queue name"),
        (["limits", "clear", "nothing"], "queue 'nothing' has no limits"),
        (["limits", "pause", "api", "--for", "soon"], "--for takes a duration"),
        (["limits", "resume", "api"], "queue 'api' is not paused"),
    ]:
        result = run_cli(app, *args)
        assert result.exit_code == 1 and message in result.stderr, (args, result.output)
        assert "\n" not in result.stderr.strip()
    with pytest.raises(joblane.JoblaneError, match="give one start rate"):
        app.limit("api", per_second=1, per_minute=5)

    assert run_cli(app, "limits", "pause", "api", "--for", "1s", "--reason", "provider outage").exit_code == 0
    [listed] = cli_json(app, "limits")
    assert listed["queue"] == "api" and listed["pause_reason"] == "provider outage" and listed["running"] == 0

    @app.task("ping", queue="api")
    async def ping(job):
        return None

    app.enqueue(conn, "ping", {"tenant": {"id": 1}})
    [pause] = rows(conn, app, "SELECT extract(epoch FROM until)::float8 AS until FROM {queue_pauses}")
    await drain(app, timeout=20)
    [run] = rows(conn, app, "SELECT extract(epoch FROM started_at)::float8 AS s FROM {attempts}")
    assert run["s"] >= pause["until"] - 0.05
    assert json.loads(run_cli(app, "limits", "--json").stdout)[0]["starts"] == 1
    assert run_cli(app, "limits", "clear", "api").exit_code == 0
    assert rows(conn, app, "SELECT count(*) AS n FROM {queue_starts}") == [{"n": 0}]


async def test_queues_without_limits_keep_the_plain_claim(app, conn):
    @app.task("plain")
    async def plain(job):
        return None

    app.enqueue_many(conn, [JobSpec("plain", {"i": i}) for i in range(20)])
    worker = Worker(app, listen=False, poll_interval=0.05)
    runner = asyncio.create_task(worker.run(install_signals=False))
    await worker.started.wait()
    assert worker.limiter.active is False
    await asyncio.sleep(0.3)
    worker.request_stop()
    assert (await runner)["done"] == 20
    assert rows(conn, app, "SELECT count(*) AS n FROM {queue_starts}") == [{"n": 0}]


async def test_a_pause_holds_the_plain_claim_of_every_worker_at_once(app, conn, joblane_dsn):
    """No refresh interval: the claim statement itself skips a paused queue, whoever runs it."""
    import asyncpg

    from joblane import store

    app.enqueue(conn, "k", {}, queue="plain")
    app.enqueue(conn, "k", {}, queue="other")
    app.pause_queue(conn, "plain", 60, "provider outage")
    c = await asyncpg.connect(joblane_dsn)
    try:
        claimed = await store.records(c, app.store.claim_jobs(["plain", "other"], 10, "w-1", 30.0))
        assert [r["queue"] for r in claimed] == ["other"]
        assert app.resume_queue(conn, "plain")
        claimed = await store.records(c, app.store.claim_jobs(["plain", "other"], 10, "w-2", 30.0))
        assert [r["queue"] for r in claimed] == ["plain"]
    finally:
        await c.close()
