"""Django: enqueue and publish in a view's transaction.atomic(), the management commands, a job seen running."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import psycopg
import pytest

from joblane.queries import quote_ident
from joblane.testing import run_jobs

from ..conftest import ROOT, wait_until

SETTINGS = "tests.integrations.djangoproject.settings"


@pytest.fixture(scope="module")
def project(joblane_dsn):
    """django.setup() on the test project, joblane_migrate, the app's table; the schema is dropped afterwards."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from .djangoproject.leads.models import Lead
    from .djangoproject.settings import SCHEMA

    out = io.StringIO()
    call_command("joblane_migrate", stdout=out)
    assert f"schema {SCHEMA}: applied 1" in out.getvalue()
    call_command("joblane_migrate", stdout=out)
    assert f"schema {SCHEMA} is up to date" in out.getvalue()
    with connection.schema_editor() as editor:
        editor.create_model(Lead)
    yield SCHEMA
    connection.close()
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {quote_ident(SCHEMA)} CASCADE")


def rows(schema: str, sql: str) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(sql.replace("{schema}", quote_ident(schema)))
        return cur.fetchall()


@pytest.fixture
def client(project):
    from django.test import Client

    for table in ("jobs", "outbox", "leads"):
        rows(project, f"DELETE FROM {{schema}}.{table} RETURNING 1")
    return Client()


def test_the_view_commits_lead_job_and_message_together_and_the_job_runs(project, client):
    from joblane.integrations.django import get_app

    from .djangoproject.leads.models import Lead

    response = client.post("/leads/", {"email": "a@acme.test"})
    assert response.status_code == 201
    lead_id, job_id = response.json()["lead"], response.json()["job"]
    assert rows(project, "SELECT id, kind, queue, payload->>'lead_id', state FROM {schema}.jobs") == [
        (job_id, "enrich_lead", "leads", str(lead_id), "pending")]
    assert rows(project, "SELECT topic, key FROM {schema}.outbox") == [("crm.lead_created", f"lead-{lead_id}")]
    assert run_jobs(get_app())["done"] == 1
    assert Lead.objects.get(id=lead_id).company == "Acme"


def test_a_failing_view_leaves_no_lead_no_job_no_message(project, client):
    from .djangoproject.leads.models import Lead

    with pytest.raises(RuntimeError, match="failed after enqueueing"):
        client.post("/leads/", {"email": "b@acme.test", "fail": "1"})
    assert Lead.objects.count() == 0
    assert rows(project, "SELECT count(*) FROM {schema}.jobs") == [(0,)]
    assert rows(project, "SELECT count(*) FROM {schema}.outbox") == [(0,)]


def test_outside_atomic_the_job_commits_at_once_like_any_orm_write(project, client):
    from django.db import transaction

    from joblane.integrations.django import enqueue, enqueue_many, get_app

    job_id = enqueue("enrich_lead", {"lead_id": 0}, delay=3600)
    with psycopg.connect(get_app().dsn) as other:  # another connection sees it: it is committed
        assert other.execute(f"SELECT id FROM {quote_ident(project)}.jobs").fetchall() == [(job_id,)]
    with pytest.raises(ValueError), transaction.atomic():
        enqueue("enrich_lead", {"lead_id": 1})
        enqueue_many([("enrich_lead", {"lead_id": 2}), ("enrich_lead", {"lead_id": 3})])
        raise ValueError("rolled back")
    assert rows(project, "SELECT count(*) FROM {schema}.jobs") == [(1,)]


def test_settings_make_the_app(project, joblane_dsn):
    from joblane.integrations.django import app, database_url, get_app

    assert app is get_app()
    assert app.schema == project
    assert "enrich_lead" in app.tasks  # found by autodiscovery of leads/tasks.py
    assert getattr(app.tasks["enrich_lead"].fn, "_joblane_django", False)  # connections checked per task
    assert database_url().startswith("postgresql://")
    assert database_url().rsplit("/", 1)[1] == urlsplit(joblane_dsn).path.lstrip("/")


def test_manage_py_joblane_worker_runs_the_job_a_view_enqueued(project, client):
    from .djangoproject.leads.models import Lead

    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": SETTINGS}
    worker = subprocess.Popen([sys.executable, "-m", "django", "joblane_worker", "--poll-interval", "0.2", "-v", "2",
                               "--log-format", "json"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        lead_id = client.post("/leads/", {"email": "c@acme.test"}).json()["lead"]
        wait_until(lambda: Lead.objects.get(id=lead_id).company == "Acme", timeout=30, message="the job ran")
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0]
    assert worker.returncode == 0, output
    assert '"outcome": "done"' in output
