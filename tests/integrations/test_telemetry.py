"""Telemetry: one trace from a web request to the worker to the broker; metrics; one log line per outcome."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import joblane
from joblane import telemetry
from joblane.types import Job, Outcome
from joblane.outbox import Relay
from joblane.outbox.sinks import HttpSink
from joblane.testing import drain
from joblane.worker import Worker

from ..conftest import table, wait_until
from ..helpers import create_runs_table
from .examples import load_example


@pytest.fixture
def tracing():
    """An SDK tracer provider with an in-memory exporter, for joblane and for the test's own spans.

    joblane's tracer is swapped for this test only: the global provider stays
    unset, so other tests in the process record nothing.
    """
    exporter = InMemorySpanExporter()
    provider = load_example("tracing.py").tracer_provider("tests", exporter)  # the docs' set-up
    telemetry.set_tracer_provider(provider)
    yield Spans(exporter, provider), provider.get_tracer("tests")
    telemetry.set_tracer_provider(None)
    provider.shutdown()


class Spans:
    def __init__(self, exporter, provider):
        self.exporter, self.provider = exporter, provider

    def get_finished_spans(self):
        self.provider.force_flush()  # the docs' set-up batches spans
        return self.exporter.get_finished_spans()


@pytest.fixture
def webhook():
    """A real HTTP endpoint on 127.0.0.1 that records the headers of every POST."""
    received: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            received.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


async def test_one_trace_from_request_to_job_to_outbox_delivery(app, conn, tracing, webhook):
    exporter, tests_tracer = tracing
    url, received = webhook
    app.route("crm.", HttpSink(url + "/hooks/{topic}"))

    @app.task("enrich_lead")
    def enrich_lead(job):  # a plain function: it runs in a thread, and still inside the run span
        with tests_tracer.start_as_current_span("call model"):
            pass
        with psycopg.connect(app.dsn) as c, c.transaction():
            app.publish(c, "crm.lead_enriched", {"lead": job.payload["lead"]}, key="lead-7")

    with tests_tracer.start_as_current_span("POST /leads", kind=SpanKind.SERVER) as request:
        with psycopg.connect(app.dsn) as c, c.transaction():
            job_id = app.enqueue(c, "enrich_lead", {"lead": 7})
    assert (await drain(app))["done"] == 1
    async with Relay(app, listen=False) as relay:
        assert (await relay.run_once()).sent == 1

    spans = {s.name: s for s in exporter.get_finished_spans()}
    trace_id = request.get_span_context().trace_id
    chain = ["POST /leads", "enqueue enrich_lead", "run enrich_lead", "publish crm.lead_enriched",
             "deliver crm.lead_enriched"]
    for parent, child in zip(chain, chain[1:]):
        assert spans[child].parent.span_id == spans[parent].context.span_id, (child, parent)
    assert spans["call model"].parent.span_id == spans["run enrich_lead"].context.span_id
    assert {s.context.trace_id for s in spans.values() if s.name != "claim"} == {trace_id}
    assert spans["claim"].attributes["joblane.job.ids"] == (job_id,)
    assert spans["run enrich_lead"].attributes["joblane.outcome"] == "done"
    assert spans["run enrich_lead"].kind == SpanKind.CONSUMER

    # the trace context rides in the job's headers column, never in the payload users see
    payload, headers = conn.execute(f"SELECT payload, headers FROM {table(app, 'jobs')} WHERE id = %s",
                                    (job_id,)).fetchone()
    assert payload == {"lead": 7}
    assert headers["traceparent"].split("-")[1] == format(trace_id, "032x")
    # and the broker gets it with the message
    [post] = received
    assert post["traceparent"].split("-")[1] == format(trace_id, "032x")
    assert post["traceparent"].split("-")[2] == format(spans["publish crm.lead_enriched"].context.span_id, "016x")


async def test_failures_mark_the_run_span_and_no_sdk_means_no_headers(app, conn, tracing, monkeypatch):
    exporter, _ = tracing
    tests_tracer = trace.NoOpTracerProvider().get_tracer("tests")

    @app.task("flaky", max_attempts=1)
    async def flaky(job):
        raise ConnectionError("upstream down")

    app.enqueue(conn, "flaky", {})
    await drain(app)
    run = next(s for s in exporter.get_finished_spans() if s.name == "run flaky")
    assert run.status.status_code == StatusCode.ERROR
    assert "upstream down" in run.status.description

    # the API without an SDK (a library pulled it in), or no OpenTelemetry at all: headers stay NULL
    telemetry.set_tracer_provider(None)
    with tests_tracer.start_as_current_span("a request nobody records"):
        assert not telemetry.tracing()
        job_id = app.enqueue(conn, "flaky", {})
        monkeypatch.setattr(telemetry, "_trace", None)
        other_id = app.enqueue(conn, "flaky", {})
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE id IN (%s, %s) AND headers IS NULL",
                        (job_id, other_id)).fetchone()[0] == 2


async def test_one_log_line_per_outcome_with_its_fields(app, conn, caplog):
    @app.task("ok")
    async def ok(job):
        return 1

    @app.task("held")
    async def held(job):
        raise joblane.Hold("a person checks this one")

    a = app.enqueue(conn, "ok", {})
    b = app.enqueue(conn, "held", {})
    with caplog.at_level(logging.INFO, logger="joblane.jobs"):
        await drain(app)
    # done is logged at DEBUG, so a busy worker is not slowed by a line per job
    lines = {r.joblane["job_id"]: r for r in caplog.records if r.name == "joblane.jobs"}
    assert set(lines) == {b}
    assert lines[b].levelno == logging.INFO
    caplog.clear()
    a = app.enqueue(conn, "ok", {})
    with caplog.at_level(logging.DEBUG, logger="joblane.jobs"):
        await drain(app)
    lines |= {r.joblane["job_id"]: r for r in caplog.records if r.name == "joblane.jobs"}
    assert set(lines) == {a, b}
    assert lines[a].joblane | {"seconds": None} == {
        "job_id": a, "kind": "ok", "queue": "default", "attempt": 1, "max_attempts": 10, "outcome": "done",
        "state": "done", "seconds": None}
    assert lines[b].joblane["outcome"] == "held"
    assert lines[b].getMessage().startswith(f"job {b} held (default) attempt 1/10: held (ran ")


def test_the_text_line_says_how_long_the_try_ran_and_when_the_next_one_starts(caplog):
    # the run took a millisecond; the next try is 0.768s away: the text must not read "retry in 0.001s"
    job = Job(id=18, kind="flaky", queue="leads", payload={}, attempt=1, max_attempts=2)
    retry = Outcome.retry(18, 1, error="ValueError: no", delay=0.768, started_at=100.0, finished_at=100.001)
    held = Outcome.hold(18, 1, error="Hold: look", started_at=100.0, finished_at=100.0)
    with caplog.at_level(logging.INFO, logger="joblane.jobs"):
        telemetry.job_finished(None, job, retry)
        telemetry.job_finished(None, job, held)
    first, second = (r for r in caplog.records if r.name == "joblane.jobs")
    assert first.getMessage() == ("job 18 flaky (leads) attempt 1/2: retry (ran 0.001s, next try in 0.768s): "
                                  "ValueError: no")
    assert first.joblane["retry_in"] == 0.768 and first.joblane["seconds"] == pytest.approx(0.001)
    assert second.getMessage() == "job 18 flaky (leads) attempt 1/2: held (ran 0.000s): Hold: look"


def test_worker_log_lines_are_json_on_request(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    job_id = app.enqueue(conn, "record", {})
    # --log-format json; -v shows the DEBUG line of a job that is done
    w = spawn_worker("tests.apps.runs:app", app.schema, "--metrics-port", "0", "-v")
    wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE state = 'done'")
               .fetchone()[0] == 1, timeout=30, message="the job ran")
    w.stop()
    lines = [json.loads(line) for line in w.output().splitlines() if line.startswith("{")]
    [done] = [line for line in lines if line["logger"] == "joblane.jobs"]
    assert (done["job_id"], done["kind"], done["outcome"], done["attempt"]) == (job_id, "record", "done", 1)
    assert any(line["message"].startswith("metrics at http://127.0.0.1:") for line in lines)  # loopback by default


async def test_prometheus_metrics_are_served(app, conn):
    @app.task("ok")
    async def ok(job):
        return None

    @app.task("bad", max_attempts=1)
    async def bad(job):
        raise joblane.PermanentError("no")

    app.enqueue_many(conn, [("ok", {}), ("ok", {}), ("bad", {})])
    worker = Worker(app, poll_interval=0.05, listen=False)
    metrics = telemetry.serve_metrics(worker, 0, host="127.0.0.1")
    try:
        runner = asyncio.create_task(worker.run(install_signals=False))
        while worker.stats["done"] + worker.stats["failed"] < 3:
            await asyncio.sleep(0.02)
        worker.request_stop()
        await runner
        url = f"http://127.0.0.1:{metrics.port}/metrics"
        text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
    finally:
        metrics.close()
    assert 'joblane_jobs_total{kind="ok",outcome="done",queue="default"} 2.0' in text
    assert 'joblane_jobs_total{kind="bad",outcome="failed",queue="default"} 1.0' in text
    assert 'joblane_job_duration_seconds_count{kind="ok",queue="default"} 2.0' in text
    assert "joblane_jobs_running 0.0" in text
    assert "joblane_completions_stale_total 0.0" in text
    assert "joblane_vacuums_total 0.0" in text  # three jobs leave no dead rows worth a vacuum
