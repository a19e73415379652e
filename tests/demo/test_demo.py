"""`joblane demo` end to end at a reduced size, and the example's pieces on their own.

The demo runs as a subprocess against DATABASE_URL, in a schema of its own:
real form, real worker and relay processes (one of each SIGKILLed mid-run,
the relay between sending and marking sent), the local model and CRM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psycopg
import pytest

from joblane.queries import quote_ident
from joblane.testing import new_schema_name

from ..conftest import ROOT

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def _run_demo(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": dsn, "JOBLANE_SCHEMA": schema}
    env.pop("OPENAI_BASE_URL", None)  # always the local model server here
    proc = subprocess.Popen([sys.executable, "-m", "joblane", "demo", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the demo, its workers and its relay
        out, err = proc.communicate()
        pytest.fail(f"the demo did not finish in time:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_demo_accounts_for_every_lead_through_crashes(joblane_dsn):
    schema = new_schema_name("demo")
    try:
        done = _run_demo(joblane_dsn, schema, "--leads", "40", "--rate", "40", "--json", "--timeout", "100")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        s = json.loads(done.stdout)

        # every lead submitted through the form is in exactly one place
        assert s["accounted"] and not s["unaccounted"] and not s["form_refused"]
        assert s["leads_in"] == 40
        assert s["qualified"] + s["not_qualified"] + s["held"] + s["rejected"] + s["failed"] == 40
        assert s["qualified"] > 0 and s["not_qualified"] > 0 and s["failed"] > 0
        # the CRM creates a contact per POST, yet holds one per qualified lead
        assert s["contacts"] == s["qualified"]
        assert s["duplicates"] == 0 and s["unexpected_contacts"] == []
        assert all(f["reason"] for f in s["failures"])

        # the relay died after the CRM created contacts and before it marked them sent:
        # read-back found them, nothing was posted twice
        relay = s["relay_crash"]
        assert relay["done"] and relay["already_in_crm"], relay
        assert relay["posted_again"] == 0
        # the killed worker's jobs came back after their lease and finished
        worker = s["worker_crash"]
        assert worker["done"] and worker["jobs"], worker
        assert worker["rescued"] == worker["finished"] == len(worker["jobs"])

        # a held lead released from the CLI with a decision reached the CRM
        assert s["review"]["released"] is not None and s["review"]["released_in_crm"] is True
        assert s["model"]["calls"] >= s["model"]["answered"] > 0 and s["model"]["tokens_in"] > 0

        # the AI tour: tenant acme reached its spend cap and waited until it was raised; the lead scored
        # twice made one model call (a cache hit)
        tour = s["ai_tour"]
        assert tour["ran"] and tour["cap"]["waiting"] > 0 and tour["cap"]["spent"] >= tour["cap"]["cap"]
        assert tour["cache"]["hits"] >= 1
        if "compare" in tour:  # the first prompt failed some scores: their replays are compared
            assert tour["compare"]["replay"]["jobs"] == tour["compare"]["original"]["failed"]
        # the nightly batch asked about every decided lead again; its callback waited for the manager's
        # signal (a durable wait) and wrote the digest once
        nightly = s["nightly"]
        assert nightly["leads"] == s["qualified"] + s["not_qualified"]
        assert nightly["answered"] + nightly["failed"] == nightly["leads"]
        assert nightly["digest"]["approved_by"] == "demo manager"

        # and the database agrees, read directly
        with psycopg.connect(joblane_dsn, autocommit=True) as conn:
            q = quote_ident(schema)
            assert conn.execute(f"SELECT count(*) FROM {q}.leads").fetchone()[0] == 40
            assert conn.execute(f"SELECT count(*) FROM {q}.jobs WHERE state IN ('pending', 'running')"
                                ).fetchone()[0] == 0
            outbox = dict(conn.execute(f"SELECT state, count(*) FROM {q}.outbox GROUP BY state").fetchall())
            assert outbox == {"sent": s["qualified"]}
            assert conn.execute(f"SELECT count(*) FROM {q}.digests").fetchone()[0] == 1
            assert conn.execute(f"SELECT count(*) FROM {q}.jobs WHERE kind = 'nightly_digest'").fetchone()[0] == 1
            keys = conn.execute(f"SELECT count(DISTINCT idempotency_key) FROM {q}.outbox").fetchone()[0]
            assert keys == s["qualified"]
            lost = conn.execute(f"SELECT count(DISTINCT job_id) FROM {q}.attempts WHERE outcome = 'lost'"
                                ).fetchone()[0]
            assert lost >= len(worker["jobs"])
    finally:
        with psycopg.connect(joblane_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")


def test_demo_refuses_a_schema_it_did_not_make(joblane_dsn, joblane_schema):
    done = _run_demo(joblane_dsn, joblane_schema, "--leads", "1", "--json")
    assert done.returncode == 1
    assert "the demo did not make it" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
