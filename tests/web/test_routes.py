"""The dashboard's pages, actions and guards, through Starlette's TestClient on a real schema."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from joblane.cli import main
from joblane.web import create_app
from joblane.web.security import bind_problem

from ..conftest import table
from .conftest import LOCAL, csrf_of
from ..helpers import run_sql

XSS = "<script>alert('pwned')</script>"


def add_job(conn, app, *, state="pending", queue="leads", kind="classify", payload=None, error=None,
            worker=None, lease_seconds=30, replay_of=None, finished_ago=None) -> int:
    """Fabricate a job row in a given state (the shape the worker would have left)."""
    running = state == "running"
    finished = state in ("done", "failed", "cancelled")
    return conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (queue, kind, payload, state, attempts, last_error, worker, lease_until,"
        " replay_of, finished_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, CASE WHEN %s THEN now() + make_interval(secs => %s) END, %s,"
        "         CASE WHEN %s THEN now() - make_interval(secs => %s) END) RETURNING id",
        (queue, kind, json.dumps(payload or {}), state, 1 if state != "pending" else 0, error,
         (worker or "host:1:abc") if running else None, running, lease_seconds, replay_of, finished,
         finished_ago or 0),
    ).fetchone()[0]


def job_state(conn, app, job_id) -> str:
    return conn.execute(f"SELECT state FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)).fetchone()[0]


def test_overview_counts_queues_states_workers_and_the_last_hour(app, conn, client):
    for _ in range(3):
        add_job(conn, app, state="pending")
    add_job(conn, app, state="held", queue="review")
    add_job(conn, app, state="failed", error="boom", finished_ago=90)
    add_job(conn, app, state="done", finished_ago=30)
    add_job(conn, app, state="done", finished_ago=95)
    add_job(conn, app, state="running", worker="box-7:4242:beef")
    add_job(conn, app, state="running", worker="ghost:1:dead", lease_seconds=-120)

    page = client.get("/")
    assert page.status_code == 200
    html = page.text
    queues = html[html.index('id="queues"'):html.index("</table>", html.index('id="queues"'))]
    leads = re.search(r"<td><a href=\"/jobs\?queue=leads\">leads</a></td>(.*?)</tr>", queues, re.S).group(1)
    cells = re.findall(r'<td class="num">(.*?)</td>', leads, re.S)
    numbers = [re.sub(r"<[^>]+>", "", c).strip() for c in cells]
    # pending running done failed held cancelled, oldest ready
    assert numbers[:6] == ["3", "2", "2", "1", "0", "0"]
    assert "review" in queues
    # the chart: one bar per minute; the failure 90 s ago sits in the "1 min ago" bar
    svg = html[html.index('<svg class="chart"'):html.index("</svg>")]
    assert svg.count("<title>") == 60
    assert "1 min ago: 2 finished, 1 failed" in svg and "this minute: 1 finished, 0 failed" in svg
    # workers from running jobs' worker/lease_until, the lost one flagged
    workers = html[html.index('id="workers"'):]
    assert "box-7:4242:beef" in workers and "ghost:1:dead" in workers
    assert re.search(r'<tr class="expired">\s*<td><code>ghost:1:dead', workers)
    assert '<meta http-equiv="refresh"' not in html  # refresh_seconds=0 in this client
    app.pause_queue(conn, "leads", 120, "429 from the model API")
    assert re.search(r"Queue <strong>leads</strong> is paused for another 1m \d+s: 429 from the model API",
                     client.get("/").text)


def test_overview_counts_waiting_jobs_per_queue(app, conn, client):
    """Jobs waiting for their parents (after=) and for a signal (WaitFor) fill the waiting column."""
    @app.task("classify", queue="leads")
    async def classify(job):
        return None

    parent = app.enqueue(conn, "classify", {}, delay=3600)
    for _ in range(2):
        app.enqueue(conn, "classify", {}, queue="leads", after=[parent])
    app.enqueue(conn, "classify", {}, queue="review", after=[parent])
    for key in ("batch:a", "batch:b", "batch:c"):
        conn.execute(f"INSERT INTO {table(app, 'jobs')} (queue, kind, state, wait_key) VALUES ('review', 'classify',"
                     " 'waiting', %s)", (key,))
    add_job(conn, app, state="done", queue="review")

    html = client.get("/").text
    queues = html[html.index('id="queues"'):html.index("</table>", html.index('id="queues"'))]
    numbers = {}
    for queue, row in re.findall(r'<td><a href="/jobs\?queue=(\w+)">\w+</a></td>(.*?)</tr>', queues, re.S):
        cells = re.findall(r'<td class="num">(.*?)</td>', row, re.S)
        numbers[queue] = [re.sub(r"<[^>]+>", "", c).strip() for c in cells]
    # pending running done failed held cancelled waiting, oldest ready
    assert numbers["leads"][:7] == ["1", "0", "0", "0", "0", "0", "2"]
    assert numbers["review"][:7] == ["0", "0", "1", "0", "0", "0", "4"]
    assert '<a href="/jobs?queue=review&amp;state=waiting">4</a>' in queues
    tfoot = html[html.index("<tfoot>", html.index('id="queues"')):html.index("</tfoot>", html.index('id="queues"'))]
    assert re.findall(r'<th class="num">([^<]*)</th>', tfoot)[6].strip() == "6"


def test_an_error_from_before_a_job_was_done_or_a_message_sent_is_not_shown_as_current(app, conn, client):
    """A done job keeps the last_error of a hold or a failed try, a sent message that of a failed try: shown as
    earlier (muted), never as the row's error; a message without its own budget shows its route's."""
    from ..review.helpers import run_cli

    done = add_job(conn, app, state="done", error="held: parent job 5 failed; release to run it anyway")
    failing = add_job(conn, app, state="failed", error="boom")
    html = client.get("/jobs").text
    row = re.search(rf'<tr data-job="{done}".*?</tr>', html, re.S).group(0)
    assert 'class="err"' not in row and "earlier: held: parent job 5 failed" in row
    assert re.search(rf'<tr data-job="{failing}".*?<span class="err">boom</span>', html, re.S)
    shown = " ".join(run_cli(app, "jobs", "show", str(done)).stdout.replace("│", " ").split())
    assert "earlier error held: parent job 5 failed" in shown and "last_error" not in shown
    listed = run_cli(app, "jobs").stdout
    assert "(earlier) held: parent job 5" in listed

    box = table(app, "outbox")
    sent = conn.execute(f"INSERT INTO {box} (topic, state, attempts, sent_at, last_error) VALUES ('crm.lead', 'sent',"
                        " 2, now(), 'cannot connect: Connection refused') RETURNING id").fetchone()[0]
    page = client.get(f"/outbox/{sent}").text
    assert re.search(r'<dt>an earlier try</dt><dd class="muted" id="last-error">cannot connect', page)
    assert re.search(r'<dd id="tries">2 of 25 <span class="muted small">\(the route\'s\)</span>', page)
    shown = " ".join(run_cli(app, "outbox", "show", str(sent)).stdout.replace("│", " ").split())
    assert "max_attempts the route's (25 unless app.route(..., max_attempts=N) says otherwise)" in shown
    assert "earlier error cannot connect: Connection refused" in shown and "last_error" not in shown


def test_overview_refreshes_itself(app):
    with TestClient(create_app(app, refresh_seconds=7), base_url=LOCAL) as c:
        assert '<meta http-equiv="refresh" content="7">' in c.get("/").text
        assert 'http-equiv="refresh"' not in c.get("/?refresh=0").text


def test_finished_rows_are_estimated_on_big_tables(app, conn, client, monkeypatch):
    conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (queue, kind, state, finished_at)"
        " SELECT 'bulk', 'k', CASE WHEN i % 10 = 0 THEN 'cancelled' ELSE 'done' END, now()"
        " FROM generate_series(1, 5000) AS i")
    add_job(conn, app, state="pending", queue="bulk")
    conn.execute(f"ANALYZE {table(app, 'jobs')}")
    exact = client.get("/").text
    assert ">4,500<" in exact and ">500<" in exact
    monkeypatch.setattr("joblane.web.data.EXACT_COUNT_BYTES", 0)
    estimated = client.get("/").text
    assert "planner's estimate" in estimated
    done = int(re.search(r"≈&#8239;([\d,]+)</th>", estimated).group(1).replace(",", ""))
    assert 4000 <= done <= 5000  # from pg_class.reltuples x the state's frequency in pg_stats
    assert re.search(r"<td class=\"num\"><a href=\"/jobs\?queue=bulk&amp;state=pending\">1</a></td>", estimated)


def test_jobs_filter_and_keyset_pages(app, conn, client):
    ids = [add_job(conn, app, state="failed" if i % 2 else "done", kind="k", error=f"e{i}", finished_ago=5)
           for i in range(130)]
    add_job(conn, app, state="failed", kind="other")
    failed = sorted((i for n, i in enumerate(ids) if n % 2), reverse=True)
    seen = []
    url = "/jobs?state=failed&kind=k"
    pages = 0
    while url:
        html = client.get(url).text
        rows = [int(x) for x in re.findall(r'<tr data-job="(\d+)" data-state="failed">', html)]
        seen += rows
        pages += 1
        m = re.search(r'<a href="([^"]+)" id="next-page">', html)
        url = m.group(1).replace("&amp;", "&") if m else None
    assert seen == failed and pages == 2  # 65 failed "k" jobs: 50 + 15, newest first, nothing repeated
    assert "state=failed" in client.get("/jobs?state=failed&kind=k").text
    assert client.get("/jobs?state=bogus").status_code == 400
    bad_time = client.get("/jobs?since=yesterday")
    assert bad_time.status_code == 200 and "use a duration like 30m" in bad_time.text
    assert re.findall(r'data-job="(\d+)"', client.get("/jobs?since=1h&kind=other").text) != []


def test_job_page_shows_payload_attempts_and_replay_links(app, conn, client):
    original = add_job(conn, app, state="failed", payload={"text": "hello", "prompt_version": "v1"},
                       error="PermanentError: bad JSON")
    conn.execute(
        f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, worker, started_at, outcome, error, meta)"
        " VALUES (%s, 1, 'w1', now() - interval '2 seconds', 'failed', 'bad JSON', %s)",
        (original, json.dumps({"model": "small-1", "prompt_version": "v1", "tokens_in": 120, "traceback": "Trace..."})))
    replay = add_job(conn, app, state="pending", replay_of=original, payload={"text": "hello", "prompt_version": "v2"})
    conn.execute(f"INSERT INTO {table(app, 'job_steps')} (job_id, name, attempt, result) VALUES (%s, 'extract', 1, %s)",
                 (original, json.dumps({"entities": [XSS]})))
    html = client.get(f"/jobs/{original}").text
    steps = html[html.index('id="steps"'):]
    assert "<td>extract</td><td>1</td>" in steps and "&lt;script&gt;" in steps and "<script>alert" not in html
    assert "&#34;prompt_version&#34;: &#34;v1&#34;" in html
    assert "<dt>model</dt><dd>small-1</dd>" in html and "<dt>tokens_in</dt><dd>120</dd>" in html
    assert "<summary>traceback</summary>" in html
    assert f'<a href="/jobs/{replay}">#{replay}</a>' in html  # replayed as
    assert f'id="replay-of">#{original}</a>' in client.get(f"/jobs/{replay}").text
    assert client.get("/jobs/999999").status_code == 404


def test_retry_and_cancel_need_post_and_a_csrf_token(app, conn, client):
    failed = add_job(conn, app, state="failed", error="boom")
    pending = [add_job(conn, app, state="pending") for _ in range(3)]
    assert client.get("/jobs/retry").status_code == 405
    refused = client.post("/jobs/retry", data={"one": failed})
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert client.post("/jobs/retry", data={"one": failed, "csrf": "0" * 64}).status_code == 403
    token = csrf_of(client)
    # a page elsewhere cannot post here, even with a token it somehow holds
    foreign = client.post("/jobs/retry", data={"one": failed, "csrf": token}, headers={"origin": "http://evil.example"})
    assert foreign.status_code == 403
    assert job_state(conn, app, failed) == "failed"

    done = client.post("/jobs/retry", data={"one": failed, "csrf": token, "next": "/jobs?state=failed"})
    assert done.status_code == 303 and done.headers["location"] == "/jobs?state=failed"
    assert job_state(conn, app, failed) == "pending"
    assert f"retried 1 job: #{failed}" in client.get("/jobs").text  # the message after the redirect

    many = client.post("/jobs/cancel", data={"ids": [*pending, failed + 1000], "csrf": token})
    assert many.status_code == 303
    assert [job_state(conn, app, i) for i in pending] == ["cancelled"] * 3
    assert "skipped" in client.get("/jobs").text
    # the redirect target never leaves the site
    away = client.post("/jobs/retry", data={"one": failed, "csrf": token, "next": "//evil.example/x"})
    assert away.headers["location"] == "/"


def test_database_text_is_escaped_everywhere(app, conn, client):
    job = add_job(conn, app, state="failed", kind=XSS, queue="leads", payload={"note": XSS}, error=XSS)
    held = add_job(conn, app, state="held", payload={"note": XSS}, error=XSS)
    for path in ("/", "/jobs", f"/jobs/{job}", f"/jobs/{held}", "/review", f"/jobs?kind={XSS}"):
        html = client.get(path).text
        assert "<script>alert" not in html, path
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in client.get(f"/jobs/{job}").text
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"


def test_read_only_hides_and_refuses_actions(app, conn):
    failed = add_job(conn, app, state="failed", error="boom")
    held = add_job(conn, app, state="held")
    with TestClient(create_app(app, read_only=True, refresh_seconds=0), base_url=LOCAL) as c:
        for path in ("/jobs", f"/jobs/{failed}", f"/jobs/{held}", "/review", "/outbox", "/replay"):
            html = c.get(path).text
            assert "method=\"post\" action=\"/jobs" not in html and "formaction=" not in html, path
            assert "/outbox/retry" not in html, path
            assert 'action="/review/' not in html, path
        assert "read-only" in c.get("/").text
        token = "no form, no token: read-only refuses before the CSRF check"
        for path, data in (("/jobs/retry", {"one": failed}), ("/jobs/cancel", {"one": held}),
                           ("/review/release", {"one": held}), ("/review/reject", {"one": held}),
                           ("/replay", {"ids": str(failed)}), ("/outbox/retry", {"ids": "1"})):
            r = c.post(path, data={**data, "csrf": token})
            assert r.status_code == 403 and "read-only" in r.text, path
    assert (job_state(conn, app, failed), job_state(conn, app, held)) == ("failed", "held")


def test_only_loopback_host_names_are_answered(client):
    assert client.get("/", headers={"host": "127.0.0.1:8787"}).status_code == 200
    assert client.get("/", headers={"host": "localhost"}).status_code == 200
    assert client.get("/", headers={"host": "[::1]:8787"}).status_code == 200
    rebound = client.get("/", headers={"host": "attacker.example"})
    assert rebound.status_code == 421


def test_a_token_guards_every_page(app):
    token = "s3cret-token-for-tests-only"
    web = create_app(app, token=token, loopback_only=False, refresh_seconds=0)
    with TestClient(web, base_url="http://dash.internal", follow_redirects=False) as c:
        first = c.get("/jobs")
        assert first.status_code == 303 and first.headers["location"].startswith("/login")
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"authorization": f"Bearer {token}"}).status_code == 200
        assert c.get("/static/joblane.css").status_code == 200
        login = c.get("/login").text
        assert "<nav>" not in login, "signed-out visitors see no navigation"
        assert '<label for="token">Dashboard token</label>' in login
        form = csrf_of(c, "/login")
        wrong = c.post("/login", data={"token": "nope", "csrf": form, "next": "/jobs"})
        assert wrong.status_code == 401 and "auth" not in "".join(c.cookies.keys())
        ok = c.post("/login", data={"token": token, "csrf": form, "next": "/jobs"})
        assert ok.status_code == 303 and ok.headers["location"] == "/jobs"
        assert token not in ok.headers["set-cookie"]  # the cookie holds a MAC, not the token
        jobs = c.get("/jobs")
        assert jobs.status_code == 200 and "<nav>" in jobs.text and "Prometheus metrics</a>" in jobs.text


def test_binding_beyond_loopback_requires_a_token():
    assert bind_problem("127.0.0.1", None) is None
    assert bind_problem("::1", None) is None
    assert bind_problem("localhost", None) is None
    assert "JOBLANE_DASHBOARD_TOKEN" in bind_problem("0.0.0.0", None)
    assert bind_problem("0.0.0.0", "x" * 32) is None
    assert "at least 16" in bind_problem("0.0.0.0", "short")
    result = CliRunner().invoke(main, ["dashboard", "--host", "0.0.0.0"], env={"JOBLANE_DASHBOARD_TOKEN": ""})
    assert result.exit_code == 1
    assert "set JOBLANE_DASHBOARD_TOKEN" in result.output and len(result.output.strip().splitlines()) == 1


def test_metrics_in_prometheus_format(app, conn, client):
    add_job(conn, app, state="pending", queue="leads")
    add_job(conn, app, state="pending", queue="leads")
    add_job(conn, app, state="failed", queue="leads", error="x")
    conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome) VALUES (1, 1, 'retry')")
    conn.execute(f"INSERT INTO {table(app, 'outbox')} (topic, state) VALUES ('crm.lead', 'pending')")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'joblane_jobs{queue="leads",state="pending"} 2.0' in text
    assert 'joblane_jobs{queue="leads",state="failed"} 1.0' in text
    assert 'joblane_attempts_last_minute{outcome="retry"} 1.0' in text
    assert 'joblane_outbox_messages{state="pending",topic="crm.lead"} 1.0' in text
    assert "joblane_outbox_lag_seconds" in text


def test_outbox_page_counts_topics_and_lists_failures(app, conn, client):
    box = table(app, "outbox")
    conn.execute(f"INSERT INTO {box} (topic, state, created_at) VALUES ('crm.lead', 'pending', now() - interval '90 seconds')")
    conn.execute(f"INSERT INTO {box} (topic, state, sent_at) VALUES ('crm.lead', 'sent', now())")
    conn.execute(f"INSERT INTO {box} (topic, key, state, attempts, last_error) VALUES ('crm.lead', 'lead-7', 'failed', 25, %s)",
                 (f"HTTP 400 {XSS}",))
    html = client.get("/outbox").text
    row = re.search(r'<tr data-topic="crm.lead"><td><a href="/outbox\?topic=crm.lead">crm.lead</a></td>(.*?)</tr>',
                    html, re.S).group(1)
    # pending, retrying, failed, sent in the last hour, oldest unsent
    assert re.findall(r">([^<>]+)</td>", row) == ["1", "0", "1", "1", "1m 30s"]
    assert "lead-7" in html and "HTTP 400 &lt;script&gt;" in html and "<script>alert" not in html


def test_overview_queries_read_indexes_not_the_table(app, conn):
    """The overview's hot queries must not scan the jobs table, however much history it holds."""
    jobs = table(app, "jobs")
    conn.execute(
        f"INSERT INTO {jobs} (queue, kind, state, finished_at, attempts)"
        " SELECT 'q' || (i % 4), 'k', CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'done' END, now() - (i % 7200) * interval '1 second', 1"
        " FROM generate_series(1, 60000) AS i")
    conn.execute(f"INSERT INTO {jobs} (queue, kind, state) SELECT 'q' || (i % 4), 'k', 'pending' FROM generate_series(1, 300) i")
    conn.execute(f"INSERT INTO {jobs} (queue, kind, state) SELECT 'q1', 'k', 'held' FROM generate_series(1, 20) i")
    conn.execute(f"INSERT INTO {jobs} (queue, kind, state, worker, lease_until, attempts)"
                 " SELECT 'q2', 'k', 'running', 'w' || (i % 3), now() + interval '30 seconds', 1 FROM generate_series(1, 12) i")
    conn.execute(f"INSERT INTO {jobs} (queue, kind, state, wait_key) SELECT 'q3', 'k', 'waiting', 'key-' || i"
                 " FROM generate_series(1, 15) i")
    conn.execute(f"INSERT INTO {jobs} (queue, kind, state, parents_left) SELECT 'q3', 'k', 'waiting', 1"
                 " FROM generate_series(1, 15) i")
    conn.execute(f"INSERT INTO {table(app, 'job_deps')} (parent_id, child_id)"
                 f" SELECT 1, id FROM {jobs} WHERE state = 'waiting' AND wait_key IS NULL")
    conn.execute(f"VACUUM ANALYZE {jobs}")
    q = app.queries
    for name, args in (("dashboard_queue_counts", []), ("dashboard_throughput", [60]), ("dashboard_workers", [8]),
                       ("dashboard_held_jobs", [None, None, None, 51]), ("dashboard_table_estimate", [app.schema]),
                       ("dashboard_search_jobs", [["failed"], None, None, None, None, None, None, None, 51, None]),
                       ("dashboard_search_jobs", [["held"], None, None, None, None, None, None, None, 51, None]),
                       ("dashboard_failed_recent", [3600.0])):
        # bound parameters on an unnamed statement: planned with their values, as the dashboard runs it
        plan = "\n".join(r[0] for r in run_sql(conn, "EXPLAIN " + getattr(q, name), args))
        assert not re.search(r"Seq Scan on jobs", plan), f"{name} scans the table:\n{plan}"


