"""The dashboard's batch pages, and waiting jobs in the jobs list with what they wait on."""

from __future__ import annotations

import psycopg

from joblane.testing import run_jobs


def test_batch_pages_and_waiting_jobs(app, conn, client):
    @app.task("step")
    def step(job):
        pass

    @app.task("summary")
    def summary(job):
        pass

    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, name="nightly <reclassify>", on_complete=("summary", {}))
        first = batch.enqueue(tx, "step", {"n": 1})
        child = batch.enqueue(tx, "step", {"n": 2}, after=[first])
        waiter = app.enqueue(tx, "step", {"n": 3})
        # park the third job by hand, as a WaitFor would
        tx.execute(f'UPDATE "{app.schema}".jobs SET state = %s, wait_key = %s WHERE id = %s',
                   ("waiting", "approval:<7>", waiter))
    page = client.get("/batches")
    assert page.status_code == 200 and f'href="/batches/{batch.id}"' in page.text
    assert "nightly &lt;reclassify&gt;" in page.text  # escaped
    one = client.get(f"/batches/{batch.id}")
    assert one.status_code == 200 and "1 parent" in one.text and f'data-job="{child}"' in one.text
    jobs = client.get("/jobs?state=waiting")
    assert jobs.status_code == 200
    assert "waits on signal approval:&lt;7&gt;" in jobs.text and "waits on 1 parent" in jobs.text
    detail = client.get(f"/jobs/{child}")
    assert f'href="/jobs/{first}"' in detail.text and f'href="/batches/{batch.id}"' in detail.text
    overview = client.get("/")
    assert overview.status_code == 200 and "waiting" in overview.text
    assert client.get("/batches/999999").status_code == 404
    assert client.get(f"/batches/{batch.id}?state=nope").status_code == 400
    with psycopg.connect(app.dsn) as tx:
        batch.seal(tx)
    run_jobs(app)
    done = client.get(f"/batches/{batch.id}")
    assert "finished" in done.text and "2/2" in done.text


def test_a_large_batch_pages_through_all_its_jobs_and_says_how_many_there_are(app, conn, client):
    import re

    from joblane import JobSpec

    @app.task("step")
    def step(job):
        pass

    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, name="big")
        ids = app.enqueue_many(tx, [JobSpec("step", {"n": n}) for n in range(1203)], batch=batch)
    seen: list[int] = []
    url = f"/batches/{batch.id}"
    pages = 0
    while url:
        html = client.get(url).text
        rows = [int(i) for i in re.findall(r'<tr data-job="(\d+)"', html)]
        assert f"{len(rows)} of 1,203" in html, html[html.find('id="batch-page"'):][:300]
        seen += rows
        pages += 1
        found = re.search(r'<a href="(/batches/\d+\?[^"]*after=\d+)" id="next-page">', html)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert pages == 3 and seen == sorted(ids)
    pending = client.get(f"/batches/{batch.id}?state=pending").text
    assert "500 of 1,203 pending" in pending and f"/batches/{batch.id}?state=pending&amp;after=" in pending
