"""`joblane batches`, `batches show`, `waiting` and `signal`."""

from __future__ import annotations

import json
import subprocess

import psycopg
from click.testing import CliRunner

from joblane.cli import main
from joblane.testing import run_jobs


def cli(*args: str, schema: str) -> subprocess.CompletedProcess:
    """`joblane ARGS` in this process (click's runner), as the shell would see it."""
    result = CliRunner().invoke(main, list(args), env={"JOBLANE_SCHEMA": schema})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_batches_waiting_and_signal_commands(app, conn):
    @app.task("step")
    def step(job):
        pass

    @app.task("summary")
    def summary(job):
        pass

    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, name="overnight", on_complete=("summary", {}))
        first = batch.enqueue(tx, "step", {"n": 1})
        child = batch.enqueue(tx, "step", {"n": 2}, after=[first])
    listed = cli("batches", "--json", schema=app.schema)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["id"], row["name"], row["state"], row["total"], row["pending"], row["waiting"]) == (
        batch.id, "overnight", "open", 2, 1, 1)
    shown = cli("batches", "show", str(batch.id), schema=app.schema)
    assert shown.returncode == 0 and "1 parent" in shown.stdout and "overnight" in shown.stdout
    waiting = cli("waiting", "--json", schema=app.schema)
    assert [(w["id"], w["parents_left"]) for w in json.loads(waiting.stdout)] == [(child, 1)]
    missing = cli("batches", "show", "999999", schema=app.schema)
    assert missing.returncode == 1 and missing.stderr.strip().startswith("error: no batch 999999")
    with psycopg.connect(app.dsn) as tx:
        batch.seal(tx)
    run_jobs(app)
    done = json.loads(cli("batches", "show", str(batch.id), "--json", schema=app.schema).stdout)
    assert done["state"] == "finished" and done["done"] == 2 and done["callback_job_id"]
    sent = cli("signal", "approval:1", "--data", '{"ok": true}', "--json", schema=app.schema)
    assert json.loads(sent.stdout) == {"key": "approval:1", "woken": 0}
    bad = cli("signal", "k", "--data", "{nope", schema=app.schema)
    assert bad.returncode == 1 and bad.stderr.startswith("error: --data is not JSON")
