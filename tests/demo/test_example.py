"""The lead-intake example's pieces without the demo: the form's transaction, the stand-in services."""

from __future__ import annotations

import warnings

import psycopg
import pytest

pytest.importorskip("starlette")
warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from starlette.testclient import TestClient  # noqa: E402

from joblane.queries import catalogue  # noqa: E402
from joblane.showcase.demo import queries_for  # noqa: E402
from joblane.showcase.lead_intake import db, local_crm, local_model  # noqa: E402
from joblane.showcase.lead_intake.form import create_form  # noqa: E402

from ..conftest import count, table  # noqa: E402

LEAD = {"name": "Ada Brooks", "email": "Ada.Brooks@fabrikam.io", "company": "Fabrikam",
        "message": "Could we book a demo? We want pricing for 40 seats."}


def test_form_writes_the_lead_and_its_job_together(app, conn):
    db.create_table(conn, app.schema)
    with TestClient(create_form(app)) as client:
        answer = client.post("/leads", data=LEAD, follow_redirects=False)
        assert answer.status_code == 303
        lead_id = int(answer.headers["location"].rsplit("/", 1)[1])
        lead = client.get(f"/leads/{lead_id}", headers={"Accept": "application/json"}).json()
        assert lead["email"] == "ada.brooks@fabrikam.io" and lead["status"] == "received"
        assert (lead["job_kind"], lead["job_state"]) == ("enrich", "pending")
        job = app.get_job(lead["last_job_id"])
        assert job["payload"] == {"lead_id": lead_id}
        assert "Ada Brooks" in client.get("/").text

        bad = client.post("/leads", data={**LEAD, "email": "not an address"}, follow_redirects=False)
        assert bad.status_code == 400 and "valid email" in bad.text
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'leads')}").fetchone()[0] == 1
    assert count(conn, app) == 1


def test_local_model_answers_the_same_lead_the_same_way_and_rate_limits():
    model = local_model.LocalModel(local_model.Behaviour(rate_per_second=2, burst_every=0, error_rate=0,
                                                         latency_ms=(1, 2)))
    body = {"model": "m", "messages": [{"role": "user", "content": '{"message": "Pricing and a demo, please",'
                                                                    ' "employees": 500, "industry": "software"}'}]}
    with TestClient(model.app) as client:
        headers = {"Authorization": "Bearer local"}
        first, second, third = (client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(3))
    assert first.status_code == second.status_code == 200
    assert first.json()["choices"][0]["message"]["content"] == second.json()["choices"][0]["message"]["content"]
    assert '"intent": "buying"' in first.json()["choices"][0]["message"]["content"]
    assert first.json()["usage"]["prompt_tokens"] > 0
    assert third.status_code == 429 and float(third.headers["retry-after"]) > 0


def test_local_crm_has_no_idempotency_and_searches_by_email():
    crm = local_crm.LocalCrm(error_rate=0, latency_ms=(0, 1))
    contact = {"external_id": "lead-1", "email": "a@b.test"}
    with TestClient(crm.app) as client:
        for _ in range(2):
            assert client.post("/contacts", json=contact, headers={"Idempotency-Key": "lead-1"}).status_code == 201
        found = client.get("/contacts", params={"email": "a@b.test"}).json()["contacts"]
    assert [c["external_id"] for c in found] == ["lead-1", "lead-1"]  # the duplicate the relay must avoid


def test_the_demo_queries_prepare_and_stay_out_of_the_catalogue(app, conn):
    """showcase/demo.sql is loaded by the demo itself, not by joblane: a typo in it fails here."""
    queries = queries_for(app.schema)
    assert queries.names() and not set(queries.names()) & set(catalogue())
    for name in queries.names():
        result = conn.pgconn.prepare(f"q_{name}".encode(), getattr(queries, name).encode())
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, (name, result.error_message)
