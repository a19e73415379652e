"""Refresh docs/screenshots/*.png: the dashboard's pages (overview, queues, workers, jobs search and a bulk
action, review queue, a job, outbox, history) over a day's worth of sample work.

    python scripts/screenshots.py          # DATABASE_URL, else an embedded PostgreSQL

The sample data lives in a throwaway schema, dropped at the end. The browser
is Debian's chromium (installed with apt-get when missing), driven by Playwright.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import joblane  # noqa: E402
from joblane import store  # noqa: E402
from joblane.queries import quote_ident  # noqa: E402
from joblane.testing import database_url, drain, isolated_schema, new_schema_name  # noqa: E402
from joblane.web import create_app  # noqa: E402
from tests.web.browser import LiveServer, chromium  # noqa: E402

OUT = ROOT / "docs" / "screenshots"

LEADS = [
    ("Acme Robotics", "We need 40 seats before the quarter ends", 0.93),
    ("Globex", "Can your API do SSO with Okta?", 0.52),
    ("Initech", "price??? <b>urgent</b>", 0.41),
    ("Umbrella Health", "Looking for a HIPAA-ready plan", 0.58),
    ("Soylent", "unsubscribe", 0.12),
]


def sample_app(dsn: str, schema: str) -> joblane.App:
    app = joblane.App(dsn, schema=schema)

    @app.task("classify_lead", queue="leads", max_attempts=3)
    async def classify_lead(job: joblane.Job) -> dict:
        confidence = job.payload["confidence"]
        await job.step("call_model", lambda: {"label": "enterprise" if confidence > 0.5 else "spam?",
                                              "confidence": confidence})
        job.record(model="small-classifier-2", prompt_version="v7", tokens_in=412, tokens_out=9,
                   cost_usd=0.00031, confidence=confidence)
        if confidence < 0.6:
            raise joblane.Hold(f"confidence {confidence:.2f} below 0.60",
                               {"label": "enterprise" if confidence > 0.5 else "spam?", "confidence": confidence})
        return {"label": "enterprise", "confidence": confidence}

    @app.task("enrich_company", queue="leads", max_attempts=1)
    async def enrich_company(job: joblane.Job) -> None:
        job.record(model="web-search", latency_ms=8123)
        raise joblane.PermanentError("enrichment API answered 422: domain 'example.invalid' does not resolve")

    @app.task("extract_invoice", queue="documents")
    async def extract_invoice(job: joblane.Job) -> dict:
        return {"total": 1280.0}

    return app


def fill(app: joblane.App) -> None:
    with app.connect() as conn:
        for name, message, confidence in LEADS:
            app.enqueue(conn, "classify_lead", {"company": name, "message": message, "confidence": confidence})
        app.enqueue(conn, "enrich_company", {"domain": "example.invalid"})
        app.enqueue(conn, "classify_lead", {"company": "Hooli", "message": "Manual check requested"}, held=True)
    asyncio.run(drain(app))
    jobs = f"{quote_ident(app.schema)}.jobs"
    outbox = f"{quote_ident(app.schema)}.outbox"
    with app.connect() as conn:
        # an hour of history: a steady stream with a burst of failures 20 minutes ago
        conn.execute(
            f"INSERT INTO {jobs} (queue, kind, payload, state, attempts, last_error, created_at, finished_at)"
            " SELECT q, k, '{}', s, 1, CASE WHEN s = 'failed' THEN 'RetryAfter budget spent: 429 from the model API' END,"
            "        f - interval '2 seconds', f"
            " FROM (SELECT CASE WHEN i % 3 = 0 THEN 'documents' ELSE 'leads' END AS q,"
            "              CASE WHEN i % 3 = 0 THEN 'extract_invoice' ELSE 'classify_lead' END AS k,"
            "              CASE WHEN (i % 97 = 0) OR (i % 11 = 0 AND (i / 40) % 60 BETWEEN 18 AND 21) THEN 'failed'"
            "                   ELSE 'done' END AS s,"
            "              now() - make_interval(secs => (i * 1.5 + 20 * sin(i / 50.0))::float8) AS f"
            "         FROM generate_series(1, 2350) AS i) AS t")
        conn.execute(
            f"INSERT INTO {jobs} (queue, kind, payload, run_after, created_at)"
            " SELECT 'documents', 'extract_invoice', jsonb_build_object('file', 'invoice-' || i || '.pdf'),"
            "        now() - interval '95 seconds', now() - interval '95 seconds'"
            " FROM generate_series(1, 180) AS i")
        conn.execute(
            f"INSERT INTO {jobs} (queue, kind, payload, state, attempts, worker, lease_until)"
            " SELECT CASE WHEN i <= 4 THEN 'documents' ELSE 'leads' END,"
            "        CASE WHEN i <= 4 THEN 'extract_invoice' ELSE 'classify_lead' END, '{}', 'running', 1,"
            "        CASE WHEN i % 2 = 0 THEN 'worker-a:4121:1f3c9e' ELSE 'worker-b:5307:8d20aa' END,"
            "        now() + make_interval(secs => 20 + i)"
            " FROM generate_series(1, 7) AS i")
        conn.execute(
            f"INSERT INTO {outbox} (topic, key, payload, state, attempts, last_error, created_at, sent_at)"
            " SELECT CASE WHEN i % 4 = 0 THEN 'billing.invoice_parsed' ELSE 'crm.lead_created' END, 'lead-' || i,"
            "        jsonb_build_object('lead', i),"
            "        CASE WHEN i <= 3 THEN 'failed' WHEN i <= 12 THEN 'pending' ELSE 'sent' END,"
            "        CASE WHEN i <= 3 THEN 25 WHEN i <= 5 THEN 4 WHEN i <= 12 THEN 0 ELSE 1 END,"
            "        CASE WHEN i <= 3 THEN 'HTTP 400 from https://crm.example/api/leads: field \"email\" is required'"
            "             WHEN i <= 5 THEN 'HTTP 503 from https://crm.example/api/leads: upstream unavailable' END,"
            "        now() - make_interval(secs => i * 7), CASE WHEN i > 12 THEN now() - make_interval(secs => i) END"
            " FROM generate_series(1, 400) AS i")
        # one try per finished job of that hour, for the history page
        attempts = f"{quote_ident(app.schema)}.attempts"
        conn.execute(
            f"INSERT INTO {attempts} (job_id, attempt, outcome, error, started_at, finished_at)"
            f" SELECT id, 1, state, last_error, created_at + interval '300 milliseconds', finished_at FROM {jobs}"
            "  WHERE state IN ('done', 'failed') AND finished_at > now() - interval '2 hours'"
            f"    AND NOT EXISTS (SELECT 1 FROM {attempts} AS a WHERE a.job_id = id)")
        conn.execute(f"ANALYZE {jobs}")
        # two workers and a relay registered, a rate limit on leads, documents paused
        for name, role, queues, concurrency in (("worker-a:4121:1f3c9e", "worker", ["leads", "documents"], 16),
                                                ("worker-b:5307:8d20aa", "worker", ["leads", "documents"], 16),
                                                ("relay-1:6120:0b7e41", "relay", [], None)):
            host, pid, _ = name.split(":")
            stmt = app.store.register_process(name, role, host, int(pid), joblane.__version__, queues,
                                              ["classify_lead", "enrich_company", "extract_invoice"] if queues else [],
                                              concurrency, 30.0)
            store.fetch(conn, stmt)
        app.save_limit(conn, "leads", per_minute=600, concurrency=8)
        app.pause_queue(conn, "documents", 900, "invoice OCR provider maintenance until 14:00")


def main() -> None:
    dsn = database_url()
    OUT.mkdir(parents=True, exist_ok=True)
    with isolated_schema(dsn, new_schema_name("screens")) as schema:
        app = sample_app(dsn, schema)
        fill(app)
        held = [j["id"] for j in app.held_jobs()]
        with LiveServer(create_app(app, refresh_seconds=0)) as server, chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            shots = {"overview.png": "/?refresh=0", "review.png": "/review", "job.png": f"/jobs/{held[1]}",
                     "jobs-failed.png": "/jobs?state=failed", "queues.png": "/queues", "workers.png": "/workers",
                     "jobs-search.png": "/jobs?state=failed&error=429",
                     "bulk-retry.png": "/jobs/bulk?action=retry&state=failed&error=429",
                     "outbox.png": "/outbox", "history.png": "/history?window=1h"}
            for name, path in shots.items():
                page.goto(server.url + path)
                page.screenshot(path=str(OUT / name), full_page=not name.startswith("jobs-"))
                print(f"wrote {OUT / name}")
    print(json.dumps({"schema": schema, "pages": list(shots)}))


if __name__ == "__main__":
    main()
