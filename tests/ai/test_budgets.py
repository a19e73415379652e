"""Spend caps enforced by the database: shared by worker processes, resumed when the window rolls or the cap rises."""

from __future__ import annotations

import asyncio
import json

import pytest

import joblane
from joblane import store
from joblane import JobSpec

from ..conftest import wait_until
from ..review.helpers import cli_json, run_cli
from .helpers import dashboard, rows, running_worker, until

APP = "tests.ai.app:app"


def test_two_worker_processes_never_pass_a_cap_by_more_than_the_estimates_in_flight(app, conn, spawn_worker):
    # cap 0.5 per tenant per 2 s window (tests/ai/app.py). Tenant a costs what it estimates;
    # tenant b overruns every estimate by half.
    app.enqueue_many(conn, [JobSpec("metered_call", {"tenant": "a", "estimated_cost": 0.1, "real_cost": 0.1},
                                    queue="metered") for _ in range(12)]
                     + [JobSpec("metered_call", {"tenant": "b", "estimated_cost": 0.1, "real_cost": 0.15},
                                queue="metered") for _ in range(8)])
    workers = [spawn_worker(APP, app.schema, "--concurrency", "4", "--poll-interval", "0.2") for _ in range(2)]
    wait_until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'done'")[0]["n"] == 20,
               timeout=40, message="every metered job")
    for w in workers:
        w.stop()
        assert w.wait(30) == 0, w.output()

    # the ledger against the tries themselves: every try is counted once, at what it cost
    # (the last tries' holds are folded by the next claim; do it here)
    store.fetch(conn, app.store.fold_budget_holds("metered"))
    spent = rows(conn, app, "SELECT key, window_start, spent, tries FROM {budget_usage} ORDER BY window_start")
    assert rows(conn, app, "SELECT count(*) AS n FROM {budget_holds}") == [{"n": 0}]
    for tenant, cost in (("a", 0.1), ("b", 0.15)):
        mine = [r for r in spent if r["key"] == tenant]
        assert sum(r["tries"] for r in mine) == (12 if tenant == "a" else 8)
        assert sum(r["spent"] for r in mine) == pytest.approx((12 if tenant == "a" else 8) * cost)
        # more windows than one: the jobs held back ran once their window rolled
        assert len(mine) >= (3 if tenant == "a" else 2), mine
        for window in mine:
            # a job starts only while spend + in-flight estimates < 0.5: one estimate past the cap at most,
            # plus what the tries in flight cost beyond their estimates (0.05 each, 8 slots)
            assert window["spent"] <= 0.5 + 0.1 + (0 if tenant == "a" else 8 * 0.05) + 1e-9, window
            if tenant == "a":
                assert window["tries"] <= 5, window
    workers_seen = rows(conn, app, "SELECT count(DISTINCT worker) AS n FROM {attempts}")[0]["n"]
    assert workers_seen == 2


