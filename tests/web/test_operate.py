"""The operator's pages: workers, queues you can steer, jobs search with actions on every match, the outbox."""

from __future__ import annotations

import datetime as dt
import re

from starlette.testclient import TestClient

from joblane.web import create_app

from ..conftest import table
from ..helpers import run_sql
from .conftest import LOCAL, csrf_of
from .test_routes import XSS, add_job, job_state


def register(conn, app, name, role="worker", queues=("leads",), concurrency=4, lease=30.0):
    host, pid, _ = name.split(":")
    stmt = app.store.register_process(name, role, host, int(pid), "9.9.9", list(queues), ["classify"], concurrency,
                                      lease)
    run_sql(conn, stmt.sql, stmt.args)


def flash(client) -> str:
    m = re.search(r'<p class="flash (ok|error)" role="status">(.*?)</p>', client.get("/").text, re.S)
    return f"{m.group(1)}: {m.group(2)}" if m else ""


def test_workers_page_lists_live_workers_and_relays_and_drops_dead_ones(app, conn, client):
    register(conn, app, "box-1:101:aa", queues=("leads", "mail"), concurrency=8)
    register(conn, app, "box-2:202:bb", role="relay", queues=(), concurrency=None)
    register(conn, app, "gone:303:cc")
    conn.execute(f"UPDATE {table(app, 'processes')} SET lease_until = now() - interval '1 second'"
                 " WHERE name = 'gone:303:cc'")
    add_job(conn, app, state="running", worker="box-1:101:aa")
    html = client.get("/workers").text
    rows = dict(re.findall(r'<tr data-process="([^"]+)" data-role="(\w+)"', html))
    assert rows == {"box-1:101:aa": "worker", "box-2:202:bb": "relay"}  # the expired registration is gone
    box1 = re.search(r'data-process="box-1:101:aa".*?</tr>', html, re.S).group(0)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", box1, re.S)]
    assert cells[:7] == ["box-1:101:aa", "worker", "box-1", "101", "9.9.9", "leads, mail", "1/8"]
    assert re.search(r"\d+s ago", cells[8])
    assert 'href="/workers"' in html


def test_workers_page_says_which_jobs_keep_a_stopping_worker_alive(app, conn, client):
    register(conn, app, "box-1:101:aa")
    add_job(conn, app, state="running", worker="box-1:101:aa")
    stopping = ('{"since": %f, "jobs": [{"id": 41, "kind": "ocr", "running": 95.0, "told": 12.0}]}'
                % (dt.datetime.now(dt.timezone.utc).timestamp() - 40))
    stmt = app.store.heartbeat_process("box-1:101:aa", 1, 30.0, stopping)
    run_sql(conn, stmt.sql, stmt.args)
    html = client.get("/workers").text
    box1 = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", re.search(r'data-process="box-1:101:aa".*?</tr>', html,
                                                                re.S).group(0)))
    assert re.search(r"stopping 4\ds", box1), box1
    assert "#41 ocr running 1m 35s, told to stop 12s ago" in box1, box1


def test_queues_page_shows_depth_age_running_and_recent_failures(app, conn, client):
    for _ in range(3):
        add_job(conn, app, queue="leads")
    add_job(conn, app, queue="leads", state="running")
    add_job(conn, app, queue="leads", state="failed", finished_ago=120)
    add_job(conn, app, queue="leads", state="failed", finished_ago=7200)  # failed, but not in the last hour
    add_job(conn, app, queue="mail", state="held")
    html = client.get("/queues").text
    leads = re.search(r'<tr data-queue="leads".*?</tr>', html, re.S).group(0)
    nums = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r'<td class="num[^"]*">(.*?)</td>', leads, re.S)]
    assert nums[0] == "3" and re.fullmatch(r"\d+s|0s|-", nums[1]) and nums[2:] == ["1", "0", "1"]
    assert 'data-queue="mail"' in html


