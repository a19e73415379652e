"""Checkpointed steps: finished steps are not run again when the job is retried."""

from __future__ import annotations

import joblane
from joblane.testing import drain

from .conftest import table


async def test_three_step_task_failing_at_step_three_runs_steps_one_and_two_once(app, conn):
    calls = {"extract": 0, "classify": 0, "summarise": 0}

    async def extract(text):
        calls["extract"] += 1
        return {"words": len(text.split())}

    def classify(words):  # a plain function works as a step too
        calls["classify"] += 1
        return "long" if words > 3 else "short"

    async def summarise(label):
        calls["summarise"] += 1
        if calls["summarise"] < 3:
            raise ConnectionError("model API timed out")
        return f"a {label} text"

    @app.task("pipeline", max_attempts=5, backoff=0)
    async def pipeline(job: joblane.Job):
        facts = await job.step("extract", extract, job.payload["text"])
        label = await job.step("classify", classify, facts["words"])
        return {"summary": await job.step("summarise", summarise, label), "facts": facts}

    job_id = app.enqueue(conn, "pipeline", {"text": "one two three four five"})
    await drain(app)
    assert calls == {"extract": 1, "classify": 1, "summarise": 3}
    state, attempts, result = conn.execute(
        f"SELECT state, attempts, result FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)).fetchone()
    assert (state, attempts) == ("done", 3)
    assert result == {"summary": "a long text", "facts": {"words": 5}}
    reused = conn.execute(f"SELECT attempt, meta->'steps_reused' FROM {table(app, 'attempts')} WHERE job_id = %s"
                          " ORDER BY id", (job_id,)).fetchall()
    assert reused == [(1, None), (2, ["extract", "classify"]), (3, ["extract", "classify"])]
    steps = conn.execute(f"SELECT name, attempt, result FROM {table(app, 'job_steps')} WHERE job_id = %s ORDER BY name",
                         (job_id,)).fetchall()
    assert steps == [("classify", 1, "long"), ("extract", 1, {"words": 5}), ("summarise", 3, "a long text")]


async def test_steps_in_a_plain_task_and_bad_step_results(app, conn):
    runs = []

    @app.task("sync_steps", max_attempts=2, backoff=0)
    def sync_steps(job: joblane.Job):
        first = job.step_sync("first", lambda: runs.append("first") or 41)
        if job.attempt == 1:
            raise RuntimeError("fail once after the first step")
        return first + 1

    @app.task("bad_step", max_attempts=1)
    async def bad_step(job: joblane.Job):
        await job.step("weird", lambda: object())

    a = app.enqueue(conn, "sync_steps", {})
    b = app.enqueue(conn, "bad_step", {})
    await drain(app)
    rows = dict(conn.execute(f"SELECT id, (state, result::text, last_error) FROM {table(app, 'jobs')}").fetchall())
    assert rows[a][:2] == ("done", "42") and runs == ["first"]
    assert rows[b][0] == "failed" and "not JSON-serialisable" in rows[b][2]


def test_step_outside_a_worker_says_so():
    job = joblane.Job(id=1, kind="k", queue="q", payload={}, attempt=1, max_attempts=1)
    try:
        job.step_sync("x", lambda: 1)
    except RuntimeError as exc:
        assert "needs a worker" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("step_sync ran without a worker")