@pytest.mark.parametrize("path", ["/static/joblane.css", "/static/joblane.js", "/static/favicon.svg"])
def test_assets_are_served_locally(client, path):
    assert client.get(path).status_code == 200
    html = client.get("/").text
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


async def test_review_queue_approves_and_rejects_in_one_click(app, conn, client):
    from joblane.testing import drain

    import joblane

    @app.task("classify")
    async def classify(job: joblane.Job):
        if not job.payload.get("approved"):
            job.record(model="small-1", confidence=0.41)
            raise joblane.Hold("confidence 0.41 below 0.6", {"label": "maybe"})
        return {"label": "hot"}

    first = app.enqueue(conn, "classify", {"lead": 1})
    second = app.enqueue(conn, "classify", {"lead": 2})
    third = app.enqueue(conn, "classify", {"lead": 3}, held=True)  # enqueued held: held since creation
    await drain(app)
    html = client.get("/review").text
    order = [int(i) for i in re.findall(r'<li class="held" data-job="(\d+)">', html)]
    assert order == [third, first, second]  # longest held first
    assert "confidence 0.41 below 0.6" in html and "&#34;label&#34;: &#34;maybe&#34;" in html
    assert "<dt>model</dt><dd>small-1</dd>" in html

    token = csrf_of(client, "/review")
    approved = client.post("/review/release", data={"one": first, "csrf": token, "next": "/review"})
    assert approved.status_code == 303 and job_state(conn, app, first) == "pending"
    rejected = client.post("/review/reject", data={"one": second, "csrf": token, "next": "/review"})
    assert rejected.status_code == 303 and job_state(conn, app, second) == "cancelled"
    again = client.post("/review/release", data={"one": second, "csrf": token, "next": "/review"})
    assert again.status_code == 303
    assert "not held" in client.get("/review").text  # told why, nothing changed
    assert job_state(conn, app, second) == "cancelled"
    # approve with an edited payload, from the job's page
    patched = client.post("/review/release", data={"one": third, "csrf": token, "next": f"/jobs/{third}",
                                                   "payload_patch": '{"approved": true}'})
    assert patched.status_code == 303
    await drain(app)
    assert job_state(conn, app, third) == "done" and job_state(conn, app, first) == "held"
    outcomes = [r[0] for r in conn.execute(
        f"SELECT outcome FROM {table(app, 'attempts')} WHERE job_id = %s ORDER BY id", (second,)).fetchall()]
    assert outcomes == ["held", "rejected"]
    bad = client.post("/review/release", data={"one": first, "csrf": token, "payload_patch": "[1, 2"})
    assert bad.status_code == 303 and "not valid JSON" in client.get("/review").text