def test_pause_resume_and_limits_from_the_dashboard(app, conn, client):
    add_job(conn, app, queue="models")
    token = csrf_of(client, "/queues")
    assert client.post("/queues/pause", data={"queue": "models", "for": "10m"}).status_code == 403  # no CSRF
    r = client.post("/queues/pause", data={"queue": "models", "for": "10m", "reason": "provider down",
                                            "csrf": token})
    assert r.status_code == 303 and flash(client) == "ok: paused models for 10m 0s"
    row = conn.execute(f"SELECT reason, until > now() + interval '9 minutes' FROM {table(app, 'queue_pauses')}"
                       " WHERE queue = 'models'").fetchone()
    assert row == ("provider down", True)
    html = client.get("/queues").text
    assert re.search(r'<tr data-queue="models" class="paused">.*?paused</span> until .*?provider down', html, re.S)
    client.post("/queues/pause", data={"queue": "models", "for": "soon", "csrf": token})
    assert "use 90s, 5m, 1h or 2d" in flash(client)

    client.post("/queues/resume", data={"queue": "models", "csrf": token})
    assert flash(client) == "ok: resumed models"
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'queue_pauses')} WHERE until > now()").fetchone()[0] == 0

    r = client.post("/queues/limits", data={"queue": "models", "rate": "20/s", "concurrency": "3", "cost": "90000/min",
                                             "estimate": "tokens", "csrf": token})
    assert r.status_code == 303 and "models: 20 starts/s, 3 running, 90000 cost/min (estimate tokens" in flash(client)
    limit = conn.execute(f"SELECT max_starts, starts_interval, concurrency, max_cost, cost_interval, cost_path"
                         f" FROM {table(app, 'queue_limits')} WHERE queue = 'models'").fetchone()
    assert limit == (20, 1.0, 3, 90000.0, 60.0, ["tokens"])
    assert "3 running" in client.get("/queues").text
    client.post("/queues/limits", data={"queue": "models", "concurrency": "lots", "csrf": token})
    assert "concurrency must be a whole number" in flash(client)
    client.post("/queues/unlimit", data={"queue": "models", "csrf": token})
    assert flash(client) == "ok: removed the limits of models"
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'queue_limits')}").fetchone()[0] == 0


def test_jobs_search_by_payload_error_and_kind(app, conn, client):
    acme = add_job(conn, app, state="failed", payload={"tenant": "acme", "usage": {"model": "small-1"}, "n": 3},
                   error="TimeoutError: model API slow")
    other = add_job(conn, app, state="failed", payload={"tenant": "globex", "n": 3}, error="ValueError: bad JSON")
    add_job(conn, app, state="done", kind="mail", payload={"tenant": "acme"})

    def found(query: str) -> set[int]:
        return {int(i) for i in re.findall(r'<tr data-job="(\d+)"', client.get("/jobs?" + query).text)}

    assert found("payload=tenant%3Dacme&kind=classify") == {acme}
    assert found("payload=usage.model%3Dsmall-1") == {acme}
    assert found("payload=n%3D3") == {acme, other}  # 3 is a JSON number
    assert found("payload=" + "%7B%22tenant%22%3A+%22globex%22%7D") == {other}  # {"tenant": "globex"}
    assert found("error=timeouterror") == {acme}  # any case
    assert found("error=bad+json&state=failed") == {other}
    bad = client.get("/jobs?payload=tenant")
    assert bad.status_code == 200 and "payload: use key=value" in bad.text
    assert "not valid JSON" in client.get("/jobs?payload=%7Bnope").text


