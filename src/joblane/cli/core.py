"""`joblane migrate|worker|status|jobs|retry|cancel`: the queue's own commands. No queue logic: App does the work."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import click
from rich.markup import escape

from .. import admin, rules
from ..app import App
from ..admin import CANCELLABLE, RETRYABLE
from ..types import FINISHED_STATES, JOB_STATES
from .common import (Duration, Fail, Once, Table, app_from_context, bulk, bulk_options, console, emit_json,
                     error_cell, job_filters, needs_extra, parse_ids, print_table, report_changes, run_or_fail,
                     setup_logging, show_time)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Create or upgrade joblane's tables (safe to run twice)."""
    app = app_from_context(ctx)
    applied = run_or_fail(app.migrate)
    from ..migrations import latest_version

    if as_json:
        emit_json({"schema": app.schema, "applied": applied, "version": latest_version()})
    elif applied:
        console.print(f"schema [bold]{app.schema}[/bold]: applied {', '.join(map(str, applied))}; "
                      f"now at version {latest_version()}")
    else:
        console.print(f"schema [bold]{app.schema}[/bold] is up to date (version {latest_version()})")


@click.command()
@click.argument("app_spec", metavar="APP")
@click.option("-q", "--queue", "queues", multiple=True, help="Queue to serve (repeatable; default: the app's task queues).")
@click.option("-c", "--concurrency", default=10, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--claim-batch", type=click.IntRange(1, 10_000),
              help="Most jobs per claim (default: the running and prefetched places at most).")
@click.option("--prefetch", type=click.IntRange(0, 100_000),
              help="Jobs leased ahead of free slots (default: sized to how fast the tasks finish, from 1 to three "
                   "times the concurrency).")
@click.option("--claimers", type=click.IntRange(1, 16),
              help="Claims in flight at once, each on its own connection (default: 1, up to 3 when the "
                   "running and prefetched places hold several claims).")
@click.option("--poll-interval", default=1.0, show_default=True, type=click.FloatRange(0.01, 3600))
@click.option("--lease", "lease_seconds", type=click.FloatRange(1, 86400), help="Lease length in seconds (default: the app's, 30).")
@click.option("--grace", "grace_seconds", default=30.0, show_default=True, type=click.FloatRange(0, 86400),
              help="Seconds running tasks get to finish after SIGTERM.")
@click.option("--stop-wait", "stop_seconds", default=10.0, show_default=True, type=click.FloatRange(0, 3600),
              help="After the grace, seconds tasks told to stop get to end; the worker then exits without those "
                   "that would not (their jobs come back when their leases run out, never while they run).")
@click.option("--no-listen", is_flag=True, help="Poll only (no LISTEN connection).")
@click.option("--pgbouncer/--no-pgbouncer", default=None, envvar="JOBLANE_PGBOUNCER",
              help="Behind PgBouncer in transaction pooling: no named prepared statements, poll instead of LISTEN "
                   "(also JOBLANE_PGBOUNCER=1). Default: found out at start from the connection's two ends.")
@click.option("--connect-timeout", default=60.0, show_default=True, type=click.FloatRange(0, 86400),
              help="Seconds a starting worker waits for an unreachable database before it exits.")
@click.option("--stall-warning", default=2.0, show_default=True, type=click.FloatRange(0.01, 3600),
              help="Warn when a task blocks the event loop this many seconds.")
@click.option("--unknown-kind-timeout", default=600.0, show_default=True, type=click.FloatRange(0),
              help="Fail a job of a kind no live worker knows once it is this many seconds old.")
@click.option("--retention", "retention_seconds", default="7d", show_default=True, type=Duration(),
              help="Prune done/cancelled jobs older than this: 7d, 12h, 30m, or plain seconds.")
@click.option("--vacuum-interval", default="10s", show_default=True, type=Duration(),
              help="Vacuum jobs once its dead row versions pile up, at least this often (sooner while "
                   "its vacuums are quick); 0 leaves it to autovacuum.")
