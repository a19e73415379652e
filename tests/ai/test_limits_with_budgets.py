"""Limits and budgets on one queue: what holds a job back is shown as what it is, an operator's cap outlives
worker restarts, and a lean try counts what it cost."""

from __future__ import annotations

import logging

import pytest

import joblane
from joblane import JobSpec

from ..review.helpers import cli_json, run_cli
from .helpers import dashboard, rows, running_worker, until


def _openai(app) -> None:
    app.limit("openai", per_minute=600, concurrency=1, tokens_per_minute=90_000, key="tenant", per_key=1)
    app.budget("openai-daily", queue="openai", per_day=0.3, key="tenant")


async def test_a_held_back_job_names_the_pause_the_limit_and_the_cap_that_hold_it(app, conn):
    _openai(app)

    @app.task("chat", queue="openai")
    async def chat(job: joblane.Job):
        job.record(cost=0.1)

    # a worker writes the declared limits and budgets; a 429 then pauses the queue for every worker
    async with running_worker(app):
        pass
    [held] = app.enqueue_many(conn, [JobSpec("chat", {"tenant": "acme", "estimated_cost": 0.1})])
    busy = app.enqueue(conn, "chat", {"tenant": "acme"})
    rows(conn, app, "UPDATE {jobs} SET state = 'running', worker = 'w', attempts = 1, started_at = now(),"
                    " lease_until = now() + interval '1 minute' WHERE id = %s RETURNING id", (busy,))
    rows(conn, app, "INSERT INTO {budget_usage} (budget, key, window_start, spent, tries)"
                    " VALUES ('openai-daily', 'acme', date_trunc('day', now(), 'UTC'), 0.3, 3) RETURNING key")
    app.pause_queue(conn, "openai", 60, "RetryAfter: 429 Too Many Requests")

    waiting = app.get_job(held)["waiting_on"]
    assert [(w["kind"], w.get("limit")) for w in waiting] == [
        ("pause", None), ("limit", "concurrency"), ("limit", "per_key"), ("budget", None)]
    assert waiting[0]["reason"] == "RetryAfter: 429 Too Many Requests"
    texts = [w["text"] for w in waiting]
    assert texts[0].startswith("queue paused until ") and texts[0].endswith(": RetryAfter: 429 Too Many Requests")
    assert texts[1] == "concurrency limit: 1 of 1 running"
    assert texts[2] == "per-key limit: tenant=acme has 1 of 1 running"
    assert texts[3].startswith("budget openai-daily: acme spent 0.3 of 0.3 (in flight 0; cap declared in code)")

    shown = " ".join(run_cli(app, "jobs", "show", str(held)).stdout.split())
    for text in ("queue paused until", "RetryAfter: 429 Too Many Requests", "concurrency limit: 1 of 1 running",
                 "budget openai-daily: acme spent 0.3 of 0.3"):
        assert text in shown, shown
    with dashboard(app) as web:
        page = web.get(f"/jobs/{held}").text
        assert "waiting on a pause" in page and "waiting on a limit" in page and "waiting on budget" in page
        metrics = web.get("/metrics").text
        assert 'joblane_queue_paused_seconds{queue="openai",reason="RetryAfter: 429 Too Many Requests"}' in metrics
        assert 'joblane_queue_limit_used{limit="concurrency",queue="openai"} 1.0' in metrics, metrics
        assert 'joblane_budget_waiting_jobs{budget="openai-daily",key="acme"} 1.0' in metrics, metrics
        queues = web.get("/queues").text
        assert "openai-daily: 0.3 per day per tenant" in queues and "(declared in code)" in queues

    # once the pause ends and the other job finishes, only the cap holds it
    app.resume_queue(conn, "openai")
    rows(conn, app, "UPDATE {jobs} SET state = 'done', worker = NULL, finished_at = now() WHERE id = %s"
                    " RETURNING id", (busy,))
    assert [w["kind"] for w in app.get_job(held)["waiting_on"]] == ["budget"]


async def test_a_cap_set_by_an_operator_outlives_worker_restarts_until_reset(app, conn, caplog):
    _openai(app)
    async with running_worker(app):
        pass
    assert cli_json(app, "budgets")[0]["cap_source"] == "code"
    assert run_cli(app, "budgets", "set", "openai-daily", "--cap", "50").exit_code == 0

    caplog.set_level(logging.WARNING, logger="joblane.worker")
    async with running_worker(app):  # the restart writes the declaration again: the operator's cap stands
        pass
    [row] = cli_json(app, "budgets")
    assert (row["cap"], row["cap_source"], row["declared_cap"]) == (50.0, "operator", 0.3)
    assert row["cap_set_at"] is not None
    said = [r.getMessage() for r in caplog.records if "openai-daily" in r.getMessage()]
    assert said and "the cap an operator set (50" in said[0] and "stands over the declared 0.3" in said[0], said
    assert "set by an operator (declared 0.3)" in " ".join(run_cli(app, "budgets").stdout.split())
    with dashboard(app) as web:
        assert "(set by an operator (declared 0.3))" in web.get("/queues").text
        assert 'joblane_budget_cap_set_by_operator{budget="openai-daily"} 1.0' in web.get("/metrics").text

    # a new declaration in code changes the default, not the operator's cap
    app.budget("openai-daily", queue="openai", per_day=0.4, key="tenant")
    async with running_worker(app):
        pass
    assert app.budget_status()[0]["cap"] == 50.0 and app.budget_status()[0]["declared_cap"] == 0.4

    result = run_cli(app, "budgets", "reset", "openai-daily")
    assert result.exit_code == 0 and "cap 0.4, as declared in code" in result.stdout, result.output
    async with running_worker(app):
        pass
    [row] = app.budget_status()
    assert (row["cap"], row["cap_source"]) == (0.4, "code")
    assert app.set_budget_cap("openai-daily", 2.0) and app.reset_budget_cap("openai-daily") == 0.4
    # a budget made from the command line alone has no declared cap to return to
    assert run_cli(app, "budgets", "set", "cli-only", "--cap", "1", "--queue", "q", "--per", "day").exit_code == 0
    assert app.reset_budget_cap("cli-only") is None