def test_bulk_actions_show_the_count_then_act_on_every_match(app, conn, client):
    failed = [add_job(conn, app, state="failed", kind="extract", payload={"batch": 7}, error="429 rate limited")
              for _ in range(60)]  # more than one page
    other = add_job(conn, app, state="failed", kind="extract", payload={"batch": 8}, error="429 rate limited")
    page = client.get("/jobs/bulk?action=retry&kind=extract&payload=batch%3D7")
    assert 'data-count="60"' in page.text and "Retry 60 jobs" in page.text
    token = csrf_of(client, "/jobs")
    r = client.post("/jobs/bulk", data={"action": "retry", "kind": "extract", "payload": "batch=7", "csrf": token})
    assert r.status_code == 303 and r.headers["location"].startswith("/jobs?")
    assert flash(client) == "ok: retried 60 of 60 matching jobs"
    assert {job_state(conn, app, i) for i in failed} == {"pending"} and job_state(conn, app, other) == "failed"

    held = [add_job(conn, app, state="held", queue="review", payload={"tenant": "t1"}) for _ in range(3)]
    kept = add_job(conn, app, state="held", queue="review", payload={"tenant": "t2"})
    assert 'data-count="3"' in client.get("/jobs/bulk?action=release&queue=review&payload=tenant%3Dt1").text
    client.post("/jobs/bulk", data={"action": "reject", "queue": "review", "payload": "tenant=t1",
                                    "reason": "wrong tenant", "csrf": token})
    assert flash(client) == "ok: rejected 3 of 3 matching jobs"
    assert {job_state(conn, app, i) for i in held} == {"cancelled"} and job_state(conn, app, kept) == "held"
    client.post("/jobs/bulk", data={"action": "release", "queue": "review", "csrf": token})
    assert job_state(conn, app, kept) == "pending"

    client.post("/jobs/bulk", data={"action": "cancel", "kind": "extract", "error": "429", "csrf": token})
    assert flash(client) == "ok: cancelled 60 of 60 matching jobs"  # the 60 retried (pending) ones
    client.post("/jobs/bulk", data={"action": "replay", "queue": "review", "payload": "tenant=t1", "csrf": token})
    assert flash(client) == "ok: replayed 3 of 3 matching jobs as new jobs"
    copies = conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE replay_of = ANY(%s)", (held,)).fetchone()
    assert copies == (3,)

    # an action on everything needs a search, and a state the action does not take is refused
    client.post("/jobs/bulk", data={"action": "cancel", "csrf": token})
    assert "needs a search" in flash(client)
    assert client.get("/jobs/bulk?action=retry&state=pending").status_code == 400
    assert client.post("/jobs/bulk", data={"action": "retry", "kind": "extract"}).status_code == 403  # no CSRF