@click.option("--ring-turn", "ring_turn_seconds", default="10s", show_default=True, type=Duration(),
              help="Turn the claim's ring of ready entries this often; a slot left behind is emptied (TRUNCATE) "
                   "once nothing can need it, so a shorter turn gives the space back sooner.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs joblane[telemetry]).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics listen on (0.0.0.0 for every interface).")
@click.option("-v", "--verbose", is_flag=True)
@click.pass_context
def worker(ctx: click.Context, app_spec: str, queues: tuple[str, ...], concurrency: int, claim_batch: int | None,
           poll_interval: float, lease_seconds: float | None, grace_seconds: float, no_listen: bool,
           retention_seconds: float, log_format: str, verbose: bool, connect_timeout: float,
           metrics_port: int | None = None, metrics_host: str = "127.0.0.1", pgbouncer: bool | None = None, stall_warning: float = 2.0,
           unknown_kind_timeout: float = 600.0, claimers: int | None = None, vacuum_interval: float = 10.0,
           prefetch: int | None = None, stop_seconds: float = 10.0, ring_turn_seconds: float = 10.0) -> None:
    """Run the tasks of APP (module:attribute naming a joblane.App)."""
    from ..worker import Worker

    if metrics_port is not None:
        with needs_extra("joblane worker --metrics-port", "telemetry"):
            import prometheus_client  # noqa: F401 - telemetry.serve_metrics imports it when it starts
    app = app_from_context(ctx, app_spec)
    setup_logging(log_format, verbose)
    w = run_or_fail(lambda: Worker(app, queues=list(queues) or None, concurrency=concurrency,
                                   claim_batch=claim_batch, prefetch=prefetch, claimers=claimers,
                                   poll_interval=poll_interval,
                                   lease_seconds=lease_seconds,
                                   grace_seconds=grace_seconds, listen=not no_listen,
                                   retention_seconds=retention_seconds, connect_timeout=connect_timeout,
                                   pgbouncer=pgbouncer, stall_warning=stall_warning,
                                   unknown_kind_timeout=unknown_kind_timeout, vacuum_interval=vacuum_interval,
                                   stop_seconds=stop_seconds, ring_turn_seconds=ring_turn_seconds,
                                   exit_when_stuck=True))
    if metrics_port is not None:
        from ..telemetry import serve_metrics

        run_or_fail(lambda: serve_metrics(w, metrics_port, metrics_host))
    run_or_fail(lambda: asyncio.run(w.run()))


