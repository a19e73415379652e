"""End to end in headless Chromium: the dashboard served by uvicorn, a real `joblane worker` process, real clicks."""

from __future__ import annotations

import re
import socket
import time
import uuid

import pytest

import joblane
from joblane.testing import isolated_schema
from joblane.web import create_app

from ..conftest import WorkerProcess
from . import tasks
from .browser import LiveServer, chromium

TASKS = "tests.web.tasks:app"


@pytest.fixture(scope="module")
def browser():
    try:
        with chromium() as b:
            yield b
    except RuntimeError as exc:
        pytest.skip(f"no headless browser: {exc}")


@pytest.fixture(scope="module")
def site(joblane_dsn):
    """One schema, one dashboard and one worker process for the whole module (each test uses its own jobs)."""
    with isolated_schema(joblane_dsn) as schema:
        app = tasks.register(joblane.App(joblane_dsn, schema=schema))
        worker = WorkerProcess(TASKS, schema, "--poll-interval", "0.2", "--concurrency", "4")
        try:
            with LiveServer(create_app(app, refresh_seconds=2)) as server:
                yield app, server.url
        finally:
            worker.stop()


@pytest.fixture
def page(browser, site):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    dialogs: list[str] = []
    p.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    p.dialogs = dialogs
    yield p
    context.close()


def wait_for_state(page, url: str, job_id: int, state: str, timeout: float = 20.0) -> None:
    """Reload the job's page until its state badge reads ``state``, as a person pressing F5 would."""
    deadline = time.monotonic() + timeout
    badge = page.locator("h1 .state")
    while True:
        page.goto(f"{url}/jobs/{job_id}")
        if badge.inner_text() == state:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {badge.inner_text()!r} after {timeout}s, expected {state!r}")
        time.sleep(0.2)


def test_overview_shows_queues_chart_and_refreshes(site, page):
    app, url = site
    with app.connect() as conn:
        app.enqueue(conn, "classify", {"n": 1}, queue="overview-q", delay=3600)
    page.goto(url + "/")
    assert page.title() == "Overview · joblane"
    row = page.locator("#queues tbody tr", has_text="overview-q")
    assert row.count() == 1
    assert page.locator("svg#throughput g").count() == 60
    assert page.locator("#live").get_attribute("data-refresh") == "2"
    page.evaluate("window.__same_page = true")
    # the live block refreshes itself in place (a fragment, not a reload) and picks up new work
    with app.connect() as conn:
        app.enqueue(conn, "classify", {"n": 2}, queue="overview-q", delay=3600)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#queues tbody tr')]"
        ".some(r => r.textContent.includes('overview-q') && r.querySelectorAll('td')[1].textContent.trim() === '2')",
        timeout=10_000)
    assert page.evaluate("window.__same_page") is True  # no reload: the page kept its state
    assert "updated" in page.locator("#updated").inner_text()


def test_overview_counts_jobs_waiting_for_their_parents(site, page):
    app, url = site
    with app.connect() as conn:
        parent = app.enqueue(conn, "classify", {"n": 0}, queue="waiting-q", delay=3600)
        for n in range(3):
            app.enqueue(conn, "classify", {"n": n}, queue="waiting-q", after=[parent])
    page.goto(url + "/")
    cells = page.locator("#queues tbody tr", has_text="waiting-q").locator("td")
    header = [h.strip() for h in page.locator("#queues thead th").all_inner_texts()]
    assert cells.nth(header.index("waiting")).inner_text().strip() == "3"
    assert cells.nth(header.index("pending")).inner_text().strip() == "1"
    cells.nth(header.index("waiting")).locator("a").click()
    page.wait_for_url(re.compile(r"state=waiting"))
    assert page.locator("tr[data-job]").count() == 3


def test_filter_failed_jobs_retry_one_and_see_it_run(site, page):
    app, url = site
    with app.connect() as conn:
        job_id = app.enqueue(conn, "classify", {"fail_first": True, "lead": "acme"})
    wait_for_state(page, url, job_id, "failed")
    page.goto(url + "/jobs")
    page.select_option("#filters select[name=state]", "failed")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs\?state=failed"))
    row = page.locator(f'tr[data-job="{job_id}"]')
    assert row.get_attribute("data-state") == "failed"
    assert "malformed JSON" in row.inner_text()
    assert page.locator("tr[data-job]:not([data-state=failed])").count() == 0
    row.locator("button", has_text="retry").click()
    assert f"retried 1 job: #{job_id}" in page.locator(".flash").inner_text()
    wait_for_state(page, url, job_id, "done")  # the worker ran it again, and this time it worked
    attempts = page.locator("#attempts tbody tr")
    assert attempts.count() == 2
    assert "prompt_version" in attempts.nth(1).inner_text()