def test_outbox_shows_retrying_messages_a_page_per_message_and_discards(app, conn, client):
    box = table(app, "outbox")
    retrying = conn.execute(
        f"INSERT INTO {box} (topic, key, state, attempts, max_attempts, last_error, created_at)"
        " VALUES ('crm.lead', 'lead-9', 'pending', 4, 10, %s, now() - interval '2 minutes') RETURNING id",
        (f"HTTP 503 {XSS}",)).fetchone()[0]
    failed = conn.execute(f"INSERT INTO {box} (topic, state, attempts, last_error, payload)"
                          " VALUES ('crm.lead', 'failed', 10, 'HTTP 500', '{\"lead\": 9}') RETURNING id").fetchone()[0]
    html = client.get("/outbox").text
    row = re.search(r'<tr data-topic="crm.lead">(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r">([^<>]+)</td>", row) == ["1", "1", "1", "0", "2m 0s"]  # the stuck topic shows its retries
    overview = client.get("/").text
    assert re.search(r'crm.lead</a></td><td class="num">1</td><td class="num warn">1</td><td class="num bad">1</td>',
                     overview)  # on the overview too: pending 1, retrying 1, failed 1
    retry_row = re.search(rf'<tr data-message="{retrying}">.*?</tr>', html, re.S).group(0)
    assert "4/10" in retry_row and "HTTP 503 &lt;script&gt;" in retry_row and "<script>alert" not in html

    page = client.get(f"/outbox/{failed}").text
    assert 'id="message-state">failed<' in page and "&#34;lead&#34;: 9" in page
    # no budget of its own: its route's applies (the default, this app routing nothing), as the relay logs it
    assert 'id="tries">10 of 25 <span class="muted small">(the route\'s)</span>' in page
    assert 'formaction="/outbox/retry"' in page
    assert client.get("/outbox/999999").status_code == 404

    token = csrf_of(client, "/outbox")
    r = client.post("/outbox/discard", data={"one": retrying, "next": f"/outbox/{retrying}", "csrf": token})
    assert r.status_code == 303 and r.headers["location"] == "/outbox"
    assert f"discarded 1 message: #{retrying}" in flash(client)
    assert conn.execute(f"SELECT count(*) FROM {box} WHERE id = %s", (retrying,)).fetchone()[0] == 0
    client.post("/outbox/retry", data={"one": failed, "next": f"/outbox/{failed}", "csrf": token})
    assert conn.execute(f"SELECT state FROM {box} WHERE id = %s", (failed,)).fetchone()[0] == "pending"
    sent = conn.execute(f"INSERT INTO {box} (topic, state, sent_at) VALUES ('t', 'sent', now()) RETURNING id").fetchone()[0]
    client.post("/outbox/discard", data={"one": sent, "csrf": token})
    assert "skipped" in flash(client)  # a sent message is history, not discarded


def test_read_only_refuses_every_new_action(app, conn):
    failed = add_job(conn, app, state="failed", error="boom")
    held = add_job(conn, app, state="held", queue="review")
    box = table(app, "outbox")
    message = conn.execute(f"INSERT INTO {box} (topic, state) VALUES ('t', 'failed') RETURNING id").fetchone()[0]
    with TestClient(create_app(app, read_only=True, refresh_seconds=0), base_url=LOCAL) as c:
        for path in ("/queues", "/workers", "/jobs?state=failed", f"/outbox/{message}", "/outbox",
                     "/jobs/bulk?action=retry&state=failed"):
            html = c.get(path).text
            assert 'method="post"' not in html.replace('action="/logout"', ""), path
        token = "read-only refuses before the CSRF check"
        for path, data in (("/queues/pause", {"queue": "review", "for": "1m"}), ("/queues/resume", {"queue": "review"}),
                           ("/queues/limits", {"queue": "review", "concurrency": "2"}),
                           ("/queues/unlimit", {"queue": "review"}),
                           ("/jobs/bulk", {"action": "retry", "state": "failed"}),
                           ("/jobs/bulk", {"action": "release", "queue": "review"}),
                           ("/outbox/discard", {"one": message})):
            r = c.post(path, data={**data, "csrf": token})
            assert r.status_code == 403 and "read-only" in r.text, path
    assert (job_state(conn, app, failed), job_state(conn, app, held)) == ("failed", "held")
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'queue_pauses')}").fetchone()[0] == 0
    assert conn.execute(f"SELECT count(*) FROM {box}").fetchone()[0] == 1


def test_a_token_guards_the_new_pages_and_actions(app, conn):
    secret = "s3cret-token-for-tests-0123456789"
    with TestClient(create_app(app, token=secret, loopback_only=False, refresh_seconds=0), base_url=LOCAL,
                    follow_redirects=False) as c:
        for path in ("/queues", "/workers", "/outbox/1", "/jobs/bulk?action=retry&state=failed"):
            assert c.get(path).status_code == 303, path  # to the sign-in page
        for path in ("/queues/pause", "/jobs/bulk", "/outbox/discard"):
            assert c.post(path, data={"queue": "q", "for": "1m"}).status_code == 401, path
        signed = {"Authorization": f"Bearer {secret}"}
        assert c.get("/queues", headers=signed).status_code == 200
        # a bearer token alone does not make a POST: the CSRF token is still required
        assert c.post("/queues/pause", data={"queue": "q", "for": "1m"}, headers=signed).status_code == 403


