"""End to end in headless Chromium: the dashboard served by uvicorn, a real `joblane worker` process, real clicks."""

from __future__ import annotations

import re
import time

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
    assert page.locator('meta[http-equiv="refresh"]').get_attribute("content") == "2"
    # the page reloads itself and picks up new work
    with app.connect() as conn:
        app.enqueue(conn, "classify", {"n": 2}, queue="overview-q", delay=3600)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#queues tbody tr')]"
        ".some(r => r.textContent.includes('overview-q') && r.querySelectorAll('td')[1].textContent.trim() === '2')",
        timeout=10_000)


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
