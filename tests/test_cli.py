"""The command line: tables by default, --json for scripts, one-line errors and non-zero exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