def add_attempts(conn, app, *, queue, kind, outcome, n, hours_ago, start_ms=500, finish_ms=2000, attempt=1):
    """``n`` jobs of one try each, finished ``hours_ago``, enqueued ``start_ms`` before the try started."""
    jobs, attempts = table(app, "jobs"), table(app, "attempts")
    conn.execute(
        f"WITH j AS (INSERT INTO {jobs} (queue, kind, state, attempts, created_at, finished_at)"
        f"           SELECT %s, %s, 'done', 1, now() - make_interval(secs => %s * 3600.0) - make_interval(secs => %s / 1000.0),"
        f"                  now() - make_interval(secs => %s * 3600.0)"
        f"             FROM generate_series(1, %s) RETURNING id, created_at)"
        f" INSERT INTO {attempts} (job_id, attempt, outcome, started_at, finished_at)"
        f" SELECT id, %s, %s, created_at + make_interval(secs => %s / 1000.0), created_at + make_interval(secs => %s / 1000.0)"
        f"   FROM j",
        (queue, kind, hours_ago, finish_ms, hours_ago, n, attempt, outcome, start_ms, finish_ms))


def history_rows(client, window):
    html = client.get(f"/history?window={window}").text
    rows = {}
    for q, k, body in re.findall(r'<tr data-queue="([^"]+)" data-kind="([^"]+)">(.*?)</tr>', html, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r'<td class="num[^"]*">(.*?)</td>', body, re.S)]
        rows[(q, k)] = cells[:5]  # done, failed, retries, other, attempts
    return rows, html


async def roll_up(app):
    import asyncpg

    from joblane.maintenance import History

    service = History(app.store, settle=0, max_slices=48)
    conn = await asyncpg.connect(app.dsn)
    try:
        while True:
            await service.run_once(conn)
            if not service.behind:
                return service.total
    finally:
        await conn.close()


async def test_history_rolls_up_nothing_before_the_oldest_attempt(app, conn):
    slices = table(app, "history_slices")
    assert await roll_up(app) == 0  # a new schema: not a week of empty slices
    assert conn.execute(f"SELECT count(*) FROM {slices}").fetchone()[0] == 0
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="done", n=2, hours_ago=5)
    first_hour = conn.execute("SELECT date_trunc('hour', now() - interval '5 hours', 'UTC')").fetchone()[0]
    assert await roll_up(app) >= 3  # the whole hours from the attempt's on (the last two go in five-minute slices)
    starts = [r[0] for r in conn.execute(f"SELECT start FROM {slices} ORDER BY start")]
    assert starts[0] == first_hour
    # every hour from the attempt's to the one before the last, each once
    hours = conn.execute(f"SELECT count(*) FROM {slices} WHERE seconds = 3600").fetchone()[0]
    expected = conn.execute("SELECT extract(epoch FROM date_trunc('hour', now(), 'UTC') - interval '2 hours' - %s)"
                            " / 3600 + 1", (first_hour,)).fetchone()[0]
    assert hours == expected
    # an attempt that lands later in an hour before those (a worker's clock, a late write) is rolled up then
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="done", n=1, hours_ago=30)
    assert await roll_up(app) >= 24
    assert conn.execute(f"SELECT min(start) FROM {slices}").fetchone()[0] == conn.execute(
        "SELECT date_trunc('hour', now() - interval '30 hours', 'UTC')").fetchone()[0]


async def test_history_does_not_call_the_empty_time_before_the_first_attempt_read_from_the_attempts(app, conn, client):
    """A week's window over a schema whose first attempt finished 5 hours ago: the page says when the history
    begins, and reads "the last ..." only for the minutes after the last slice, not the empty days before."""
    def source() -> str:
        html = client.get("/history?window=7d").text
        return re.sub(r"<[^>]+>", "", re.search(r'id="history-source">(.*?)</p>', html, re.S).group(1))

    assert "no attempt finished and nothing was rolled up" in source()
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="done", n=2, hours_ago=5)
    before = source()  # nothing rolled up: the five hours since the first attempt came from the attempts
    assert re.search(r"0 slices rolled up by the workers' history service, the last (4h 59m|5h 0m|5h)\b", before), before
    assert "The history begins" in before and not re.search(r"\d+d ", before.split("The history begins")[0])
    await roll_up(app)
    after = source()
    last = re.search(r"the last ((\d+)m )?(\d+)s read from the attempts", after)
    assert last and int(last.group(2) or 0) < 60, after  # only the minutes since the last slice
    assert "earlier that no slice covers" not in after and "The history begins" in after, after


