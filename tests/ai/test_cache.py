"""Cached steps: an identical call made once for every job, the hit on the attempts row, stats and clearing."""

from __future__ import annotations

import pytest

import joblane
from joblane import JobSpec, admin

from ..conftest import wait_until
from ..review.helpers import cli_json, run_cli
from .helpers import rows, running_worker, until

APP = "tests.ai.app:app"


def test_two_racing_jobs_in_two_worker_processes_make_one_call(app, conn, spawn_worker, tmp_path):
    calls = tmp_path / "calls.txt"
    calls.touch()
    env = {"MODEL_CALLS": str(calls)}
    # one queue each, so the two racing jobs surely run in two processes at once
    workers = [spawn_worker(APP, app.schema, "--queue", queue, "--poll-interval", "0.1", env=env)
               for queue in ("cached", "cached_b")]
    wait_until(lambda: len(admin.processes(app)) == 2, timeout=30, message="both workers started")
    # two jobs with the same text: each worker takes one, the call takes 0.5 s
    first = app.enqueue_many(conn, [JobSpec("classify", {"text": "we want to buy 40 seats"}, queue="cached"),
                                    JobSpec("classify", {"text": "we want to buy 40 seats"}, queue="cached_b"),
                                    JobSpec("classify", {"text": "just browsing"}, queue="cached")])
    wait_until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'done'")[0]["n"] == 3,
               timeout=30, message="the racing jobs")
    assert sorted(calls.read_text().splitlines()) == ["just browsing", "we want to buy 40 seats"]
    one, two = rows(conn, app, "SELECT worker, started_at, finished_at FROM {attempts} WHERE job_id = ANY(%s)",
                    (first[:2],))
    assert one["worker"] != two["worker"]
    assert one["started_at"] < two["finished_at"] and two["started_at"] < one["finished_at"], "they raced"

    # a later job with the same call is a hit too
    later = app.enqueue(conn, "classify", {"text": "we want to buy 40 seats", "seconds": 0}, queue="cached")
    wait_until(lambda: app.get_job(later)["state"] == "done", timeout=30, message="the later job")
    for w in workers:
        w.stop()
        assert w.wait(30) == 0, w.output()
    assert len(calls.read_text().splitlines()) == 2

    tries = {r["job_id"]: r for r in rows(conn, app, "SELECT job_id, meta FROM {attempts}")}
    hits = [tries[j]["meta"]["cache"][0] for j in (*first[:2], later)]
    assert sorted(h["hit"] for h in hits) == [False, True, True]
    for hit in (h for h in hits if h["hit"]):
        assert hit["step"] == "classify" and hit["tokens_saved"] == 120 and hit["cost_saved"] == 0.002
        assert hit["from_job"] in first[:2]
    # the job that hit recorded no cost of its own: it made no call
    assert sum("cost" in tries[j]["meta"] for j in (*first[:2], later)) == 1
    results = {r["id"]: r["result"] for r in rows(conn, app, "SELECT id, result FROM {jobs}")}
    assert results[first[0]] == results[first[1]] == results[later] == {"label": "hot"}

    [stats] = [s for s in cli_json(app, "cache", "stats") if s["step"] == "classify"]
    assert stats["entries"] == 2 and stats["hits"] == 2
    assert stats["tokens_saved"] == 240 and stats["cost_saved"] == pytest.approx(0.004)


async def test_a_failed_call_frees_its_key_and_the_ttl_and_clear_end_a_result(app, conn):
    calls: list[str] = []

    @app.task("summarise", queue="s")
    async def summarise(job: joblane.Job):
        job.record(model="m1", prompt_version=job.payload.get("prompt", "v1"))

        async def call(text: str) -> str:
            calls.append(text)
            if job.payload.get("fail") and job.attempt == 1:
                raise RuntimeError("provider timeout")
            job.record(cost=0.01)
            return text.upper()

        return await job.step("summarise", call, job.payload["text"], cache=True, ttl=job.payload.get("ttl", "1h"))

    a = app.enqueue(conn, "summarise", {"text": "hello", "fail": True})
    async with running_worker(app):
        await until(lambda: app.get_job(a)["state"] == "done")
        assert calls == ["hello", "hello"]  # the failed try released its claim; the retry made the call
        b = app.enqueue(conn, "summarise", {"text": "hello"})
        c = app.enqueue(conn, "summarise", {"text": "hello", "prompt": "v2"})  # another prompt: another key
        await until(lambda: app.get_job(b)["state"] == "done" and app.get_job(c)["state"] == "done")
        assert calls == ["hello", "hello", "hello"]
        assert app.get_job(b)["attempt_rows"][0]["meta"]["cache"][0]["hit"] is True

        assert cli_json(app, "cache", "clear", "--older-than", "1h") == {"cleared": 0}
        assert cli_json(app, "cache", "clear") == {"cleared": 2}
        d = app.enqueue(conn, "summarise", {"text": "hello"})
        await until(lambda: app.get_job(d)["state"] == "done")
        assert len(calls) == 4
    for args, message in [
        (["cache", "clear", "--older-than", "soon"], "--older-than"),
    ]:
        result = run_cli(app, *args)
        assert result.exit_code != 0 and message in result.stderr, result.output
    with pytest.raises(joblane.JoblaneError, match="cache_key"):
        from joblane.steps import cache_key
        cache_key("s", (object(),), {}, {})


async def test_a_later_try_of_the_same_job_takes_over_its_own_claim(app, conn, joblane_dsn):
    """A worker lost mid-call leaves a claim; the job's next try need not wait for it to run out."""
    import asyncpg

    from joblane import store

    c = await asyncpg.connect(joblane_dsn)
    try:
        claim = app.store.cache_claim("k:1", "k", 7, 1, 120.0)
        assert await store.records(c, claim)
        assert not await store.records(c, app.store.cache_claim("k:1", "k", 8, 1, 120.0))  # another job waits
        assert await store.records(c, app.store.cache_claim("k:1", "k", 7, 2, 120.0))  # the same job's next try
    finally:
        await c.close()
