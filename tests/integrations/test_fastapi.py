"""FastAPI: the docs example as a new user runs it, in a database of its own; rollback included; and the page's
shell session (migrate, psql, uvicorn, curl, joblane jobs) run line by line as written."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from importlib import metadata

import psycopg
import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..conftest import ROOT, wait_until
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


@pytest.fixture
def empty_database(joblane_dsn):
    """A fresh, empty database (no joblane schema, no tables), as a URL."""
    name = f"joblane_fastapi_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(joblane_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield to_url(make_conninfo(joblane_dsn, dbname=name))
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


def test_the_fastapi_page_shell_session_runs_as_written(empty_database, tmp_path):
    """docs/fastapi.md's shell lines, in order, against a fresh database: the POST answers 201 and the job's
    result is what `joblane jobs show` prints. Only the port differs (8000 may be taken here)."""
    from .test_docs import DOCS, blocks

    if shutil.which("psql") is None:
        pytest.skip("no psql client here")
    [session] = [b for b in blocks(DOCS / "fastapi.md") if b.info == "sh"]
    (tmp_path / "app.py").write_text((ROOT / "docs" / "examples" / "fastapi_app.py").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": empty_database, "UVICORN_PORT": str(port),
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("JOBLANE_SCHEMA", None)
    server = None
    outputs: dict[str, str] = {}

    def run(line: str, until=None) -> str:
        deadline = time.monotonic() + 20
        while True:
            done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
            if until is None or until(done.stdout) or time.monotonic() > deadline:
                return done.stdout
            time.sleep(0.2)

    try:
        for line in session.body.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[:2] == ["pip", "install"]:
                # installed already: check that the extra brings what the next lines use
                extra = {r.split(";")[0].split(">")[0].split("=")[0].strip().lower()
                         for r in metadata.requires("joblane") or [] if 'extra == "fastapi"' in r}
                assert {"fastapi", "uvicorn"} <= extra, extra
            elif words[0] == "export":
                continue  # DATABASE_URL is the fresh database's
            elif words[0] == "uvicorn":
                server = subprocess.Popen(words, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
                wait_until(lambda: _listening(port), timeout=30, message="uvicorn serving")
            elif words[0] == "curl":
                outputs["curl"] = run(line.replace("localhost:8000", f"127.0.0.1:{port}"))
            elif words[:3] == ["joblane", "jobs", "--kind"]:
                outputs["jobs"] = run(line, until=lambda out: "done" in out)
            else:
                outputs[words[0] + " " + " ".join(words[1:3])] = run(line)
        assert json.loads(outputs["curl"]) == {"lead": 1, "job": 1}
        assert "done" in outputs["jobs"] and "enrich_lead" in outputs["jobs"]
        shown = outputs["joblane jobs show"]
        assert '"company": "Acme"' in shown and '"lead_id": 1' in shown, shown
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False
