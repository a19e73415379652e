"""`joblane held|release|reject|replay|attempts|limits`: the review queue, replays, the audit trail, queue limits."""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
import os
import sys
from typing import Any, Iterator

import click
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .. import admin, ratelimit, rules
from ..types import JOB_STATES
from .common import (CONFIRM_OVER, Fail, Once, Table, app_from_context, bulk, bulk_options, console, emit_json,
                     err_console, go_ahead, job_filters, jsonable, print_table, report_changes, run_or_fail, show_time,
                     working)


def _text(value: Any, width: int | None = None) -> str:
    """A table cell: JSON for data, "-" for nothing, never rich markup."""
    if value is None:
        return "-"
    if isinstance(value, dt.datetime):
        return show_time(value)
    text = value if isinstance(value, str) else json.dumps(value)
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return escape(text)


def _patch(sets: tuple[str, ...]) -> dict[str, Any] | None:
    return run_or_fail(lambda: admin.parse_sets(sets)) if sets else None


_SET_HELP = "Set a payload field: key=value (value read as JSON when it parses, else text); repeatable."


# -- the review queue ----------------------------------------------------------


@click.command()
@click.option("--queue", cls=Once)
@click.option("--kind", cls=Once)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def held(ctx: click.Context, queue, kind, limit, as_json) -> None:
    """The review queue: held jobs, longest held first, with the reason and data."""
    app = app_from_context(ctx)
    rows = run_or_fail(lambda: app.held_jobs(queue=queue, kind=kind, limit=limit))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no held jobs")
        return
    now = dt.datetime.now(dt.timezone.utc)
    table = Table(title=f"held jobs (schema {app.schema})")
    for col in ("id", "queue", "kind", "held for", "reason", "data"):
        table.add_column(col, overflow="fold")
    for r in rows:
        held_for = rules.format_age((now - r["held_since"]).total_seconds())
        table.add_row(str(r["id"]), r["queue"], r["kind"], held_for, _text(r["reason"] or "held at enqueue", 80),
                      _text(r["data"], 120))
    print_table(table)
    console.print("[dim]joblane release ID [--set key=value]  |  joblane reject ID --reason TEXT[/dim]")


def _one_or_filter(job_id: int | None, filters: dict[str, Any]) -> bool:
    """True when the command names one job; refuses neither or both."""
    chosen = any(v is not None for v in filters.values())
    if job_id is None and not chosen:
        raise Fail("give a job id or a filter (--kind, --queue, --since, --until)")
    if job_id is not None and chosen:
        raise Fail("give either a job id or a filter, not both")
    return job_id is not None


@click.command()
@click.argument("job_id", type=int, required=False)
@job_filters(None)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=_SET_HELP)
@click.option("--note", help="Recorded with the release in the audit trail.")
@bulk_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def release(ctx: click.Context, job_id: int | None, kind, queue, since, until, sets, note, yes, dry_run,
            as_json) -> None:
    """Send held job JOB_ID (or every held job matching the filters) back to pending, optionally with payload
    fields changed.

    Example: joblane release --kind classify --set prompt_version=v2
    """
    filters = {"kind": kind, "queue": queue, "since": since, "until": until}
    one = _one_or_filter(job_id, filters)
    app = app_from_context(ctx)
    patch = _patch(sets)
    if one and dry_run:  # would it be released: is it held?
        bulk(app, "release", list, ids=[job_id], filters={}, yes=yes, dry_run=True, as_json=as_json)
        return
    if one:
        run_or_fail(lambda: app.release(None, job_id, patch, note=note))
        if as_json:
            emit_json({"released": job_id, "payload_patch": patch or {}})
        else:
            console.print(f"released job {job_id}" + (f" with {escape(json.dumps(patch))}" if patch else ""))
        return
    done = bulk(app, "release", lambda: app.release_held(None, payload_patch=patch, note=note, **filters),
                ids=None, filters=filters, yes=yes, dry_run=dry_run, as_json=as_json)
    if done is None:
        return
    if as_json:
        emit_json({"released": done, "payload_patch": patch or {}})
    else:
        report_changes("released", "job", done, {}, False)
        if patch:
            console.print(f"[dim]with {escape(json.dumps(patch))}[/dim]")
    if patch:  # a payload that is not a JSON object takes no patch: those jobs stayed held
        left, first = run_or_fail(lambda: app.count_matching(action="release", **filters))
        if left:
            err_console.print(f"[yellow]{rules.plural(left, 'matching job')} stayed held ({', '.join(map(str, first))}"
                              f"{'...' * (left > len(first))}): a payload that is not a JSON object takes no --set"
                              "[/yellow]", highlight=False)


