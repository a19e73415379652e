"""What the relay says: a line per retry (INFO) and per failure (WARNING) with the reason, a periodic summary,
no third-party chatter (httpx's line per request), ISO 8601 times in text logs, and Prometheus metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import httpx
import psycopg

from joblane import admin
from joblane.outbox import Relay
from joblane.outbox.sinks import HttpSink

from .conftest import eventually, outbox_rows

APP = "tests.outbox.apps:app"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d) ")


def answering():
    """400 for a payload with "bad", 503 (with a body) for the first try of a payload with "flaky", else 200."""
    seen: set[str] = set()

    def respond(request):
        payload = request.json
        if payload.get("bad"):
            return 400, {}, b"no such lead"
        if payload.get("flaky") and request.key not in seen:
            seen.add(request.key)
            return 503, {}, b"busy"
        return 200, {}, b"ok"

    return respond


def publish(app, dsn: str, topic: str, payloads: list[dict]) -> list[int]:
    with psycopg.connect(dsn) as c, c.transaction():
        return [app.publish(c, topic, p) for p in payloads]


async def test_each_retry_and_failure_is_logged_with_its_reason(app, conn, joblane_dsn, receiver, caplog):
    receiver.respond = answering()
    app.route("hook.", HttpSink(receiver.url), backoff=lambda attempt: 0.01)
    [flaky] = publish(app, joblane_dsn, "hook.lead", [{"flaky": 1}])
    [bad] = publish(app, joblane_dsn, "hook.lead", [{"bad": 1}])
    [fine] = publish(app, joblane_dsn, "hook.lead", [{}])
    caplog.set_level(logging.DEBUG, logger="joblane")
    async with Relay(app, listen=False) as r:
        await r.run_once()
        await asyncio.sleep(0.05)
        await r.run_once()
    lines = {(rec.joblane["outbox_id"], rec.joblane["outcome"]): rec for rec in caplog.records
             if rec.name == "joblane.outbox" and hasattr(rec, "joblane") and "outbox_id" in rec.joblane}
    retry = lines[(flaky, "retry")]
    assert retry.levelno == logging.INFO
    assert retry.getMessage().startswith(f"outbox {flaky} hook.lead attempt 1/25: retry in ")
    assert retry.getMessage().endswith(": HTTP 503 Service Unavailable: busy")
    assert retry.joblane["error"] == "HTTP 503 Service Unavailable: busy" and retry.joblane["retry_in"] >= 0
    failed = lines[(bad, "failed")]
    assert failed.levelno == logging.WARNING
    assert failed.getMessage() == f"outbox {bad} hook.lead attempt 1/25: failed: HTTP 400 Bad Request: no such lead"
    assert lines[(fine, "sent")].levelno == logging.DEBUG
    assert lines[(flaky, "sent")].joblane["attempt"] == 2
    assert {s for _, s, *_ in outbox_rows(conn, app)} == {"sent", "failed"}


async def test_a_summary_every_interval_only_when_something_happened(app, conn, joblane_dsn, receiver, caplog):
    app.route("hook.", HttpSink(receiver.url))
    caplog.set_level(logging.INFO, logger="joblane")
    relay = Relay(app, listen=False, poll_interval=0.05, summary_interval=0.4)
    running = asyncio.create_task(relay.run(install_signals=False))
    try:
        await relay.started.wait()
        publish(app, joblane_dsn, "hook.lead", [{}, {}, {}])

        def summaries():
            return [r for r in caplog.records if r.getMessage().startswith("relay: in the last")]

        [line] = await eventually(summaries, timeout=10, message="a summary")
        assert line.getMessage() == "relay: in the last 0.4s: 3 sent, 0 retried, 0 failed"
        assert (line.joblane["sent"], line.joblane["retried"], line.joblane["failed"]) == (3, 0, 0)
        await asyncio.sleep(1.2)  # three idle intervals: nothing to say
        assert len(summaries()) == 1
    finally:
        relay.request_stop()
        await asyncio.wait_for(running, 30)


async def test_rows_no_route_matches_are_said_once_per_topic_and_counted_by_status_and_the_dashboard(
        app, conn, joblane_dsn, receiver, caplog):
    from starlette.testclient import TestClient

    from joblane.web import create_app

    from ..review.helpers import run_cli

    app.route("hook.", HttpSink(receiver.url))
    publish(app, joblane_dsn, "crm.lead_created", [{"n": i} for i in range(3)])
    publish(app, joblane_dsn, "billing", [{}])
    publish(app, joblane_dsn, "hook.lead", [{}])
    # with no relay running, status says so
    idle = run_cli(app, "status")
    assert "no relay is running: 5 pending messages wait for one" in " ".join(idle.stdout.split())
    caplog.set_level(logging.INFO, logger="joblane")
    relay = Relay(app, listen=False, poll_interval=0.05, summary_interval=0.3)
    running = asyncio.create_task(relay.run(install_signals=False))
    try:
        await relay.started.wait()

        def unrouted():
            return [r for r in caplog.records if "with no route" in r.getMessage()]

        await eventually(lambda: len(unrouted()) == 2, timeout=10, message="a line per unrouted topic")
        await eventually(lambda: admin.processes(app, conn), timeout=10, message="the relay registered")
        await asyncio.sleep(1.0)  # three more checks: nothing new to say
        lines = {r.joblane["topic"]: r for r in unrouted()}
        assert len(unrouted()) == 2 and set(lines) == {"crm.lead_created", "billing"}
        assert lines["crm.lead_created"].levelno == logging.WARNING
        assert lines["crm.lead_created"].getMessage().startswith(
            "relay: 3 messages of topic 'crm.lead_created' wait with no route (routes: 'hook.')")
        assert lines["billing"].getMessage().startswith("relay: 1 message of topic 'billing' waits with no route")
        assert lines["billing"].joblane["messages"] == 1
        status = run_cli(app, "status")
        said = " ".join(status.stdout.split())
        assert status.exit_code == 0, status.output
        assert "outbox: 4 pending messages match no route (hook.) and wait: crm.lead_created (3), billing (1)" \
            in said
        with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
            html = client.get("/outbox").text
        assert re.search(r'<p class="flash error unrouted">Pending messages of 2 topics match no route', html)
        assert re.search(r'<tr data-topic="crm.lead_created" class="unrouted">.*?no route</span>', html)
        assert '<tr data-topic="hook.lead">' in html
    finally:
        relay.request_stop()
        await asyncio.wait_for(running, 30)


async def test_relay_process_logs_retries_and_failures_as_json_without_httpx_lines_and_serves_metrics(
        app, conn, joblane_dsn, receiver, spawn_relay):
    receiver.respond = answering()
    publish(app, joblane_dsn, "hook.lead", [{"flaky": 1}, {"bad": 1}, {}])
    relay = spawn_relay(APP, app.schema, "--poll-interval", "0.1", "-v", "--metrics-port", "0",
                        env={"TEST_HTTP_URL": receiver.url})
    app.route("hook.", HttpSink(receiver.url))  # to read the rows
    await eventually(lambda: {s for _, s, *_ in outbox_rows(conn, app)} == {"sent", "failed"}, timeout=30,
                     message="a row sent after a retry and a row failed")
    port = await eventually(lambda: re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", relay.output()),
                            message="the metrics line")
    metrics = httpx.get(f"http://127.0.0.1:{port[1]}/metrics").text
    assert 'joblane_outbox_messages_total{outcome="retry",topic="hook.lead"} 1.0' in metrics
    assert 'joblane_outbox_messages_total{outcome="failed",topic="hook.lead"} 1.0' in metrics
    assert 'joblane_outbox_messages_total{outcome="sent",topic="hook.lead"} 2.0' in metrics
    relay.stop()
    lines = [json.loads(line) for line in relay.output().splitlines() if line.startswith("{")]
    rows = [line for line in lines if line["logger"] == "joblane.outbox" and "outbox_id" in line]
    assert {(line["level"], line["outcome"]) for line in rows} == {("info", "retry"), ("warning", "failed"),
                                                                  ("debug", "sent")}
    [retry] = [line for line in rows if line["outcome"] == "retry"]
    assert retry["error"] == "HTTP 503 Service Unavailable: busy" and retry["topic"] == "hook.lead"
    [failed] = [line for line in rows if line["outcome"] == "failed"]
    assert failed["error"] == "HTTP 400 Bad Request: no such lead"
    assert all(line["logger"].startswith("joblane") for line in lines), "third-party loggers stay at WARNING"
    assert "HTTP Request" not in relay.output()


async def test_text_logs_carry_iso_8601_times(app, conn, joblane_dsn, receiver, spawn_relay):
    publish(app, joblane_dsn, "hook.lead", [{}])
    relay = spawn_relay(APP, app.schema, "--poll-interval", "0.1", "--log-format", "text",
                        env={"TEST_HTTP_URL": receiver.url, "COLUMNS": "200"})
    await eventually(lambda: receiver.posts(), timeout=30, message="the row delivered")
    relay.stop()
    lines = [line for line in relay.output().splitlines() if line.strip()]
    assert lines and all(ISO.match(line) for line in lines), lines
    assert any("hook. -> " in line for line in lines)
    assert "HTTP Request" not in relay.output(), "httpx logs its requests at INFO: not shown"


async def test_text_logs_to_a_file_keep_each_record_on_one_line_whatever_its_width(
        app, conn, joblane_dsn, receiver, spawn_relay):
    """Not a terminal (the process logs to a file): a 300-character reason stays on its record's line."""
    reason = "no such lead: " + "x" * 300
    receiver.respond = lambda request: (400, {}, reason.encode())
    [bad] = publish(app, joblane_dsn, "hook.lead", [{}])
    relay = spawn_relay(APP, app.schema, "--poll-interval", "0.1", "--log-format", "text",
                        env={"TEST_HTTP_URL": receiver.url, "COLUMNS": ""})
    await eventually(lambda: {s for _, s, *_ in outbox_rows(conn, app)} == {"failed"}, timeout=30,
                     message="the row failed")
    relay.stop()
    lines = [line for line in relay.output().splitlines() if line.strip()]
    assert lines and all(ISO.match(line) for line in lines), lines
    [failed] = [line for line in lines if f"outbox {bad} " in line]
    assert re.match(ISO.pattern + rf"WARNING +outbox {bad} hook\.lead attempt 1/25: failed: HTTP 400 Bad Request: "
                    + reason + "$", failed), failed
