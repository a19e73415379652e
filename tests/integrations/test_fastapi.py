"""FastAPI: the docs example as a new user runs it, in a database of its own; rollback included."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..conftest import wait_until
from .examples import load_example


@pytest.fixture
def database(joblane_dsn):
    """A fresh database, as a new project has: schema "joblane" migrated, a leads table in public."""
    name = f"joblane_fastapi_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(joblane_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_conninfo(joblane_dsn, dbname=name)
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE TABLE leads (id bigserial PRIMARY KEY, email text NOT NULL)")
        yield url
    finally:
        with psycopg.connect(joblane_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def to_url(conninfo: str) -> str:
    """asyncpg takes URLs only."""
    p = conninfo_to_dict(conninfo)
    auth = p.get("user", "") + (f":{p['password']}" if p.get("password") else "")
    host, port = p.get("host", "localhost"), p.get("port", 5432)
    if host.startswith("/"):  # a Unix socket directory (the embedded server)
        return f"postgresql://{auth}@/{p['dbname']}?host={host}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{p['dbname']}"


def test_the_fastapi_example_enqueues_in_the_request_transaction_and_its_worker_runs_the_job(database):
    example = load_example("fastapi_app.py")
    example.jobs._dsn = to_url(database)
    example.jobs.migrate()

    @example.api.post("/leads-then-fail")
    async def fails_after_enqueue(request: Request) -> dict:
        async with request.state.joblane_pool.acquire() as conn, conn.transaction():
            lead_id = await conn.fetchval("INSERT INTO leads (email) VALUES ('x@acme.test') RETURNING id")
            await example.jobs.enqueue_async(conn, "enrich_lead", {"lead_id": lead_id})
            raise RuntimeError("after the enqueue")

    with psycopg.connect(database, autocommit=True) as db, TestClient(example.api, raise_server_exceptions=False) as client:
        created = client.post("/leads", json={"email": "a@acme.test"})
        assert created.status_code == 201
        job_id = created.json()["job"]
        done = wait_until(lambda: db.execute("SELECT result FROM joblane.jobs WHERE id = %s AND state = 'done'",
                                             (job_id,)).fetchone(), timeout=20, message="the job ran")
        assert done[0] == {"lead_id": created.json()["lead"], "company": "Acme"}

        assert client.post("/leads-then-fail").status_code == 500
        assert db.execute("SELECT count(*) FROM leads").fetchone()[0] == 1
        assert db.execute("SELECT count(*) FROM joblane.jobs").fetchone()[0] == 1