async def test_a_lean_try_counts_what_it_cost_against_the_cap_and_the_token_window(app, conn):
    app.limit("lean-q", tokens_per_minute=10_000, estimate="estimated_tokens")
    app.budget("lean-spend", queue="lean-q", per_day=100.0, key="tenant")

    @app.task("lean_call", queue="lean-q", lean=True)
    async def lean_call(job: joblane.Job):
        job.record(cost=job.payload["real_cost"])
        job.settle(job.payload["real_tokens"])

    app.enqueue_many(conn, [JobSpec("lean_call", {"tenant": "acme", "estimated_cost": 0.5, "real_cost": 0.2,
                                                  "estimated_tokens": 1000, "real_tokens": 300}) for _ in range(4)])
    async with running_worker(app):
        await until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs}")[0]["n"] == 0)
        # the next claim folds the finished tries' holds
        app.enqueue(conn, "lean_call", {"tenant": "other", "estimated_cost": 0.0, "real_cost": 0.0,
                                        "estimated_tokens": 0, "real_tokens": 0})
        await until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs}")[0]["n"] == 0)
    spend = {b["key"]: b["spent"] + b["in_flight"] for b in app.budget_status()}
    assert spend["acme"] == pytest.approx(4 * 0.2)  # at cost: at the estimates it would be 2.0
    starts = rows(conn, app, "SELECT cost FROM {queue_starts} WHERE queue = 'lean-q' ORDER BY started_at")
    assert [s["cost"] for s in starts][:4] == [300.0] * 4  # the tokens settled, not the 1000 estimated
    assert cli_json(app, "limits")[0]["cost"] == pytest.approx(1200.0)


def _claim(conn, app, n: int = 10) -> list[int]:
    """One claim of queue openai as a worker makes it: the queue's lock, the fold, the limited claim."""
    from joblane import store
    from joblane.migrations import lock_key

    with conn.transaction():
        store.fetch(conn, app.store.lock_queue_claims(lock_key(app.schema, "claim:openai")))
        store.fetch(conn, app.store.fold_budget_holds("openai"))
        claimed = store.fetch(conn, app.store.claim_jobs_limited("openai", n, "w", 30.0))
    return [r[0] for r in claimed if r[0] is not None]


def test_one_claim_takes_per_key_fairness_concurrency_and_the_caps_together(app, conn):
    from joblane import admin

    app.limit("openai", concurrency=3, key="tenant", per_key=2)
    app.budget("openai-daily", queue="openai", per_day=0.25, key="tenant")
    admin.save_limit(app, app.rate_limits["openai"])
    admin.save_budget(app, app.budgets["openai-daily"])
    a = app.enqueue_many(conn, [JobSpec("chat", {"tenant": "a", "estimated_cost": 0.1}, queue="openai")
                                for _ in range(4)])
    b = app.enqueue_many(conn, [JobSpec("chat", {"tenant": "b", "estimated_cost": 0.1}, queue="openai")
                                for _ in range(4)])
    rows(conn, app, "INSERT INTO {budget_usage} (budget, key, window_start, spent, tries)"
                    " VALUES ('openai-daily', 'a', date_trunc('day', now(), 'UTC'), 0.1, 1) RETURNING key")

    # at most 2 per key and 3 in all: a1 (a has spent 0.1), a2 (0.1 spent and 0.1 in flight: below 0.25),
    # then b1; a3 would be a's third running
    assert _claim(conn, app) == [a[0], a[1], b[0]]
    assert _claim(conn, app) == []  # three running: concurrency holds everything
    holds = rows(conn, app, "SELECT key, count(*) AS n, sum(estimate) AS estimate FROM {budget_holds} GROUP BY key"
                            " ORDER BY key")
    assert holds == [{"key": "a", "n": 2, "estimate": pytest.approx(0.2)}, {"key": "b", "n": 1, "estimate": 0.1}]

    # a1 finishes at a cost of 0.1: a has 0.1 + 0.1 settled and 0.1 in flight, at its cap of 0.25;
    # the slot a1 freed goes to b2, passing over a's jobs
    rows(conn, app, "UPDATE {jobs} SET state = 'done', worker = NULL, finished_at = now() WHERE id = %s"
                    " RETURNING id", (a[0],))
    rows(conn, app, "INSERT INTO {attempts} (job_id, attempt, worker, started_at, finished_at, outcome, meta)"
                    " VALUES (%s, 1, 'w', now(), now(), 'done', '{{\"cost\": 0.1}}') RETURNING job_id", (a[0],))
    assert _claim(conn, app) == [b[1]]
    waiting = app.get_job(a[2])["waiting_on"]
    assert [(w["kind"], w.get("limit")) for w in waiting] == [("limit", "concurrency"), ("budget", None)]
    assert waiting[1]["key"] == "a" and waiting[1]["spent"] == pytest.approx(0.2)
    assert waiting[1]["in_flight"] == pytest.approx(0.1)