async def test_history_charts_done_failed_and_latency_per_bucket_queue_and_kind(app, conn, client):
    """The history page draws, per hour (per five minutes for 1h), the attempts done and failed for every queue,
    per queue and per kind, and enqueue-to-start p50/p95 per queue; the same bars from the attempts and from the
    roll-ups."""
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="done", n=5, hours_ago=0.25)
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="failed", n=1, hours_ago=0.25)
    add_attempts(conn, app, queue="mail", kind="send", outcome="done", n=3, hours_ago=3, start_ms=30_000)
    quarter = conn.execute("SELECT now() - interval '15 minutes'").fetchone()[0].astimezone(dt.timezone.utc)
    three = conn.execute("SELECT now() - interval '3 hours'").fetchone()[0].astimezone(dt.timezone.utc)

    def svg(html: str, start: str) -> str:
        at = html.index(start)
        return html[at:html.index("</svg>", at)]

    def check() -> None:
        html = client.get("/history?window=24h").text
        every = svg(html, '<svg class="chart history-chart" id="history-chart"')
        titles = re.findall(r"<title>(.*?)</title>", every)
        assert len(titles) == 24, len(titles)  # one bar per hour of the window
        hour = quarter.strftime("%a %H:00")
        assert f"the hour from {hour} UTC: 5 done, 1 failed" in titles
        assert f"the hour from {three.strftime('%a %H:00')} UTC: 3 done, 0 failed" in titles
        assert sum(1 for t in titles if not t.endswith(": 0 done, 0 failed")) == 2
        assert every.count('class="fail"') == 1
        leads = svg(html, '<svg class="chart history-chart" data-queue="leads"')
        assert f"the hour from {hour} UTC: 5 done, 1 failed" in leads and "3 done" not in leads
        send = svg(html, '<svg class="chart history-chart" data-queue="mail" data-kind="send"')
        assert "3 done, 0 failed" in send
        waits = svg(html, '<svg class="chart latency-chart" data-queue="mail"')
        # 3 first tries started 30 s after enqueue: bucket up to 32.8 s, as the table says
        assert re.search(r"<title>[^<]*: p50 32\.8 s over 3 first tries</title>", waits), waits
        five = client.get("/history?window=1h").text
        bars = re.findall(r"<title>(.*?)</title>", svg(five, 'id="history-chart"'))
        assert len(bars) == 12 and any(t.endswith(": 5 done, 1 failed") for t in bars), bars
        assert all(t.startswith("the 5 min from ") for t in bars)

    check()  # read from the attempts
    await roll_up(app)
    check()  # from the roll-ups