@click.command()
@click.argument("job_id", type=int, required=False)
@job_filters(None)
@click.option("--reason", required=True, help="Why it is rejected (recorded as last_error and in the audit trail).")
@bulk_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def reject(ctx: click.Context, job_id: int | None, kind, queue, since, until, reason: str, yes, dry_run,
           as_json) -> None:
    """Cancel held job JOB_ID (or every held job matching the filters), recording why."""
    filters = {"kind": kind, "queue": queue, "since": since, "until": until}
    one = _one_or_filter(job_id, filters)
    app = app_from_context(ctx)
    if one and dry_run:
        bulk(app, "reject", list, ids=[job_id], filters={}, yes=yes, dry_run=True, as_json=as_json)
        return
    if one:
        run_or_fail(lambda: app.reject(None, job_id, reason))
        if as_json:
            emit_json({"rejected": job_id, "reason": reason})
        else:
            console.print(f"rejected job {job_id}: {escape(reason)}")
        return
    done = bulk(app, "reject", lambda: app.reject_held(None, reason, **filters), ids=None, filters=filters,
                yes=yes, dry_run=dry_run, as_json=as_json)
    if done is None:
        return
    if as_json:
        emit_json({"rejected": done, "reason": reason})
    else:
        report_changes("rejected", "job", done, {}, False)


# -- replays -------------------------------------------------------------------


@click.command()
@click.argument("job_ids", nargs=-1, type=int)
@click.option("--kind", cls=Once)
@click.option("--queue", cls=Once)
@click.option("--state", "states", multiple=True, type=click.Choice(JOB_STATES),
              help="Match jobs in this state (repeatable; default: done, failed and cancelled).")
