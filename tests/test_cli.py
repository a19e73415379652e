"""The command line: tables by default, --json for scripts, one-line errors and non-zero exits."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from joblane.cli import main
from joblane.cli.common import show_time

from .conftest import ROOT, table


def cli(*args: str, schema: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **({"JOBLANE_SCHEMA": schema} if schema else {}), **(env or {})}
    return subprocess.run([sys.executable, "-m", "joblane", *args], capture_output=True, text=True, env=full_env,
                          cwd=ROOT, timeout=60)


def test_migrate_status_jobs_retry_cancel(app, conn):
    fresh = app.schema + "_cli"
    try:
        first = cli("migrate", "--json", schema=fresh)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["applied"]
        again = cli("migrate", schema=fresh)
        assert again.returncode == 0 and "up to date" in again.stdout
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{fresh}" CASCADE')

    a = app.enqueue(conn, "report", {"n": 1}, queue="reports")
    b = app.enqueue(conn, "report", {"n": 2}, queue="reports")
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'failed', last_error = 'boom', finished_at = now()"
                 " WHERE id = %s", (a,))

    status = json.loads(cli("status", "--json", schema=app.schema).stdout)
    assert {(r["queue"], r["state"], r["jobs"]) for r in status} == {("reports", "failed", 1), ("reports", "pending", 1)}
    human = cli("status", schema=app.schema)
    assert human.returncode == 0 and "reports" in human.stdout and "pending" in human.stdout

    listed = json.loads(cli("jobs", "--state", "failed", "--json", schema=app.schema).stdout)
    assert [j["id"] for j in listed] == [a] and listed[0]["last_error"] == "boom"
    shown = json.loads(cli("jobs", "show", str(b), "--json", schema=app.schema).stdout)
    assert shown["payload"] == {"n": 2} and shown["state"] == "pending"

    retried = json.loads(cli("retry", str(a), str(b), "--json", schema=app.schema).stdout)
    assert retried == {"retried": [a], "skipped": {str(b): "pending"}}
    cancelled = json.loads(cli("cancel", str(a), "999999", "--json", schema=app.schema).stdout)
    assert cancelled == {"cancelled": [a], "skipped": {"999999": "missing"}}
    states = dict(conn.execute(f"SELECT id, state FROM {table(app, 'jobs')}").fetchall())
    assert states == {a: "cancelled", b: "pending"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["jobs", "show", "424242"], "no job 424242"),
        (["retry"], "give job ids"),
        (["retry", "12", "--kind", "x"], "either job ids or a filter"),
        (["cancel", "abc"], "job ids are integers"),
        (["worker", "nocolon"], "module:attribute"),
        (["worker", "json:dumps"], "is not a joblane.App"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(app, args, message):
    result = cli(*args, schema=app.schema)
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert message in " ".join(lines), result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_database_is_one_line():
    result = cli("status", env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert result.returncode == 1
    assert "cannot connect to the database" in result.stderr and "Traceback" not in result.stderr
    missing = cli("status", env={"DATABASE_URL": ""})
    assert missing.returncode == 1 and "DATABASE_URL" in missing.stderr


def test_hostile_schema_is_refused(app):
    result = cli("status", "--json", schema='x"; DROP SCHEMA public; --')
    assert result.returncode == 1 and "invalid schema name" in result.stderr


# -- the first hour: what a newcomer meets -------------------------------------------


def invoke(app, *args: str, schema: str | None = None, env: dict | None = None):
    """`joblane ARGS` in this process (stdin is not a terminal), against ``schema`` (default: the app's)."""
    full_env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": schema or app.schema, "COLUMNS": "200", **(env or {})}
    return CliRunner().invoke(main, list(args), env=full_env, catch_exceptions=False, prog_name="joblane")


@pytest.mark.parametrize("args", [
    ["status"], ["jobs"], ["jobs", "show", "1"], ["held"], ["outbox"], ["outbox", "show", "1"], ["limits"],
    ["limits", "set", "q", "--rate", "1/s"], ["limits", "clear", "q"], ["limits", "pause", "q", "--for", "1m"],
    ["limits", "resume", "q"], ["replay", "--kind", "x"], ["replay", "1", "--dry-run"], ["attempts"],
    ["attempts", "export"], ["retry", "1"], ["retry", "--kind", "x"], ["cancel", "1"], ["cancel", "--kind", "x"],
    ["release", "1"], ["release", "--kind", "x"], ["reject", "1", "--reason", "r"], ["outbox", "retry", "1"],
])
def test_an_unmigrated_schema_says_run_migrate_everywhere(app, args):
    schema = app.schema + "_bare"  # never migrated: no tables at all
    result = invoke(app, *args, schema=schema)
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == f"error: schema '{schema}' has no joblane tables: run `joblane migrate`"
    assert result.stdout == ""


def test_unknown_ids_exit_non_zero_after_saying_what_was_done(app, conn):
    a = app.enqueue(conn, "report", {})
    b = app.enqueue(conn, "report", {})
    cancelled = invoke(app, "cancel", str(a), "999991")
    assert cancelled.exit_code == 1
    assert cancelled.stdout.startswith(f"cancelled: 1 job ({a})")
    assert cancelled.stderr.strip() == "error: no such job: 999991"
    retried = invoke(app, "retry", "999992", "999993", "--json")
    assert retried.exit_code == 1
    assert json.loads(retried.stdout) == {"retried": [], "skipped": {"999992": "missing", "999993": "missing"}}
    assert "no such jobs: 999992, 999993" in retried.stderr
    # a job that is there but in another state is skipped, not an error
    skipped = invoke(app, "retry", str(b))
    assert skipped.exit_code == 0 and f"skipped {b}: it is pending" in skipped.stdout


@pytest.mark.parametrize("args, message", [
    (["--since", "last tuesday"], "since must be a duration ago"),
    (["--until", "soon"], "until must be a duration ago"),
])
def test_export_checks_before_writing_the_header(app, tmp_path, args, message):
    result = invoke(app, "attempts", "export", *args)
    assert result.exit_code == 1 and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    target = tmp_path / "out.csv"
    result = invoke(app, "attempts", "export", *args, "-o", str(target))
    assert result.exit_code == 1 and not target.exists() and not (tmp_path / "out.csv.partial").exists()


def test_export_with_no_rows_writes_the_header_only(app):
    result = invoke(app, "attempts", "export")
    assert result.exit_code == 0 and result.stdout.startswith("id,job_id,kind") and len(result.stdout.splitlines()) == 1


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a module that raises on import and one that has an App."""
    name = f"proj_{tmp_path.name.replace('-', '_')}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "broken.py").write_text("import joblane\napp = joblane.App()\n"
                                               "raise RuntimeError('settings missing')\n")
    (tmp_path / name / "tasks.py").write_text("import joblane\napp = joblane.App()\n")
    monkeypatch.chdir(tmp_path)
    return name


def test_an_app_that_fails_to_import_is_one_line_and_the_traceback_is_for_v(app, project):
    for command in ("worker", "relay"):
        result = invoke(app, command, f"{project}.broken:app")
        assert result.exit_code == 1
        assert result.stderr.strip() == (f"error: cannot import '{project}.broken': RuntimeError: settings missing"
                                         " (-v or JOBLANE_DEBUG=1 shows the traceback)")
        verbose = invoke(app, command, f"{project}.broken:app", "-v")
        assert verbose.exit_code == 1 and "Traceback (most recent call last)" in verbose.stderr
        assert verbose.stderr.strip().splitlines()[-1] == \
            f"error: cannot import '{project}.broken': RuntimeError: settings missing"
    debug = invoke(app, "dashboard", f"{project}.broken:app", env={"JOBLANE_DEBUG": "1"})
    assert debug.exit_code == 1 and "Traceback" in debug.stderr and "settings missing" in debug.stderr
    missing = invoke(app, "worker", f"{project}.tasks:nope")
    assert missing.exit_code == 1
    assert missing.stderr.strip() == f"error: module '{project}.tasks' has no attribute 'nope'"
    nowhere = invoke(app, "worker", f"{project}.nosuch:app")
    assert nowhere.stderr.strip() == (f"error: cannot import '{project}.nosuch': ModuleNotFoundError: "
                                      f"No module named '{project}.nosuch'")


@pytest.mark.parametrize("command", [["replay", "--kind", "x"], ["release", "1"]])
def test_a_bad_set_value_names_the_option_typed(app, command):
    result = invoke(app, *command, "--set", 'note="a\\u0000b"')
    assert result.exit_code == 1
    assert result.stderr.startswith("error: --set note contains a NUL character")
    assert "payload_patch" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["jobs", "--bogus"], "error: No such option '--bogus'. (see joblane jobs -h)"),
    (["worker"], "error: Missing argument 'APP'. (see joblane worker -h)"),
    (["limits", "pause", "q"], "error: Missing option '--for'. (see joblane limits pause -h)"),
    (["jobs", "--state", "nope"], "error: Invalid value for '--state': 'nope' is not one of"),
    (["worker", "x:y", "--retention", "a week"], "error: Invalid value for '--retention': 'a week' is not a duration"),
])
def test_usage_errors_are_one_error_line_with_exit_code_2(app, args, message):
    result = invoke(app, *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Usage:" not in result.stderr


@pytest.mark.parametrize("command, module, name", [("worker", "joblane.worker", "Worker"),
                                                   ("relay", "joblane.outbox.relay", "Relay")])
def test_retention_takes_durations_like_the_other_options(app, monkeypatch, command, module, name):
    import importlib

    seen = []

    class Fake:
        def __init__(self, app, **options):
            seen.append(options["retention_seconds"])

        async def run(self):
            return None

    monkeypatch.setattr(importlib.import_module(module), name, Fake)
    for given, seconds in (("12h", 43200.0), ("7d", 604800.0), ("3600", 3600.0), (None, 604800.0)):
        args = [command, "tests.review.app:app"] + (["--retention", given] if given else [])
        result = invoke(app, *args)
        assert result.exit_code == 0, result.output
        assert seen[-1] == seconds


def test_jobs_in_a_finished_state_show_when_they_finished(app, conn):
    job = app.enqueue(conn, "report", {})
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'failed', last_error = 'boom',"
                 " finished_at = '2031-02-03 04:05:06+00', run_after = '2030-01-01 00:00:00+00' WHERE id = %s", (job,))
    result = invoke(app, "jobs", "--state", "failed")
    assert result.exit_code == 0
    finished = show_time(dt.datetime(2031, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc))
    assert "finished" in result.stdout and finished in result.stdout and "2030-01-01" not in result.stdout
    assert "run after" not in result.stdout


@pytest.mark.parametrize("args", [
    ["jobs", "--kind", "A", "--kind", "B"],
    ["jobs", "--state", "failed", "--state", "done"],
    ["retry", "--queue", "a", "--queue", "b", "--yes"],
    ["cancel", "--kind", "A", "--kind", "B", "--dry-run"],
    ["held", "--kind", "A", "--kind", "B"],
    ["attempts", "--kind", "A", "--kind", "B"],
    ["dataset", "export", "--queue", "a", "--queue", "b"],
    ["outbox", "--topic", "crm.", "--topic", "billing."],
])
def test_a_filter_given_twice_is_refused_not_silently_narrowed_to_the_last(app, conn, args):
    kept = app.enqueue(conn, "A", {})
    result = CliRunner().invoke(main, args, env={"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema})
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert "given 2 times" in line and "it takes one value" in line, line
    assert app.get_job(kept)["state"] == "pending"


def test_more_is_offered_only_when_older_rows_exist(app, conn):
    """A page exactly full is not a sign of more: `more: --before ID` only when a row older than the page exists."""
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "COLUMNS": "200"}
    ids = [app.enqueue(conn, "A", {}) for _ in range(4)]
    for i in ids:
        app.publish(conn, "crm.lead", {"i": i})

    def more(*args: str) -> str | None:
        result = CliRunner().invoke(main, list(args), env=env)
        assert result.exit_code == 0, result.output
        lines = [line for line in result.stdout.splitlines() if line.startswith("more: --before")]
        return lines[0] if lines else None

    assert more("jobs", "--limit", "4") is None
    assert more("jobs", "--limit", "3") == f"more: --before {ids[1]}"
    assert more("jobs", "--limit", "2", "--before", str(ids[2])) is None
    assert more("outbox", "--limit", "4") is None and more("outbox", "--limit", "3").startswith("more: --before")
    assert more("attempts", "--limit", "1") is None  # no tries yet: nothing to page
    assert len(json.loads(CliRunner().invoke(main, ["jobs", "--limit", "3", "--json"], env=env).stdout)) == 3


def test_retry_grants_one_more_try_to_a_spent_budget_and_attempts_n_grants_n(app, conn):
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema}
    spent = [app.enqueue(conn, "report", {"n": i}, max_attempts=3) for i in range(3)]
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'failed', attempts = 3, finished_at = now(),"
                 " last_error = 'boom' WHERE id = ANY(%s)", (spent,))
    one, three, bad = spent
    assert CliRunner().invoke(main, ["retry", str(one)], env=env).exit_code == 0
    result = CliRunner().invoke(main, ["retry", "--attempts", "3", str(three)], env=env)
    assert result.exit_code == 0, result.output
    budgets = {i: (s, a, m) for i, s, a, m in conn.execute(
        f"SELECT id, state, attempts, max_attempts FROM {table(app, 'jobs')} WHERE id = ANY(%s)", (spent,))}
    assert budgets[one] == ("pending", 3, 4) and budgets[three] == ("pending", 3, 6)
    refused = CliRunner().invoke(main, ["retry", "--attempts", "0", str(bad)], env=env)
    assert refused.exit_code == 2 and "--attempts" in refused.stderr
    assert app.retry(ids=[bad], attempts=2) == [bad] and app.get_job(bad)["max_attempts"] == 5