@click.command()
@click.option("--health", is_flag=True, help="Table sizes, dead rows, last vacuum, the oldest transaction; warnings.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, health: bool, as_json: bool) -> None:
    """Jobs per queue and state, and the age of the oldest ready job (--health: the tables)."""
    app = app_from_context(ctx)
    if health:
        _health(app, as_json)
        return
    rows = run_or_fail(app.status)
    # pending jobs a spend cap holds back are pending, but no worker will take them before the window rolls
    capped = [b for b in run_or_fail(lambda: admin.budget_status(app)) if b["at_cap"] and b["waiting"]]
    held_back: dict[str, int] = {}
    for b in capped:
        held_back[b["queue"]] = held_back.get(b["queue"], 0) + b["waiting"]
    if as_json:
        emit_json([r | {"at_cap": held_back.get(r["queue"], 0)} if r["state"] == "pending" else r for r in rows])
        return
    per_queue: dict[str, dict[str, Any]] = {}
    for r in rows:
        q = per_queue.setdefault(r["queue"], {s: 0 for s in JOB_STATES} | {"oldest": None})
        q[r["state"]] = r["jobs"]
        if r["oldest_ready_seconds"] is not None:
            q["oldest"] = r["oldest_ready_seconds"]
    table = Table(title=f"joblane status (schema {app.schema})")
    table.add_column("queue")
    for s in JOB_STATES:
        table.add_column(s, justify="right")
    table.add_column("oldest ready", justify="right")
    for name, q in sorted(per_queue.items()):
        cells = [f"{q[s]:,}" for s in JOB_STATES]
        if held_back.get(name):
            cells[JOB_STATES.index("pending")] += f" ({held_back[name]:,} at a cap)"
        table.add_row(name, *cells, rules.format_age(q["oldest"]))
    if not per_queue:
        console.print(f"no jobs in schema {app.schema}")
    else:
        print_table(table)
    for b in capped:
        who = f"{b['key_field']}={b['key']}" if b["key_field"] else f"queue {b['queue']}"
        console.print(f"[yellow]budget {escape(b['budget'])}:[/yellow] {escape(who)} has spent "
                      f"{b['spent'] + b['in_flight']:g} of {b['cap']:g}; {rules.plural(b['waiting'], 'pending job')} "
                      f"of queue {escape(b['queue'])} wait until {show_time(b['window_end'])} or until the cap is "
                      f"raised (joblane budgets set {escape(b['budget'])} --cap N)", highlight=False)
    _unrouted(app)


def _unrouted(app: App) -> None:
    """A line about pending outbox messages that no route matches (or, with no relay running, no relay takes)."""
    found = run_or_fail(lambda: admin.unrouted_outbox(app, limit=10))
    if not found["topics"]:
        return
    n = sum(t["messages"] for t in found["topics"])
    topics = ", ".join(f"{t['topic']} ({t['messages']:,})" for t in found["topics"])
    if found["relays"] or found["prefixes"]:
        routes = ", ".join(p or "*" for p in found["prefixes"])
        console.print(f"[yellow]outbox:[/yellow] {rules.plural(n, 'pending message')} "
                      f"{'matches' if n == 1 else 'match'} no route ({escape(routes)}) and "
                      f"{'waits' if n == 1 else 'wait'}: {escape(topics)}; add app.route(prefix, sink) "
                      "or discard them", highlight=False)
    else:
        console.print(f"[yellow]outbox:[/yellow] no relay is running: {rules.plural(n, 'pending message')} "
                      f"{'waits' if n == 1 else 'wait'} for one: {escape(topics)} (joblane relay APP)",
                      highlight=False)


def _health(app: App, as_json: bool) -> None:
    report = run_or_fail(lambda: admin.health(app))
    if as_json:
        emit_json(report)
        return
    table = Table(title=f"joblane tables (schema {app.schema})")
    for col in ("table", "size", "live rows", "dead rows", "last vacuum", "vacuums"):
        table.add_column(col, justify="left" if col in ("table", "last vacuum") else "right")
    for t in report["tables"]:
        table.add_row(t["table"], f"{t['bytes'] / 2**20:,.1f} MB", f"{t['live']:,}", f"{t['dead']:,}",
                      show_time(t["last_vacuum"]), f"{t['vacuums']:,}")
    print_table(table)
    oldest = report["oldest_transaction_seconds"]
    looks = f" (looks every {report['autovacuum_naptime_seconds']:g}s)" if report["autovacuum"] else ""
    console.print(f"autovacuum {'on' if report['autovacuum'] else 'off'}{looks}; oldest open transaction: "
                  f"{rules.format_age(oldest) if oldest is not None else 'none'}")
    if report["horizon"] is not None:
        console.print(f"vacuum's horizon is held by {escape(rules.holder_text(report['horizon']))}",
                      highlight=False, soft_wrap=True)
    ai = report["ai"]
    console.print(f"AI tables: step_cache {ai['cache_results']:,} results ({ai['cache_expired']:,} expired, "
                  f"{ai['cache_lost_claims']:,} lost claims, for the pruner); budget_usage {ai['budget_windows']:,} "
                  f"windows ({ai['budget_windows_due']:,} past the longest window, for the pruner)", highlight=False)
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)