@click.option("--since", help="Finished (or, if unfinished, created) at most this long ago (24h, 30m, 7d) or since an ISO time (UTC unless it has an offset).")
@click.option("--until", help="... and before this (same forms).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=_SET_HELP)
@click.option("--skip-replayed", is_flag=True, help="Leave out jobs that already have a replay.")
@click.option("--limit", type=click.IntRange(1), help="Replay at most this many (oldest ids first).")
@click.option("--dry-run", is_flag=True, help="Show what would be inserted; insert nothing.")
@click.option("--tag", help="Tag the new jobs (e.g. v2-prompt), to weigh them against the originals: joblane compare TAG.")
@click.option("-y", "--yes", is_flag=True,
              help=f"Go ahead without asking, however many jobs match (asked above {CONFIRM_OVER}).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def replay(ctx: click.Context, job_ids, kind, queue, states, since, until, sets, skip_replayed, limit, dry_run,
           tag, yes, as_json) -> None:
    """Insert new jobs copied from matching ones (payload patched, replay_of set); the old rows stay as they are.

    More than a hundred jobs are counted and asked about first (--yes to go
    ahead, --dry-run to look).

    Example: joblane replay --kind classify --state failed --since 24h --set prompt_version=v2
    """
    app = app_from_context(ctx)
    patch = _patch(sets)

    def run(dry: bool) -> list[dict[str, Any]]:
        return run_or_fail(lambda: app.replay(
            None, ids=list(job_ids) or None, kind=kind, queue=queue, state=list(states) or None, since=since,
            until=until, payload_patch=patch, skip_replayed=skip_replayed, limit=limit, dry_run=dry, tag=tag))

    few = (limit is not None and limit <= CONFIRM_OVER) or (job_ids and len(job_ids) <= CONFIRM_OVER)
    n = None
    if not dry_run and not yes and not few:
        with working("counting the jobs to replay"):
            n = len(run(True))
        go_ahead(f"replay {rules.plural(n, 'job')}", n, yes=yes)
    if dry_run:
        rows = run(True)
    else:
        with working(f"replaying {rules.plural(n, 'job')}" if n is not None else "replaying"):
            rows = run(False)
    if as_json:
        emit_json({"dry_run": dry_run, "jobs": rows})
        return
    if not rows:
        console.print("no jobs match: nothing to replay")
        return
    shown = rows[:50]
    table = Table(title=("would insert" if dry_run else "inserted") + f" {len(rows)} job{'s' * (len(rows) != 1)}")
    for col in ("replay of", "new id", "kind", "queue", "was", "payload"):
        table.add_column(col, overflow="fold")
    for r in shown:
        table.add_row(str(r["replay_of"]), "-" if r["id"] is None else str(r["id"]), r["kind"], r["queue"],
                      r["state"], _text(r["payload"], 120))
    print_table(table)
    if len(rows) > len(shown):
        console.print(f"[dim]... and {len(rows) - len(shown)} more (--json lists them all)[/dim]")
    if dry_run:
        console.print("[dim]dry run: nothing was inserted[/dim]")
    elif tag:
        console.print(f"[dim]tagged {escape(tag)}: joblane compare {escape(tag)}[/dim]")


# -- the attempt audit trail ---------------------------------------------------

_OUTCOMES = click.Choice(admin.OUTCOMES)


@click.group(invoke_without_command=True)
@click.option("--kind", cls=Once)
@click.option("--queue", cls=Once)
@click.option("--outcome", type=_OUTCOMES)
@click.option("--model", help="Attempts whose metadata records this model.")
@click.option("--since", help="Finished at most this long ago (24h, 30m, 7d) or since an ISO time (UTC unless it has an offset).")
@click.option("--job", "job_id", type=int, help="Attempts of one job.")
@click.option("--before", "before_id", type=int, help="Only attempt ids below this (next page).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def attempts(ctx: click.Context, kind, queue, outcome, model, since, job_id, before_id, limit, as_json) -> None:
    """List attempts newest first (`joblane attempts export` writes them all as CSV or JSON lines)."""
    if ctx.invoked_subcommand:
        return
    app = app_from_context(ctx)
    # one row past the page says whether older ones exist (a full page alone does not)
    rows = run_or_fail(lambda: app.list_attempts(kind=kind, queue=queue, outcome=outcome, model=model, since=since,
                                                 job_id=job_id, before_id=before_id,
                                                 limit=limit if as_json else limit + 1))
    if as_json:
        emit_json(rows)
        return
    more, rows = len(rows) > limit, rows[:limit]
    if not rows:
        console.print("no attempts match")
        return
    table = Table()
    for col in ("id", "job", "kind", "#", "outcome", "job state", "finished", "ms", "meta", "error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        ms = "-"
        if r["started_at"] and r["finished_at"]:
            ms = f"{(r['finished_at'] - r['started_at']).total_seconds() * 1000:.0f}"
        table.add_row(str(r["id"]), str(r["job_id"]), _text(r["kind"]), str(r["attempt"]), r["outcome"],
                      _text(r["job_state"]), show_time(r["finished_at"]), ms, _text(r["meta"], 80),
                      _text(r["error"], 60))
    print_table(table)
    if more:
        console.print(f"[dim]more: --before {rows[-1]['id']}[/dim]")


# the columns of the CSV export: the attempt, the fields tasks commonly record (model ... settled_cost,
# read from meta), then all of meta as JSON
CSV_COLUMNS = ("id", "job_id", "kind", "queue", "attempt", "outcome", "job_state", "worker", "started_at",
               "finished_at", "latency_ms", "model", "prompt_version", "tokens_in", "tokens_out", "cost",
               "settled_cost", "replay_of", "error", "meta")


@attempts.command("export")
@click.option("--kind", cls=Once)
@click.option("--queue", cls=Once)
@click.option("--outcome", type=_OUTCOMES)
@click.option("--model")
@click.option("--since", help="Finished at most this long ago (24h, 30m, 7d) or since an ISO time (UTC unless it has an offset).")
@click.option("--until", help="Finished before this (same forms).")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="File to write (default: stdout).")
@click.pass_context
def attempts_export(ctx: click.Context, kind, queue, outcome, model, since, until, fmt, output) -> None:
    """Write every matching attempt, oldest first, one per line, with its job's current state.

    Rows stream from the database in pages, so the size of the export does
    not matter. A file is written under a temporary name and renamed when complete.
    """
    app = app_from_context(ctx)
    # the filters, the schema and the query are checked by reading the first row, before a byte is written:
    # a bad filter or an unmigrated schema is one error line, not a CSV header followed by one
    rows = run_or_fail(lambda: app.export_attempts(kind=kind, queue=queue, outcome=outcome, model=model,
                                                   since=since, until=until))
    first = run_or_fail(lambda: next(rows, None))
    rows = itertools.chain([first], rows) if first is not None else iter(())
    partial = f"{output}.partial" if output else None
    out = open(partial, "w", newline="", encoding="utf-8") if partial else sys.stdout
    # progress on a terminal's stderr, unless the rows themselves scroll by on that terminal
    progress = err_console.is_terminal and (partial is not None or not console.is_terminal)

    def counted(items: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if not progress:
            yield from items
            return
        with Progress(SpinnerColumn(), TextColumn("{task.completed:,} attempts written"), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            task = bar.add_task("export")
            for i, item in enumerate(items, 1):
                yield item
                if i % 500 == 0:
                    bar.update(task, completed=i)

    def write() -> int:
        n = 0
        if fmt == "csv":
            writer = csv.writer(out)
            writer.writerow(CSV_COLUMNS)
            for r in counted(rows):
                meta = r["meta"]
                r["started_at"], r["finished_at"] = jsonable(r["started_at"]), jsonable(r["finished_at"])
                r["meta"] = json.dumps(meta)
                # csv writes None as an empty field
                writer.writerow([r[c] if c in r else meta.get(c) for c in CSV_COLUMNS])
                n += 1
        else:
            for r in counted(rows):
                out.write(json.dumps(jsonable(r), default=str) + "\n")
                n += 1
        return n

    try:
        n = run_or_fail(write)
    except BrokenPipeError:  # the reader (| head) stopped early: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except BaseException:
        if partial:
            out.close()
            os.unlink(partial)
        raise
    if partial:
        out.close()
        os.replace(partial, output)
        console.print(f"wrote {rules.plural(n, 'attempt')} to {escape(output)}", highlight=False)


# -- queue limits --------------------------------------------------------------


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def limits(ctx: click.Context, as_json: bool) -> None:
    """Queue rate limits and pauses, with what the current windows hold."""
    if ctx.invoked_subcommand:
        return
    app = app_from_context(ctx)
    rows = run_or_fail(lambda: admin.limits(app))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no queue has limits or a pause")
        return
    now = dt.datetime.now(dt.timezone.utc)
    table = Table(title=f"queue limits (schema {app.schema})")
    for col in ("queue", "starts", "running", "cost", "per key", "paused"):
        table.add_column(col, overflow="fold")
    for r in rows:
        starts = cost = per_key = "-"
        if r["max_starts"] is not None:
            starts = f"{r['starts']}/{r['max_starts']} per {rules.format_span(r['starts_interval'])}"
        running = f"{r['running']}/{r['concurrency']}" if r["concurrency"] is not None else str(r["running"])
        if r["max_cost"] is not None:
            cost = (f"{r['cost']:g}/{r['max_cost']:g} per {rules.format_span(r['cost_interval'])}"
                    f" (estimate {r['estimate'] or '-'}, default {r['default_estimate']:g})")
        if r["per_key"] is not None:
            per_key = f"{r['per_key']} per {r['key']}"
        paused = "-"
        if r["paused_until"] is not None:
            paused = f"{rules.format_age((r['paused_until'] - now).total_seconds())} more" + (
                f": {r['pause_reason']}" if r["pause_reason"] else "")
        table.add_row(r["queue"], starts, running, escape(cost), escape(per_key), escape(paused))
    print_table(table)


@limits.command("set")
@click.argument("queue")
@click.option("--rate", help="Job starts per window: 10/s, 600/min, 100/5s.")
@click.option("--concurrency", type=click.IntRange(1), help="Running jobs at once, all workers together.")
@click.option("--cost", help="Weighted limit per window, e.g. tokens: 90000/min.")
@click.option("--estimate", default="estimated_tokens", show_default=True,
              help="Payload field holding a job's estimated cost (dotted path).")
@click.option("--default-estimate", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Estimate of a job whose payload has none.")
@click.option("--key", help="Payload field of the fairness key (dotted path), with --per-key.")
@click.option("--per-key", type=click.IntRange(1), help="Running jobs at once per key.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def limits_set(ctx: click.Context, queue, rate, concurrency, cost, estimate, default_estimate, key, per_key,
               as_json) -> None:
    """Set (replace) the limits of QUEUE; workers pick them up within seconds.

    A worker whose app declares limits for QUEUE (app.limit) writes those at start.
    """
    app = app_from_context(ctx)
    limit = run_or_fail(lambda: ratelimit.make_limit(queue, rate=rate, concurrency=concurrency, cost=cost,
                                                     estimate=estimate, default_estimate=default_estimate, key=key,
                                                     per_key=per_key))
    run_or_fail(lambda: admin.save_limit(app, limit))
    if as_json:
        emit_json({"queue": queue, "limit": limit.describe()})
    else:
        console.print(f"queue {escape(queue)}: {escape(limit.describe())}")


@limits.command("clear")
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def limits_clear(ctx: click.Context, queue, as_json: bool) -> None:
    """Remove the limits of QUEUE (its jobs go back to the plain claim)."""
    app = app_from_context(ctx)
    if not run_or_fail(lambda: admin.remove_limit(app, queue)):
        raise Fail(f"queue {queue!r} has no limits (see `joblane limits`)")
    if as_json:
        emit_json({"queue": queue, "cleared": True})
    else:
        console.print(f"queue {escape(queue)}: limits removed")


def _seconds(text: str) -> float:
    seconds = rules.duration_or_none(text, bare_seconds=False)
    if not seconds:
        raise Fail(f"--for takes a duration such as 90s, 5m or 1h, got {text!r}")
    return seconds


@limits.command("pause")
@click.argument("queue")
@click.option("--for", "duration", required=True, help="How long: 90s, 5m, 1h.")
@click.option("--reason")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def limits_pause(ctx: click.Context, queue, duration, reason, as_json: bool) -> None:
    """Stop every worker from starting jobs of QUEUE for a while (running jobs carry on)."""
    app = app_from_context(ctx)
    seconds = _seconds(duration)
    until = run_or_fail(lambda: app.pause_queue(None, queue, seconds, reason))
    if as_json:
        emit_json({"queue": queue, "paused_until": until, "reason": reason})
    else:
        console.print(f"queue {escape(queue)} paused until {show_time(until)}")


@limits.command("resume")
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def limits_resume(ctx: click.Context, queue, as_json: bool) -> None:
    """End the pause of QUEUE now."""
    app = app_from_context(ctx)
    if not run_or_fail(lambda: app.resume_queue(None, queue)):
        raise Fail(f"queue {queue!r} is not paused")
    if as_json:
        emit_json({"queue": queue, "resumed": True})
    else:
        console.print(f"queue {escape(queue)} resumed")


COMMANDS = (held, release, reject, replay, attempts, limits)
