"""The AI tables stop growing: the pruner removes expired cache rows and ended budget windows, and nothing live."""

from __future__ import annotations

import asyncpg

from joblane.maintenance import Pruner

from ..review.helpers import cli_json, run_cli
from .helpers import rows


def _fabricate(conn, app) -> None:
    """Cached results and claims, live and not; budget windows current, ended, and of a budget that is gone."""
    cache = [
        ("done-expired", "done", "now() - interval '1 hour'", "NULL"),
        ("done-expired-long-ago", "done", "now() - interval '30 days'", "NULL"),
        ("done-live", "done", "now() + interval '1 day'", "NULL"),
        ("done-forever", "done", "'infinity'", "NULL"),
        ("claim-ran-out", "running", "NULL", "now() - interval '2 hours'"),  # its job died
        ("claim-ran-out-lately", "running", "NULL", "now() - interval '1 minute'"),  # its slow call may fill it
        ("claim-live", "running", "NULL", "now() + interval '2 minutes'"),  # a call in progress
    ]
    for key, state, expires, claimed in cache:
        rows(conn, app, f"INSERT INTO {{step_cache}} (key, step, state, result, expires_at, claimed_until)"
                        f" VALUES (%s, 'summarise', %s, CASE WHEN %s = 'done' THEN jsonb_build_object() END, {expires},"
                        f" {claimed}) RETURNING key", (key, state, state))
    app.budget("daily", queue="llm", per_day=5.0, key="tenant")
    app.budget("hourly", queue="llm", per_hour=1.0, key="tenant")
    from joblane import admin

    for budget in app.budgets.values():
        admin.save_budget(app, budget)
    usage = [  # the longest window in use is a day: a window is kept a day after it ended
        ("daily", "date_trunc('day', now(), 'UTC')", "acme"),  # the current day
        ("daily", "date_trunc('day', now(), 'UTC') - interval '1 day'", "acme"),  # yesterday: kept beside today
        ("daily", "date_trunc('day', now(), 'UTC') - interval '3 days'", "acme"),  # ended two days ago
        ("daily", "date_trunc('day', now(), 'UTC') - interval '40 days'", "globex"),
        ("hourly", "date_trunc('hour', now(), 'UTC')", "acme"),  # the current hour
        ("hourly", "date_trunc('hour', now(), 'UTC') - interval '1 hour'", "acme"),  # ended within the day
        ("hourly", "date_trunc('hour', now(), 'UTC') - interval '30 hours'", "acme"),  # ended a day ago and more
        ("gone", "now() - interval '2 hours'", "acme"),  # a budget removed without its spend: kept a day
        ("gone", "date_trunc('day', now(), 'UTC') - interval '40 days'", "acme"),
    ]
    for budget, start, key in usage:
        rows(conn, app, f"INSERT INTO {{budget_usage}} (budget, key, window_start, spent, tries)"
                        f" VALUES (%s, %s, {start}, 1, 1) RETURNING budget", (budget, key))


async def test_the_pruner_removes_expired_cache_rows_and_ended_budget_windows_and_keeps_live_ones(app, conn,
                                                                                                joblane_dsn):
    _fabricate(conn, app)
    health = cli_json(app, "status", "--health")["ai"]
    assert health["cache_expired"] == 2 and health["cache_lost_claims"] == 1 and health["cache_results"] == 4
    assert health["budget_windows"] == 9 and health["budget_windows_due"] == 4
    line = run_cli(app, "status", "--health").stdout
    assert "AI tables: step_cache 4 results (2 expired, 1 lost claims, for the pruner); budget_usage 9 windows" \
           " (4 past the longest window, for the pruner)" in " ".join(line.split()), line

    from .helpers import dashboard

    with dashboard(app) as web:
        metrics = web.get("/metrics").text
    assert 'joblane_ai_rows{state="due",table="step_cache"} 3.0' in metrics, metrics
    assert 'joblane_ai_rows{state="due",table="budget_usage"} 4.0' in metrics

    pruner = Pruner(app.store, interval=1, batch=2)  # batches of 2: a full batch means more to do
    c = await asyncpg.connect(joblane_dsn)
    try:
        await pruner.run_once(c)
        assert pruner.behind  # a full batch of each: the next round comes at once
        while pruner.behind:
            await pruner.run_once(c)
    finally:
        await c.close()
    assert pruner.cache_pruned == 3 and pruner.budget_windows_pruned == 4

    left = {r["key"] for r in rows(conn, app, "SELECT key FROM {step_cache}")}
    assert left == {"done-live", "done-forever", "claim-live", "claim-ran-out-lately"}
    kept = rows(conn, app, "SELECT budget, extract(epoch FROM now() - window_start) / 3600 < 48 AS recent"
                           " FROM {budget_usage} ORDER BY budget, window_start")
    assert [k["budget"] for k in kept] == ["daily", "daily", "gone", "hourly", "hourly"]
    assert all(k["recent"] for k in kept)
    health = cli_json(app, "status", "--health")["ai"]
    assert (health["cache_expired"], health["cache_lost_claims"], health["budget_windows_due"]) == (0, 0, 0)
    # the spend of the current windows is untouched: `joblane budgets` still reads it
    spend = {(b["budget"], b["key"]): b["spent"] for b in app.budget_status()}
    assert spend == {("daily", "acme"): 1.0, ("hourly", "acme"): 1.0}

    # with the daily budget gone, the longest window is an hour: the orphan of two hours ago goes too
    assert run_cli(app, "budgets", "clear", "daily").exit_code == 0
    c = await asyncpg.connect(joblane_dsn)
    try:
        await pruner.run_once(c)
    finally:
        await c.close()
    left = rows(conn, app, "SELECT budget FROM {budget_usage} ORDER BY budget, window_start")
    assert [r["budget"] for r in left] == ["hourly", "hourly"], left