def test_replay_previews_then_inserts_copies(app, conn, client):
    a = add_job(conn, app, state="failed", kind="summarise", payload={"doc": 1, "prompt_version": "v1"}, error="x")
    b = add_job(conn, app, state="failed", kind="summarise", payload={"doc": 2, "prompt_version": "v1"}, error="x")
    add_job(conn, app, state="done", kind="summarise", payload={"doc": 3})
    token = csrf_of(client, "/replay")
    form = {"kind": "summarise", "state": "failed", "patch": '{"prompt_version": "v2"}', "csrf": token}
    preview = client.post("/replay/preview", data=form)
    assert preview.status_code == 200 and "Dry run: 2 jobs would be replayed" in preview.text
    assert "&#34;prompt_version&#34;: &#34;v2&#34;" in preview.text
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE replay_of IS NOT NULL").fetchone()[0] == 0
    done = client.post("/replay", data=form)
    assert done.status_code == 303
    copies = conn.execute(f"SELECT replay_of, payload FROM {table(app, 'jobs')} WHERE replay_of IS NOT NULL"
                          " ORDER BY replay_of").fetchall()
    assert copies == [(a, {"doc": 1, "prompt_version": "v2"}), (b, {"doc": 2, "prompt_version": "v2"})]
    assert job_state(conn, app, a) == "failed"  # the originals are never edited
    assert "replayed 2 jobs" in client.get("/jobs").text
    no_filter = client.post("/replay", data={"csrf": token, "state": ""})
    assert no_filter.status_code == 303 and "needs a filter" in client.get(no_filter.headers["location"]).text