async def test_history_counts_outcomes_and_latency_per_window_rolled_up_or_not(app, conn, client):
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="done", n=5, hours_ago=0.25)
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="failed", n=1, hours_ago=0.25)
    add_attempts(conn, app, queue="leads", kind="enrich", outcome="retry", n=2, hours_ago=3)
    add_attempts(conn, app, queue="leads", kind="classify", outcome="done", n=4, hours_ago=50, start_ms=30_000)
    add_attempts(conn, app, queue="mail", kind="send", outcome="done", n=3, hours_ago=200)  # older than a week

    def check():
        rows, _ = history_rows(client, "1h")
        assert rows == {("leads", "enrich"): ["5", "1", "0", "0", "6"]}
        rows, _ = history_rows(client, "24h")
        assert rows == {("leads", "enrich"): ["5", "1", "2", "0", "8"]}
        rows, html = history_rows(client, "7d")
        assert rows == {("leads", "enrich"): ["5", "1", "2", "0", "8"], ("leads", "classify"): ["4", "0", "0", "0", "4"]}
        latency = re.search(r'id="latency-table".*?<tr data-queue="leads">(.*?)</tr>', html, re.S).group(1)
        cells = [c.strip() for c in re.findall(r'<td class="num">(.*?)</td>', latency)]
        # first tries: 8 started 500 ms after enqueue (bucket up to 512 ms), 4 after 30 s (up to 32.8 s);
        # 10 finished (done or failed) 2 s after enqueue (up to 2.05 s)
        assert cells[0] == "12" and cells[1] == "512 ms" and cells[2] == "32.8 s", cells
        assert cells[3] == "10" and cells[4] == cells[5] == "2.0 s", cells

    check()  # nothing rolled up: every window read from the attempts
    rolled = await roll_up(app)
    assert rolled >= 7 * 24 - 2  # every closed hour of the week, the last ones in five-minute slices, in rounds
    assert await roll_up(app) == 0  # each slice once
    slices = conn.execute(f"SELECT seconds, count(*) FROM {table(app, 'history_slices')} GROUP BY 1").fetchall()
    assert dict(slices)[3600] >= 7 * 24 - 2 and dict(slices).get(300, 0) <= 23  # the last and current hour in 5 min
    check()  # the same figures from the roll-ups and the attempts of the minutes not rolled up
    source = re.search(r'id="history-source">(.*?)</p>', client.get("/history?window=7d").text).group(1)
    assert re.search(r"\d+ slices rolled up by the workers' history service, the last (\d+m )?\d+s read", source)
    # an hour partly rolled up in five-minute slices (a worker that stopped) is completed in slices, then merged
    last_hour = conn.execute("SELECT date_trunc('hour', now(), 'UTC') - interval '2 hours'").fetchone()[0]
    for name in ("history_slices", "history_attempts", "history_latency"):
        conn.execute(f"DELETE FROM {table(app, name)} WHERE start >= %s AND start < %s + interval '1 hour'",
                     (last_hour, last_hour))
    stmt = app.store.history_rollup(last_hour + dt.timedelta(minutes=25), 300)
    run_sql(conn, stmt.sql, stmt.args)
    await roll_up(app)
    assert conn.execute(f"SELECT seconds FROM {table(app, 'history_slices')} WHERE start >= %s AND start < %s"
                        " + interval '1 hour'", (last_hour, last_hour)).fetchall() == [(3600,)]
    check()
    assert client.get("/history?window=1y").status_code == 400


def test_the_overview_is_live_through_a_fragment(app, conn):
    with TestClient(create_app(app, refresh_seconds=3), base_url=LOCAL) as c:
        page = c.get("/").text
        assert '<div id="live" data-refresh="3" data-src="/live/overview">' in page
        assert '<noscript><meta http-equiv="refresh" content="3"></noscript>' in page  # without the script
        assert "connect-src 'self'" in c.get("/").headers["content-security-policy"]
        add_job(conn, app, queue="fresh-q")
        fragment = c.get("/live/overview")
        assert fragment.status_code == 200 and "<html" not in fragment.text and "<nav" not in fragment.text
        assert '<tr>\n        <td><a href="/jobs?queue=fresh-q">fresh-q</a></td>' in fragment.text
        assert 'id="workers"' in fragment.text or "No worker or relay is running" in fragment.text
        assert 'data-refresh="0"' in c.get("/?refresh=0").text


def test_metrics_an_operator_alerts_on(app, conn, client):
    add_job(conn, app, queue="leads")
    add_job(conn, app, queue="leads")
    add_job(conn, app, queue="leads", state="failed", finished_ago=60)
    register(conn, app, "box-1:101:aa")
    register(conn, app, "box-2:202:bb", role="relay", queues=(), concurrency=None)
    box = table(app, "outbox")
    conn.execute(f"INSERT INTO {box} (topic, state, attempts, last_error, created_at)"
                 " VALUES ('crm', 'pending', 3, 'HTTP 503', now() - interval '10 minutes'), ('crm', 'failed', 9, 'x', now())")
    text = client.get("/metrics").text
    assert 'joblane_queue_depth{queue="leads"} 2.0' in text
    assert re.search(r'joblane_oldest_ready_seconds\{queue="leads"\} \d', text)
    assert 'joblane_jobs_failed_last_hour{queue="leads"} 1.0' in text
    assert 'joblane_processes_alive{role="worker"} 1.0' in text and 'joblane_processes_alive{role="relay"} 1.0' in text
    assert 'joblane_outbox_unsent{topic="crm"} 2.0' in text and 'joblane_outbox_retrying{topic="crm"} 1.0' in text
    lag = float(re.search(r'joblane_outbox_lag_seconds\{topic="crm"\} ([\d.e+]+)', text).group(1))
    assert 595 <= lag <= 700  # the oldest unsent row, 10 minutes old