@click.group(invoke_without_command=True)
@click.option("--state", cls=Once, type=click.Choice(JOB_STATES))
@click.option("--kind", cls=Once)
@click.option("--queue", cls=Once)
@click.option("--since", help="Created at most this long ago (24h, 30m, 7d) or since an ISO time (UTC unless it has an offset).")
@click.option("--until", help="... and created before this (same forms).")
@click.option("--before", "before_id", type=int, help="Only ids below this (next page).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs(ctx: click.Context, state, kind, queue, since, until, before_id, limit, as_json) -> None:
    """List jobs, newest first (`joblane jobs show ID` for one)."""
    if ctx.invoked_subcommand:
        return
    app = app_from_context(ctx)
    # one row past the page says whether older ones exist (a full page alone does not)
    rows = run_or_fail(lambda: app.list_jobs(state=state, kind=kind, queue=queue, before_id=before_id,
                                             limit=limit if as_json else limit + 1, since=since, until=until))
    if as_json:
        emit_json(rows)
        return
    more, rows = len(rows) > limit, rows[:limit]
    # a finished job's time is when it finished; an unfinished one's is when it may (next) run
    when = "finished" if state in FINISHED_STATES else "run after" if state else "run after / finished"
    table = Table()
    for col in ("id", "queue", "kind", "state", "attempts", when, "last error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        at = r["finished_at"] if r["state"] in FINISHED_STATES else r["run_after"]
        table.add_row(str(r["id"]), r["queue"], r["kind"], r["state"], f"{r['attempts']}/{r['max_attempts']}",
                      show_time(at), error_cell(r["state"], r["last_error"]))
    if rows:
        print_table(table)
    else:
        console.print("no jobs match")
    if more:
        console.print(f"[dim]more: --before {rows[-1]['id']}[/dim]")


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """One job with its payload, result and every attempt."""
    app = app_from_context(ctx)
    job = run_or_fail(lambda: app.get_job(job_id))
    if job is None:
        raise Fail(f"no job {job_id} in schema {app.schema}")
    if as_json:
        emit_json(job)
        return
    table = Table(show_header=False, title=f"job {job_id}")
    for key in ("kind", "queue", "state", "priority", "attempts", "max_attempts", "run_after", "unique_key",
                "replay_of", "worker", "lease_until", "last_error", "created_at", "finished_at"):
        value = job[key]
        if key == "last_error" and job["state"] == "done" and value:
            key = "earlier error"  # from before the try that succeeded: not why it stands where it is
        table.add_row(key, show_time(value) if isinstance(value, dt.datetime)
                      else ("-" if value is None else str(value)))
    table.add_row("payload", json.dumps(job["payload"], indent=2))
    # a held job's result is the data its task gave to Hold, for the reviewer
    table.add_row("hold data" if job["state"] == "held" else "result",
                  "-" if job["result"] is None else escape(json.dumps(job["result"], indent=2)))
    if job.get("replays"):
        table.add_row("replayed by", ", ".join(f"{r['id']} ({r['state']})" for r in job["replays"]))
    for b in job.get("waiting_on") or ():
        table.add_row("waiting on", escape(b["text"]))
    print_table(table)
    if job["attempt_rows"]:
        at = Table(title="attempts")
        for col in ("#", "outcome", "worker", "started", "finished", "error", "meta"):
            at.add_column(col, overflow="fold")
        for a in job["attempt_rows"]:
            at.add_row(str(a["attempt"]), a["outcome"], a["worker"] or "-", show_time(a["started_at"]),
                       show_time(a["finished_at"]), (a["error"] or "")[:100],
                       json.dumps({k: v for k, v in (a["meta"] or {}).items() if k != "traceback"})[:100])
        print_table(at)
        traced = [a for a in job["attempt_rows"] if isinstance((a["meta"] or {}).get("traceback"), str)]
        if traced:
            last = traced[-1]
            earlier = f"; {rules.plural(len(traced) - 1, 'earlier one')} in --json" if len(traced) > 1 else ""
            console.print(f"traceback of attempt {last['attempt']}{earlier}:", highlight=False)
            console.print(escape(last["meta"]["traceback"].rstrip()), highlight=False, soft_wrap=True)


def _skipped(app: App, asked: list[int] | None, done: list[int]) -> dict[int, str]:
    """The state of each asked-for job that was not changed ("missing" when there is no such job)."""
    rest = [i for i in asked or () if i not in set(done)]
    if not rest:
        return {}
    states = run_or_fail(lambda: app.job_states(rest))
    return {i: states.get(i, "missing") for i in rest}


def _ids_or_filter(job_ids: tuple[str, ...], filters: dict[str, Any], flag: bool, flags: str) -> list[int] | None:
    ids = parse_ids(job_ids) if job_ids else None
    chosen = any(v not in (None, ()) for v in filters.values()) or flag
    if ids is None and not chosen:
        raise Fail(f"give job ids or a filter ({flags})")
    if ids is not None and chosen:
        raise Fail("give either job ids or a filter, not both")
    return ids


@click.command()
@click.argument("job_ids", nargs=-1)
@job_filters(RETRYABLE)
@click.option("--all-failed", is_flag=True, help="Retry every failed job.")
@click.option("--attempts", "more_tries", default=1, show_default=True, type=click.IntRange(1, 100_000),
              help="Tries granted to a job whose budget is spent (a job failed at 3/3 gets 3/4 by default).")
@bulk_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def retry(ctx: click.Context, job_ids, kind, queue, states, since, until, all_failed, more_tries, yes, dry_run,
          as_json) -> None:
    """Put failed (or cancelled) jobs back to pending: by id, or every job matching the filters.

    A job that failed because its budget was spent gets one more try (3/3
    becomes 3/4; --attempts N grants N). Without --state the filters match
    failed jobs. More than a hundred jobs are counted and asked about first
    (--yes to go ahead, --dry-run to look).

    Example: joblane retry --kind enrich_lead --since 2h
    """
    filters = {"kind": kind, "queue": queue, "state": list(states) or None, "since": since, "until": until}
    ids = _ids_or_filter(job_ids, filters, all_failed, "--kind, --queue, --state, --since, --until or --all-failed")
    app = app_from_context(ctx)
    done = bulk(app, "retry", lambda: app.retry(ids=ids, all_failed=all_failed, attempts=more_tries, **filters),
                ids=ids, filters=filters, yes=yes, dry_run=dry_run, as_json=as_json)
    if done is not None:
        report_changes("retried", "job", done, _skipped(app, ids, done), as_json)


@click.command()
@click.argument("job_ids", nargs=-1)
@job_filters(CANCELLABLE)
@click.option("--reason", help="Recorded as last_error.")
@bulk_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cancel(ctx: click.Context, job_ids, kind, queue, states, since, until, reason, yes, dry_run, as_json) -> None:
    """Cancel pending, held or running jobs (a running task stops at its next heartbeat): by id, or every
    job matching the filters.

    More than a hundred jobs are counted and asked about first (--yes to go
    ahead, --dry-run to look).

    Example: joblane cancel --kind enrich_lead --state pending
    """
    filters = {"kind": kind, "queue": queue, "state": list(states) or None, "since": since, "until": until}
    ids = _ids_or_filter(job_ids, filters, False, "--kind, --queue, --state, --since or --until")
    app = app_from_context(ctx)
    done = bulk(app, "cancel", lambda: app.cancel(ids=ids, reason=reason, **filters), ids=ids, filters=filters,
                yes=yes, dry_run=dry_run, as_json=as_json)
    if done is not None:
        report_changes("cancelled", "job", done, _skipped(app, ids, done), as_json)


COMMANDS = (migrate, worker, status, jobs, retry, cancel)