def test_approve_a_held_job_and_see_it_done(site, page):
    app, url = site
    with app.connect() as conn:
        job_id = app.enqueue(conn, "classify", {"lead": "globex"}, held=True)
    page.goto(url + "/review")
    item = page.locator(f'li.held[data-job="{job_id}"]')
    assert "globex" in item.inner_text()
    item.locator("button", has_text="Approve").click()
    assert "approved 1 job" in page.locator(".flash").inner_text()
    assert page.locator(f'li.held[data-job="{job_id}"]').count() == 0
    wait_for_state(page, url, job_id, "done")


def test_a_script_in_a_payload_is_shown_as_text(site, page):
    app, url = site
    evil = "<script>window.__pwned = 1; alert('pwned')</script><img src=x onerror=\"window.__pwned = 2\">"
    with app.connect() as conn:
        job_id = app.enqueue(conn, "classify", {"note": evil}, held=True)
    for path in (f"/jobs/{job_id}", "/review", "/jobs"):
        page.goto(url + path)
        assert page.evaluate("window.__pwned") is None, path
    page.goto(f"{url}/jobs/{job_id}")
    assert "<script>window.__pwned = 1;" in page.locator("#payload").inner_text()
    assert page.locator("#payload script, #payload img").count() == 0
    assert page.dialogs == []
    with app.connect() as conn:
        app.cancel(conn, ids=[job_id])



def reload_until(page, url: str, predicate, timeout: float = 20.0, what: str = "the page") -> None:
    deadline = time.monotonic() + timeout
    while True:
        page.goto(url)
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not as expected after {timeout}s")
        time.sleep(0.3)


def test_workers_page_lists_two_workers_and_drops_the_killed_one(site, page):
    app, url = site
    rows = page.locator('#workers-table tr[data-role="worker"]')
    reload_until(page, url + "/workers", lambda: rows.count() == 1, what="the module's worker")
    cells = rows.first.locator("td")
    assert cells.nth(2).inner_text() == socket.gethostname()
    assert cells.nth(3).inner_text().isdigit() and "leads" in cells.nth(5).inner_text()
    second = WorkerProcess(TASKS, app.schema, "--poll-interval", "0.2", "--concurrency", "2")
    try:
        reload_until(page, url + "/workers", lambda: rows.count() == 2, what="a second worker")
        pid = str(second.proc.pid)
        assert page.locator("#workers-table td.num", has_text=pid).count() == 1
        second.kill()  # SIGKILL: no goodbye; its registration runs out after a lease (5 s here)
        reload_until(page, url + "/workers", lambda: rows.count() == 1, timeout=30, what="the killed worker gone")
        assert page.locator("#workers-table td.num", has_text=pid).count() == 0
    finally:
        second.stop()


def test_pause_resume_and_limit_a_queue_from_the_queues_page(site, page):
    app, url = site
    with app.connect() as conn:
        app.enqueue(conn, "classify", {"n": 0}, delay=3600)  # the queue has a row
    page.goto(url + "/queues")
    row = page.locator('#queues-table tr[data-queue="leads"]')
    try:
        row.locator("input[name=for]").fill("10m")
        row.locator("button", has_text="pause").click()
        assert "paused leads for 10m" in page.locator(".flash").inner_text()
        assert "paused" in row.locator("td.pause").inner_text()
        with app.connect() as conn:
            job_id = app.enqueue(conn, "classify", {"lead": "paused"})
        time.sleep(1.5)  # the worker polls every 0.2 s: a paused queue gives it nothing
        with app.connect() as conn:
            assert app.job_states([job_id], conn)[job_id] == "pending"
        row.locator("button", has_text="resume").click()
        assert "resumed leads" in page.locator(".flash").inner_text()
        wait_for_state(page, url, job_id, "done")
        page.goto(url + "/queues")
        row.locator("summary", has_text="limits").click()
        row.locator("input[name=concurrency]").fill("2")
        row.locator("input[name=rate]").fill("50/s")
        row.locator("details button", has_text="save").click()
        assert "leads: 50 starts/s, 2 running" in page.locator(".flash").inner_text()
        assert "2 running" in row.locator("td.limits").inner_text()
        row.locator("summary", has_text="limits").click()
        row.locator("button", has_text="remove limits").click()
        assert "removed the limits of leads" in page.locator(".flash").inner_text()
    finally:
        with app.connect() as conn:
            app.resume_queue(conn, "leads")
            app.remove_limit(conn, "leads")