def test_outbox_retry_requeues_failed_messages(app, conn, client):
    box = table(app, "outbox")
    failed = conn.execute(f"INSERT INTO {box} (topic, state, attempts, last_error) VALUES ('crm.lead', 'failed', 3, 'HTTP 500')"
                          " RETURNING id").fetchone()[0]
    token = csrf_of(client, "/outbox")
    r = client.post("/outbox/retry", data={"ids": failed, "csrf": token})
    assert r.status_code == 303
    assert conn.execute(f"SELECT state FROM {box} WHERE id = %s", (failed,)).fetchone()[0] == "pending"
    assert f"re-queued 1 message: #{failed}" in client.get("/outbox").text


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_the_cli_and_the_dashboard_read_the_same_time_text_the_same_way(app, conn, client, monkeypatch, zone):
    import time

    # a naive ISO time is UTC for both, whatever the local zone of the process reading it
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        for hour in (9, 11, 13):
            job = add_job(conn, app, state="failed", kind="summarise", error="x")
            conn.execute(f"UPDATE {table(app, 'jobs')} SET finished_at = %s::timestamptz WHERE id = %s",
                         (f"2026-01-15 {hour:02d}:00:00+00", job))
        for text, expected in (("2026-01-15T10:00", 2), ("2026-01-15T12:30:00", 1), ("2026-01-15T10:00+02:00", 3),
                               ("2026-01-15 08:59", 3)):
            result = CliRunner().invoke(main, ["replay", "--kind", "summarise", "--state", "failed", "--since", text,
                                               "--dry-run", "--json"],
                                        env={"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema})
            assert result.exit_code == 0, result.output
            assert len(json.loads(result.stdout)["jobs"]) == expected, text
            token = csrf_of(client, "/replay")
            page = client.post("/replay/preview", data={"kind": "summarise", "state": "failed", "since": text,
                                                        "csrf": token}).text
            assert f"Dry run: {expected} job" in page, (text, page[:2000])
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


async def test_a_held_jobs_page_labels_the_reviewer_data_and_the_hold_is_no_error(app, conn, client):
    from joblane.testing import drain

    import joblane

    @app.task("classify")
    async def classify(job: joblane.Job):
        if not job.payload.get("approved"):
            raise joblane.Hold("low confidence", {"label": "maybe"})
        return {"label": "hot"}

    job_id = app.enqueue(conn, "classify", {"lead": 1})
    await drain(app)
    held = client.get(f"/jobs/{job_id}").text
    assert "<h3>Data for the reviewer</h3>" in held and "<h3>Result</h3>" not in held
    assert "<th>held because</th><td>low confidence</td>" in held
    assert 'class="err">Hold: low confidence' not in held
    app.release(conn, job_id, {"approved": True})
    await drain(app)
    done = client.get(f"/jobs/{job_id}").text
    assert "<h3>Result</h3>" in done and "Data for the reviewer" not in done
    assert 'class="err"' not in done.split('<table class="kv">')[1].split("</table>")[0]
    assert "<th>was held because</th><td>low confidence</td>" in done


def test_idle_registered_workers_show_on_the_overview(app, conn, client):
    store_sql = app.store.register_process("idle-host:77:cafe", "worker", "idle-host", 77, "1.2.3", ["leads"],
                                           ["classify"], 4, 30.0)
    run_sql(conn, store_sql.sql, store_sql.args)
    relay = app.store.register_process("relay-host:78:f00d", "relay", "relay-host", 78, "1.2.3", [], [], None, 30.0)
    run_sql(conn, relay.sql, relay.args)
    html = client.get("/").text
    workers = html[html.index('id="workers"'):]
    assert "idle-host:77:cafe" in workers and "relay-host:78:f00d" in workers
    assert re.search(r"idle-host:77:cafe</code>.*?</td>\s*<td class=\"num\">0/4</td>", workers, re.S)
    assert "idle" in workers and "No worker or relay is running" not in html
