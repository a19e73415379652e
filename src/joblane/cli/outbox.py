"""`joblane relay APP` and `joblane outbox ...`: deliver the outbox, and look at and retry its messages."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import click

from .. import admin
from ..outbox.routes import DEFAULT_MAX_ATTEMPTS
from .common import (Duration, Fail, Once, Table, app_from_context, console, emit_json, error_cell, needs_extra,
                     parse_ids, print_table, report_changes, run_or_fail, setup_logging, show_time, working)


@click.command()
@click.argument("app_spec", metavar="APP")
@click.option("--batch-size", default=200, show_default=True, type=click.IntRange(1, 10_000),
              help="Most rows claimed per batch.")
@click.option("-c", "--concurrency", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Batches in flight at once.")
@click.option("--poll-interval", default=1.0, show_default=True, type=click.FloatRange(0.01, 3600))
@click.option("--lease", "lease_seconds", default=30.0, show_default=True, type=click.FloatRange(1, 86400),
              help="Seconds a claimed row stays with this relay (extended while its batch is delivered).")
@click.option("--grace", "grace_seconds", default=15.0, show_default=True, type=click.FloatRange(0, 86400),
              help="Seconds the batches in flight get to finish after SIGTERM.")
@click.option("--no-listen", is_flag=True, help="Poll only (no LISTEN connection).")
@click.option("--pgbouncer/--no-pgbouncer", default=None, envvar="JOBLANE_PGBOUNCER",
              help="Behind PgBouncer in transaction pooling: no named prepared statements, poll instead of LISTEN "
                   "(also JOBLANE_PGBOUNCER=1).")
@click.option("--connect-timeout", default=60.0, show_default=True, type=click.FloatRange(0, 86400),
              help="Seconds a starting relay waits for an unreachable database before it exits.")
@click.option("--retention", "retention_seconds", default="7d", show_default=True, type=Duration(),
              help="Delete sent rows older than this: 7d, 12h, 30m, or plain seconds.")
@click.option("--vacuum-interval", default="10s", show_default=True, type=Duration(),
              help="Vacuum outbox once its dead row versions pile up, at least this often (sooner while "
                   "its vacuums are quick); 0 leaves it to autovacuum.")
@click.option("--ring-turn", "ring_turn_seconds", default="10s", show_default=True, type=Duration(),
              help="Turn the ring of ready entries the claims read this often (as the worker's --ring-turn).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs joblane[telemetry]).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics listen on (0.0.0.0 for every interface).")
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG (a line per sent row among them).")
@click.pass_context
def relay(ctx: click.Context, app_spec: str, batch_size: int, concurrency: int, poll_interval: float,
          lease_seconds: float, grace_seconds: float, no_listen: bool, retention_seconds: float,
          log_format: str, verbose: bool, connect_timeout: float, pgbouncer: bool | None = None,
          metrics_port: int | None = None, metrics_host: str = "127.0.0.1", vacuum_interval: float = 10.0,
          ring_turn_seconds: float = 10.0) -> None:
    """Deliver APP's outbox through the sinks it routes (app.route(prefix, sink)).

    Logs each retried row (INFO) and failed row (WARNING) with the reason, and a summary every minute.
    """
    from ..outbox.relay import Relay

    if metrics_port is not None:
        with needs_extra("joblane relay --metrics-port", "telemetry"):
            import prometheus_client  # noqa: F401 - telemetry.serve_relay_metrics imports it when it starts
    app = app_from_context(ctx, app_spec)
    setup_logging(log_format, verbose)
    r = run_or_fail(lambda: Relay(app, batch_size=batch_size, concurrency=concurrency, poll_interval=poll_interval,
                                  lease_seconds=lease_seconds, grace_seconds=grace_seconds, listen=not no_listen,
                                  retention_seconds=retention_seconds, connect_timeout=connect_timeout,
                                  pgbouncer=pgbouncer, vacuum_interval=vacuum_interval,
                                  ring_turn_seconds=ring_turn_seconds))
    if metrics_port is not None:
        from ..telemetry import serve_relay_metrics

        run_or_fail(lambda: serve_relay_metrics(r, metrics_port, metrics_host))
    run_or_fail(lambda: asyncio.run(r.run()))


@click.group(invoke_without_command=True)
@click.option("--state", cls=Once, type=click.Choice(admin.OUTBOX_STATES))
@click.option("--topic", cls=Once, help="Only topics starting with this.")
@click.option("--before", "before_id", type=int, help="Only ids below this (next page).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def outbox(ctx: click.Context, state, topic, before_id, limit, as_json) -> None:
    """List outbox messages, newest first (`joblane outbox retry` re-queues failed ones)."""
    if ctx.invoked_subcommand:
        return
    app = app_from_context(ctx)
    # one row past the page says whether older ones exist (a full page alone does not)
    rows = run_or_fail(lambda: admin.outbox_messages(app, state=state, topic=topic, before_id=before_id,
                                                     limit=limit if as_json else limit + 1))
    if as_json:
        emit_json(rows)
        return
    more, rows = len(rows) > limit, rows[:limit]
    table = Table()
    for col in ("id", "topic", "key", "idempotency key", "state", "attempts", "next try", "last error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(str(r["id"]), r["topic"], r["key"] or "-", r["idempotency_key"] or f"outbox:{r['id']}",
                      r["state"], str(r["attempts"]), show_time(r["run_after"]) if r["state"] == "pending" else "-",
                      error_cell(r["state"], r["last_error"]))
    if rows:
        print_table(table)
    else:
        console.print("no outbox messages match")
    if more:
        console.print(f"[dim]more: --before {rows[-1]['id']}[/dim]")


@outbox.command("show")
@click.argument("message_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def outbox_show(ctx: click.Context, message_id: int, as_json: bool) -> None:
    """One outbox message with its payload and headers."""
    app = app_from_context(ctx)
    row = run_or_fail(lambda: admin.outbox_message(app, message_id))
    if row is None:
        raise Fail(f"no outbox message {message_id} in schema {app.schema}")
    if as_json:
        emit_json(row)
        return
    table = Table(show_header=False, title=f"outbox message {message_id}")
    for key, value in row.items():
        if key == "max_attempts" and value is None:
            # the row's own budget is set by `outbox retry`; until then its route's applies, as the relay logs it
            value = f"the route's ({DEFAULT_MAX_ATTEMPTS} unless app.route(..., max_attempts=N) says otherwise)"
        elif key == "last_error" and row["state"] == "sent" and value:
            key = "earlier error"  # from a try before the one that was sent
        if key in ("payload", "headers"):
            value = json.dumps(value, indent=2)
        elif isinstance(value, dt.datetime):
            value = show_time(value)
        table.add_row(key, "-" if value is None else str(value))
    print_table(table)


@outbox.command("retry")
@click.argument("message_ids", nargs=-1)
@click.option("--topic", cls=Once, help="Retry every failed message whose topic starts with this.")
@click.option("--all-failed", is_flag=True, help="Retry every failed message.")
@click.option("--attempts", default=10, show_default=True, type=click.IntRange(1, 100_000),
              help="Tries each message gets before it fails again.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def outbox_retry(ctx: click.Context, message_ids, topic, all_failed, attempts, as_json) -> None:
    """Put failed outbox messages back to pending."""
    ids = parse_ids(message_ids, "message")
    if not ids and not (topic or all_failed):
        raise Fail("give message ids, --topic or --all-failed")
    if ids and (topic or all_failed):
        raise Fail("give either message ids or a filter, not both")
    app = app_from_context(ctx)
    with working("retrying outbox messages"):
        done = run_or_fail(lambda: app.retry_outbox(ids=ids or None, topic=topic, all_failed=all_failed,
                                                    attempts=attempts))
    skipped = {}
    for i in (i for i in ids if i not in set(done)):
        row = run_or_fail(lambda: admin.outbox_message(app, i))
        skipped[i] = "missing" if row is None else row["state"]
    report_changes("retried", "message", done, skipped, as_json)


@outbox.command("discard")
@click.argument("message_ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def outbox_discard(ctx: click.Context, message_ids, as_json) -> None:
    """Delete unsent outbox messages (pending or failed): they are never delivered."""
    ids = parse_ids(message_ids, "message")
    if not ids:
        raise Fail("give message ids")
    app = app_from_context(ctx)
    with working("discarding outbox messages"):
        done = run_or_fail(lambda: app.discard_outbox(ids=ids))
    skipped = {}
    for i in (i for i in ids if i not in set(done)):
        row = run_or_fail(lambda: admin.outbox_message(app, i))
        skipped[i] = "missing" if row is None else row["state"]
    report_changes("discarded", "message", done, skipped, as_json)


COMMANDS = (relay, outbox)