def test_search_by_payload_then_retry_every_match_after_seeing_the_count(site, page):
    app, url = site
    tag = uuid.uuid4().hex[:8]
    with app.connect() as conn:
        ids = [app.enqueue(conn, "classify", {"fail_first": True, "tag": tag, "i": i}) for i in range(3)]
        other = app.enqueue(conn, "classify", {"tag": "other"})
    for job_id in ids:
        wait_for_state(page, url, job_id, "failed")
    page.goto(url + "/jobs")
    page.fill("#filters input[name=payload]", f"tag={tag}")
    page.fill("#filters input[name=error]", "malformed")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(f"payload=tag%3D{tag}"))  # the search's page, loaded: not the one before it
    page.wait_for_load_state()
    assert sorted(int(i) for i in page.locator("tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.job)")) == sorted(ids)
    page.locator("#bulk-all button", has_text="retry all").click()
    assert page.locator("#bulk-count").get_attribute("data-count") == "3"
    page.locator("#bulk-confirm button").click()
    assert "retried 3 of 3 matching jobs" in page.locator(".flash").inner_text()
    for job_id in ids:
        wait_for_state(page, url, job_id, "done")
    with app.connect() as conn:
        assert app.job_states([other], conn)[other] == "done"  # ran once, never failed, never retried


def test_a_stuck_outbox_topic_shows_its_retries_and_a_message_is_discarded(site, page):
    app, url = site
    topic = f"crm.stuck.{uuid.uuid4().hex[:6]}"
    with app.connect() as conn:
        message = app.publish(conn, topic, {"lead": 7}, key="lead-7")
        conn.execute(f'UPDATE "{app.schema}".outbox SET attempts = 4, last_error = %s,'
                     " run_after = now() + interval '1 hour' WHERE id = %s", ("HTTP 503 from the CRM", message))
    page.goto(url + "/outbox")
    cells = page.locator(f'#topics tr[data-topic="{topic}"] td')
    assert [cells.nth(i).inner_text() for i in range(1, 4)] == ["1", "1", "0"]  # pending, retrying, failed
    retry_row = page.locator(f'#retrying tr[data-message="{message}"]')
    assert "HTTP 503 from the CRM" in retry_row.inner_text() and "4" in retry_row.inner_text()
    retry_row.locator(f'a[href="/outbox/{message}"]').click()
    assert page.locator("#tries").inner_text().startswith("4")
    assert page.locator("#last-error").inner_text() == "HTTP 503 from the CRM"
    assert '"lead": 7' in page.locator("#payload").inner_text()
    page.locator("#message-actions button", has_text="Discard").click()
    page.wait_for_url(re.compile(r"/outbox$"))
    assert f"discarded 1 message: #{message}" in page.locator(".flash").inner_text()
    assert page.locator(f'#topics tr[data-topic="{topic}"]').count() == 0


def test_history_shows_what_ran_per_queue_and_kind(site, page):
    app, url = site
    with app.connect() as conn:
        job_id = app.enqueue(conn, "classify", {"lead": "history"})
    wait_for_state(page, url, job_id, "done")
    page.goto(url + "/history?window=1h")
    row = page.locator('#history-table tr[data-queue="leads"][data-kind="classify"]')
    assert int(row.locator("td").nth(2).inner_text().replace(",", "")) >= 1  # done
    latency = page.locator('#latency-table tr[data-queue="leads"]')
    assert re.search(r"\d+ ms|\d+\.\d s", latency.locator("td").nth(2).inner_text())
    # the charts beside the tables: a bar per five minutes over the hour, the job's in the last one or two
    chart = page.locator("svg#history-chart")
    assert chart.is_visible() and chart.locator("g").count() == 12
    titles = chart.locator("g title").all_text_contents()
    assert any(re.search(r": [1-9]\d* done, \d+ failed$", t) for t in titles[-2:]), titles
    assert page.locator('svg.history-chart[data-queue="leads"]:not([data-kind])').is_visible()
    assert page.locator('svg.history-chart[data-queue="leads"][data-kind="classify"]').count() == 1
    waits = page.locator('svg.latency-chart[data-queue="leads"]')
    assert waits.is_visible() and waits.locator("circle.dot.p50").count() >= 1
    page.locator("#windows a", has_text="last 7d").click()
    page.wait_for_url(re.compile(r"window=7d"))
    assert page.locator('#history-table tr[data-queue="leads"]').count() >= 1
    assert page.locator("svg#history-chart g").count() == 168  # an hour a bar over the week
