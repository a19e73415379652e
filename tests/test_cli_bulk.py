"""Bulk admin work: retry, cancel, release and reject by the filters of `jobs`, counted and confirmed before it runs."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from joblane import JobSpec
from joblane.cli import common, main
from joblane.errors import JoblaneError

from .conftest import table
from .review.helpers import cli_json, rows, run_cli


def answering(app, answer: str, *args: str):
    """`joblane ARGS` with ``answer`` typed at its prompt."""
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "COLUMNS": "200"}
    return CliRunner().invoke(main, list(args), env=env, input=answer, catch_exceptions=False)


def states(conn, app) -> dict[int, str]:
    return dict(conn.execute(f"SELECT id, state FROM {table(app, 'jobs')}").fetchall())


def age(conn, app, ids, interval: str) -> None:
    """Make jobs ``ids`` as old as ``interval`` (created then)."""
    conn.execute(f"UPDATE {table(app, 'jobs')} SET created_at = now() - %s::interval WHERE id = ANY(%s)",
                 (interval, list(ids)))


def fail(conn, app, ids, state: str = "failed") -> None:
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = %s, finished_at = now(), last_error = 'boom'"
                 " WHERE id = ANY(%s)", (state, list(ids)))


def test_cancel_by_kind_queue_state_and_created_time(app, conn):
    a_leads = app.enqueue_many(conn, [JobSpec("enrich", {"i": i}, queue="leads") for i in range(3)])
    a_other = app.enqueue(conn, "enrich", {}, queue="other")
    b_leads = app.enqueue(conn, "score", {}, queue="leads")
    held = app.enqueue(conn, "enrich", {}, queue="leads", held=True)
    done = app.enqueue(conn, "enrich", {}, queue="leads")
    fail(conn, app, [done], "done")
    age(conn, app, a_leads[:1], "3 days")

    # only pending ones: the held one stays; the done one is never touched
    out = cli_json(app, "cancel", "--kind", "enrich", "--queue", "leads", "--state", "pending", "--since", "1d")
    assert out == {"cancelled": sorted(a_leads[1:]), "skipped": {}}
    assert cli_json(app, "cancel", "--kind", "enrich", "--until", "1d") == {"cancelled": a_leads[:1], "skipped": {}}
    after = states(conn, app)
    assert (after[a_other], after[b_leads], after[held], after[done]) == ("pending", "pending", "held", "done")
    # every cancellable state by default: pending, held (and running)
    assert cli_json(app, "cancel", "--kind", "enrich")["cancelled"] == sorted([a_other, held])
    audit = rows(conn, app, "SELECT job_id, outcome FROM {attempts} WHERE outcome = 'cancelled'")
    assert len(audit) == 5


def test_retry_by_filter_failed_by_default_or_cancelled(app, conn):
    failed = app.enqueue_many(conn, [JobSpec("enrich", {"i": i}) for i in range(2)])
    cancelled = app.enqueue(conn, "enrich", {})
    other = app.enqueue(conn, "score", {})
    fail(conn, app, failed + [other])
    fail(conn, app, [cancelled], "cancelled")
    age(conn, app, failed[:1], "2 hours")

    assert cli_json(app, "retry", "--kind", "enrich", "--since", "1h")["retried"] == failed[1:]
    assert cli_json(app, "retry", "--kind", "enrich", "--state", "cancelled")["retried"] == [cancelled]
    assert cli_json(app, "retry", "--state", "failed", "--until", "1h")["retried"] == failed[:1]
    assert states(conn, app)[other] == "failed"
    refused = run_cli(app, "retry", "--state", "pending")
    assert refused.exit_code == 2 and "'pending' is not one of" in refused.stderr


def test_release_and_reject_every_matching_held_job(app, conn):
    drafts = app.enqueue_many(conn, [JobSpec("draft", {"v": 1}, queue="review", held=True) for _ in range(3)])
    other = app.enqueue(conn, "summary", {"v": 1}, queue="review", held=True)
    listy = app.enqueue(conn, "draft", [1, 2], queue="review", held=True)

    # a payload that is not an object takes no patch: it stays held, and the command says so
    result = run_cli(app, "release", "--kind", "draft", "--set", "v=2", "--note", "new prompt")
    assert result.exit_code == 0, result.output
    assert "released: 3 jobs" in result.stdout and f"1 matching job stayed held ({listy})" in result.stderr
    payloads = dict(conn.execute(f"SELECT id, payload FROM {table(app, 'jobs')} WHERE state = 'pending'").fetchall())
    assert payloads == {i: {"v": 2} for i in drafts}
    audit = rows(conn, app, "SELECT job_id, outcome, error, meta FROM {attempts} ORDER BY job_id")
    assert [(a["job_id"], a["outcome"], a["error"], a["meta"]) for a in audit] == [
        (i, "released", "new prompt", {"label": "approve_edited", "payload_patch": {"v": 2},
                                       "payload_before": {"v": 1}}) for i in drafts]

    out = cli_json(app, "reject", "--queue", "review", "--reason", "old prompt")
    assert out == {"rejected": sorted([other, listy]), "reason": "old prompt"}
    assert {states(conn, app)[i] for i in (other, listy)} == {"cancelled"}
    # one job by id still works as before (a dry run changes nothing), and an id with a filter is refused
    fresh = app.enqueue(conn, "draft", {}, held=True)
    assert cli_json(app, "release", str(fresh), "--dry-run")["matching"] == 1
    assert cli_json(app, "reject", str(fresh), "--reason", "r", "--dry-run")["matching"] == 1
    assert states(conn, app)[fresh] == "held"
    assert cli_json(app, "release", str(fresh)) == {"released": fresh, "payload_patch": {}}
    assert run_cli(app, "release", str(other), "--kind", "draft").exit_code == 1
    assert "give either a job id or a filter" in run_cli(app, "reject", "1", "--kind", "x", "--reason", "r").stderr
    assert "give a job id or a filter" in run_cli(app, "release").stderr


def test_many_jobs_are_counted_and_need_yes_without_a_terminal(app, conn):
    ids = app.enqueue_many(conn, [JobSpec("bulk", {"i": i}) for i in range(common.CONFIRM_OVER + 1)])
    # no terminal to ask on (stdin is not one here): refused in one line, nothing changed, never a hang
    refused = run_cli(app, "cancel", "--kind", "bulk")
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (f"error: this would cancel {len(ids)} jobs: pass --yes to go ahead"
                                      " (--dry-run shows what matches)")
    assert set(states(conn, app).values()) == {"pending"}

    dry = run_cli(app, "cancel", "--kind", "bulk", "--dry-run")
    assert dry.exit_code == 0 and f"would cancel {len(ids)} jobs ({', '.join(map(str, ids[:20]))}...)" in dry.stdout
    assert cli_json(app, "cancel", "--kind", "bulk", "--dry-run") == {
        "dry_run": True, "action": "cancel", "matching": len(ids), "first_ids": ids[:20]}
    assert set(states(conn, app).values()) == {"pending"}

    done = run_cli(app, "cancel", "--kind", "bulk", "--yes")
    assert done.exit_code == 0 and done.stdout.startswith(f"cancelled: {len(ids)} jobs")
    assert "cancelling" not in done.output  # no progress text in a pipe
    assert set(states(conn, app).values()) == {"cancelled"}
    # the same many by id are asked about too
    refused = run_cli(app, "retry", *map(str, ids))
    assert refused.exit_code == 1 and "pass --yes" in refused.stderr


def test_on_a_terminal_the_count_is_shown_and_asked(app, conn, monkeypatch):
    ids = app.enqueue_many(conn, [JobSpec("bulk", {"i": i}) for i in range(common.CONFIRM_OVER + 1)])
    fail(conn, app, ids)
    monkeypatch.setattr(common, "interactive", lambda: True)
    spinner = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=spinner, force_terminal=True, width=100))

    declined = answering(app, "n\n", "retry", "--kind", "bulk")
    assert declined.exit_code == 1 and "not confirmed: nothing was changed" in spinner.getvalue()
    assert f"Retry {len(ids)} jobs? [y/N]" in declined.stderr
    assert set(states(conn, app).values()) == {"failed"}

    accepted = answering(app, "y\n", "retry", "--kind", "bulk")
    assert accepted.exit_code == 0 and accepted.stdout.startswith(f"retried: {len(ids)} jobs")
    assert f"{len(ids)} jobs match" in spinner.getvalue() and f"retrying {len(ids)} jobs" in spinner.getvalue()
    assert set(states(conn, app).values()) == {"pending"}


def test_replay_of_many_asks_first(app, conn):
    ids = app.enqueue_many(conn, [JobSpec("bulk", {"i": i}) for i in range(common.CONFIRM_OVER + 1)])
    fail(conn, app, ids)
    refused = run_cli(app, "replay", "--kind", "bulk")
    assert refused.exit_code == 1 and f"this would replay {len(ids)} jobs: pass --yes" in refused.stderr
    assert len(states(conn, app)) == len(ids)
    assert run_cli(app, "replay", "--kind", "bulk", "--limit", "5").exit_code == 0  # few: no question
    out = cli_json(app, "replay", "--kind", "bulk", "--skip-replayed", "--yes")
    assert len(out["jobs"]) == len(ids) - 5 and len(states(conn, app)) == 2 * len(ids)


def test_the_app_doors_take_the_same_filters(app, conn):
    new = app.enqueue_many(conn, [JobSpec("enrich", {}, queue="leads") for _ in range(2)])
    old = app.enqueue(conn, "enrich", {}, queue="leads")
    age(conn, app, [old], "3 days")
    assert app.count_matching(action="cancel", kind="enrich", since="1d") == (2, new)
    assert app.list_jobs(kind="enrich", until="1d") == [j for j in app.list_jobs() if j["id"] == old]
    assert app.cancel(kind="enrich", since="1d", reason="stop") == new
    assert app.retry(state="cancelled", queue="leads") == new
    assert app.cancel(ids=[old]) == [old]  # by id as before
    held = app.enqueue(conn, "draft", {"a": 1}, held=True)
    assert app.release_held(None, kind="draft", payload_patch={"b": 2}) == [held]
    held2 = app.enqueue(conn, "draft", {}, held=True)
    assert app.reject_held(None, "no", kind="draft") == [held2]
    with pytest.raises(JoblaneError, match="cancel needs job ids or a filter"):
        app.cancel()
    with pytest.raises(JoblaneError, match="retry acts on failed or cancelled jobs, not 'pending' ones"):
        app.retry(state="pending")
    with pytest.raises(JoblaneError, match="since must be a duration ago"):
        app.cancel(since="yesterday-ish")


def test_jobs_lists_by_created_time_too(app, conn):
    new = app.enqueue(conn, "a", {})
    old = app.enqueue(conn, "a", {})
    age(conn, app, [old], "2 days")
    assert [j["id"] for j in cli_json(app, "jobs", "--since", "1d")] == [new]
    assert [j["id"] for j in cli_json(app, "jobs", "--until", "1d")] == [old]
    assert json.loads(run_cli(app, "jobs", "--json").stdout)[0]["id"] == old