def test_the_grafana_dashboard_uses_metrics_that_exist(app, client):
    import json
    from pathlib import Path

    board = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    used = set(re.findall(r"\b(joblane_[a-z_]+)", " ".join(exprs)))
    text = client.get("/metrics").text
    served = set(re.findall(r"^# HELP (joblane_[a-z_]+)", text, re.M))
    # served by `joblane worker --metrics-port` and `joblane relay --metrics-port`
    worker_side = {"joblane_jobs_total", "joblane_job_duration_seconds_bucket", "joblane_outbox_messages_total",
                   "joblane_jobs_running"}
    assert used and used <= served | worker_side, used - served - worker_side


def test_a_search_no_index_serves_reads_slices_and_links_to_older_jobs(app, conn, client, monkeypatch):
    monkeypatch.setattr("joblane.web.data.SEARCH_SLICE", 10)
    monkeypatch.setattr("joblane.web.data.SEARCH_SLICES", 2)
    rare = add_job(conn, app, payload={"tenant": "rare"})
    for _ in range(45):
        add_job(conn, app, payload={"tenant": "common"})
    html = client.get("/jobs?payload=tenant%3Drare").text
    assert "No jobs match among those searched so far" in html and 'id="searched-to"' in html
    seen, url, pages = [], "/jobs?payload=tenant%3Drare", 0
    while url and pages < 10:
        html = client.get(url).text
        seen += [int(i) for i in re.findall(r'<tr data-job="(\d+)"', html)]
        m = re.search(r'<a href="([^"]+)" id="next-page">', html)
        url = m.group(1).replace("&amp;", "&") if m else None
        pages += 1
    assert seen == [rare] and pages == 3  # 20 ids a page: 46 jobs in three pages, then no older link
    html = client.get("/jobs?payload=tenant%3Dcommon").text
    assert len(re.findall(r'<tr data-job="(\d+)"', html)) == 20 and 'id="next-page"' in html  # a page's 2 slices


def test_a_search_by_an_indexed_state_finds_old_jobs_at_once(app, conn, client, monkeypatch):
    monkeypatch.setattr("joblane.web.data.SEARCH_SLICE", 10)
    monkeypatch.setattr("joblane.web.data.SEARCH_SLICES", 2)
    old = add_job(conn, app, state="held", payload={"tenant": "rare"})
    for _ in range(45):
        add_job(conn, app, state="done", payload={"tenant": "rare"})
    html = client.get("/jobs?state=held&payload=tenant%3Drare").text  # jobs_held bounds it: no slices
    assert [int(i) for i in re.findall(r'<tr data-job="(\d+)"', html)] == [old] and 'id="searched-to"' not in html


def test_outbox_discard_from_the_command_line(app, conn):
    import json

    from click.testing import CliRunner

    from joblane.cli import main

    box = table(app, "outbox")
    stuck = conn.execute(f"INSERT INTO {box} (topic, state, attempts, last_error) VALUES ('t', 'pending', 3, 'HTTP 503')"
                         " RETURNING id").fetchone()[0]
    sent = conn.execute(f"INSERT INTO {box} (topic, state, sent_at) VALUES ('t', 'sent', now()) RETURNING id").fetchone()[0]
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema}
    result = CliRunner().invoke(main, ["outbox", "discard", str(stuck), str(sent), "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"discarded": [stuck], "skipped": {str(sent): "sent"}}
    missing = CliRunner().invoke(main, ["outbox", "discard", "999999"], env=env)
    assert missing.exit_code == 1 and "error: no such message: 999999" in missing.output
    assert conn.execute(f"SELECT id FROM {box}").fetchall() == [(sent,)]