async def test_a_key_at_its_cap_waits_with_the_reason_shown_until_the_cap_is_raised(app, conn):
    app.budget("llm", queue="paid", per_day=0.3, key="tenant")

    @app.task("answer", queue="paid")
    async def answer(job: joblane.Job):
        job.record(cost=0.1)

    ids = app.enqueue_many(conn, [JobSpec("answer", {"tenant": "acme", "estimated_cost": 0.1}) for _ in range(5)])
    other = app.enqueue(conn, "answer", {"tenant": "globex", "estimated_cost": 0.1})

    def done() -> int:
        return rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'done'")[0]["n"]

    def held_back_and_shown(waiting: list[int]) -> None:
        [reason] = app.get_job(waiting[0])["waiting_on"]
        assert reason["budget"] == "llm" and reason["key"] == "acme" and reason["spent"] == pytest.approx(0.3)
        shown = run_cli(app, "jobs", "show", str(waiting[0]))
        assert "waiting on" in shown.stdout and "budget llm: acme spent 0.3 of 0.3" in shown.stdout, shown.stdout

        listed = {r["key"]: r for r in cli_json(app, "budgets")}
        assert listed["acme"]["at_cap"] and listed["acme"]["waiting"] == 2 and listed["acme"]["spent"] == pytest.approx(0.3)
        assert not listed["globex"]["at_cap"] and listed["globex"]["waiting"] == 0
        assert "at cap" in run_cli(app, "budgets").stdout
        status = " ".join(run_cli(app, "status").stdout.replace("│", " ").split())
        assert "paid 2 (2 at a cap) 0 4" in status, status  # pending, running, done
        [pending] = [r for r in cli_json(app, "status") if r["queue"] == "paid" and r["state"] == "pending"]
        assert (pending["jobs"], pending["at_cap"]) == (2, 2)
        assert "budget llm: tenant=acme has spent 0.3 of 0.3; 2 pending jobs of queue paid wait until" in status
        with dashboard(app) as web:
            assert "waiting on budget" in web.get(f"/jobs/{waiting[0]}").text
            overview = web.get("/").text
            assert "Budget <strong>llm</strong>: tenant=acme has spent 0.3 of 0.3; 2 of its jobs wait" in overview
            metrics = web.get("/metrics").text
            assert 'joblane_budget_waiting_jobs{budget="llm",key="acme"} 2.0' in metrics, metrics
            assert 'joblane_budget_cap{budget="llm"} 0.3' in metrics

    # one worker throughout: a worker writes the budgets its app declares when it starts. It runs in this
    # event loop, so the command line and the dashboard run in a thread: a budgeted claim holds the budget
    # rows between its statements, and `budgets set` waits for them while the loop must go on.
    async with running_worker(app):
        await until(lambda: done() == 4)
        await asyncio.sleep(0.5)  # the held-back jobs stay pending
        waiting = [i for i in ids if app.get_job(i)["state"] == "pending"]
        assert len(waiting) == 2 and app.get_job(other)["state"] == "done"
        await asyncio.to_thread(held_back_and_shown, waiting)

        result = await asyncio.to_thread(run_cli, app, "budgets", "set", "llm", "--cap", "1")
        assert result.exit_code == 0, result.output
        await until(lambda: done() == 6)
    assert json.loads(run_cli(app, "budgets", "--json").stdout)[0]["cap"] == 1.0
    assert app.set_budget_cap("llm", 2.5) and not app.set_budget_cap("nothing", 1)
    assert app.budget_status()[0]["cap"] == 2.5


def test_budget_declarations_and_command_line_refuse_bad_input(app):
    for options, message in [
        ({"queue": "q"}, "give one cap"),
        ({"queue": "q", "per_day": 1, "per_month": 5}, "give one cap"),
        ({"queue": "q", "per_day": -1}, "positive number"),
        ({"queue": "q", "cap": 1}, "needs both cap and window"),
        ({"queue": "q", "per_day": 1, "key": "a..b"}, "payload field name"),
        ({"queue": "bad queue!", "per_day": 1}, "invalid queue name"),
    ]:
        with pytest.raises(joblane.JoblaneError, match=message):
            app.budget("b", **options)
    app.limit("limited", concurrency=2)
    app.budget("b", queue="limited", per_day=1)  # limits and budgets on one queue
    for args, message in [
        (["budgets", "set", "nothing", "--cap", "2"], "no budget 'nothing'"),
        (["budgets", "set", "x", "--cap", "2", "--queue", "q"], "needs --queue and --per"),
        (["budgets", "set", "x", "--cap", "2", "--queue", "q", "--per", "soon"], "window must be a duration"),
        (["budgets", "clear", "nothing"], "no budget 'nothing'"),
        (["budgets", "reset", "nothing"], "has no cap declared in code"),
    ]:
        result = run_cli(app, *args)
        assert result.exit_code == 1 and message in result.stderr, (args, result.output)
        assert "\n" not in result.stderr.strip()
    result = run_cli(app, "budgets", "set", "x", "--cap", "2", "--queue", "q", "--per", "month", "--key", "org.id")
    assert result.exit_code == 0 and "2 per month per org.id on queue q" in result.stdout, result.output
    assert cli_json(app, "budgets")[0]["window_seconds"] is None
    assert run_cli(app, "budgets", "clear", "x").exit_code == 0


async def test_a_try_counts_what_it_settled_or_else_its_estimate(app, conn):
    from joblane.testing import drain

    app.budget("tokens", queue="t", per_day=100.0, estimate="estimated_cost", default_estimate=2.0)

    @app.task("settles", queue="t")
    async def settles(job: joblane.Job):
        if job.payload.get("settle") is not None:
            job.settle(job.payload["settle"])  # no cost field: the settled amount counts

    app.enqueue_many(conn, [JobSpec("settles", {"settle": 3.0, "estimated_cost": 1.0}),
                            JobSpec("settles", {"estimated_cost": 1.5}),  # records nothing: its estimate
                            JobSpec("settles", {})])  # no estimate either: the default
    await drain(app, timeout=20)
    [row] = app.budget_status()
    assert row["key"] == "" and row["spent"] + row["in_flight"] == pytest.approx(3.0 + 1.5 + 2.0)
