"""`joblane batches`, `joblane batches show ID`, `joblane waiting`, `joblane signal KEY`: workflows from the shell."""

from __future__ import annotations

import json

import click

from .common import Fail, Once, Table, app_from_context, console, emit_json, print_table, run_or_fail, show_time


def _progress(b: dict) -> str:
    finished = b["done"] + b["failed"] + b["cancelled"]
    return f"{finished}/{b['total']}"


@click.group(invoke_without_command=True)
@click.option("--unfinished", is_flag=True, help="Only batches whose callback has not come yet.")
@click.option("--before", "before_id", type=int, help="Only ids below this (next page).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def batches(ctx: click.Context, unfinished: bool, before_id: int | None, limit: int, as_json: bool) -> None:
    """Batches newest first, with their jobs counted by state (`joblane batches show ID` for one)."""
    if ctx.invoked_subcommand:
        return
    app = app_from_context(ctx)
    # one row past the page says whether older ones exist (a full page alone does not)
    rows = run_or_fail(lambda: app.list_batches(before_id=before_id, limit=limit if as_json else limit + 1,
                                                unfinished=unfinished))
    if as_json:
        emit_json(rows)
        return
    more, rows = len(rows) > limit, rows[:limit]
    if not rows:
        console.print("no batches match")
        return
    table = Table()
    for col in ("id", "name", "state", "finished", "done", "failed", "cancelled", "pending", "running", "held",
                "waiting", "callback", "created"):
        table.add_column(col, overflow="fold")
    for b in rows:
        table.add_row(str(b["id"]), b["name"] or "-", b["state"], _progress(b), str(b["done"]), str(b["failed"]),
                      str(b["cancelled"]), str(b["pending"]), str(b["running"]), str(b["held"]), str(b["waiting"]),
                      str(b["callback_job_id"] or b["on_complete"] or "-"), show_time(b["created_at"]))
    print_table(table)
    if more:
        console.print(f"[dim]more: --before {rows[-1]['id']}[/dim]")


@batches.command("show")
@click.argument("batch_id", type=int)
@click.option("--state", cls=Once, help="Only its jobs in this state.")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 100_000),
              help="Most jobs listed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def batches_show(ctx: click.Context, batch_id: int, state: str | None, limit: int, as_json: bool) -> None:
    """One batch: its progress, its callback, and its jobs with what each waits on."""
    app = app_from_context(ctx)
    batch = run_or_fail(lambda: app.batch_progress(batch_id))
    if batch is None:
        raise Fail(f"no batch {batch_id} in schema {app.schema}")
    jobs = run_or_fail(lambda: app.batch_jobs(batch_id, state=state, limit=limit))
    if as_json:
        emit_json({**batch, "jobs": jobs})
        return
    head = Table(show_header=False, title=f"batch {batch_id}")
    head.add_row("name", batch["name"] or "-")
    head.add_row("state", batch["state"])
    head.add_row("finished", f"{_progress(batch)} (done {batch['done']}, failed {batch['failed']}, "
                             f"cancelled {batch['cancelled']})")
    head.add_row("unfinished", f"pending {batch['pending']}, running {batch['running']}, held {batch['held']}, "
                               f"waiting {batch['waiting']}")
    head.add_row("callback", f"{batch['on_complete'] or '-'}"
                             + (f" (job {batch['callback_job_id']})" if batch["callback_job_id"] else ""))
    head.add_row("created", show_time(batch["created_at"]))
    head.add_row("sealed", show_time(batch["sealed_at"]) if batch["sealed_at"] else "no (jobs may still join)")
    head.add_row("finished at", show_time(batch["finished_at"]) if batch["finished_at"] else "-")
    print_table(head)
    table = Table()
    for col in ("id", "kind", "state", "attempts", "waits on", "last error"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        table.add_row(str(j["id"]), j["kind"], j["state"], f"{j['attempts']}/{j['max_attempts']}",
                      j["waits_on"] or "-", (j["last_error"] or "")[:80])
    if jobs:
        print_table(table)
    if len(jobs) == limit:
        console.print(f"[dim]the first {limit} jobs; --limit for more[/dim]")


@click.command()
@click.option("--queue", cls=Once, help="Only this queue.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def waiting(ctx: click.Context, queue: str | None, limit: int, as_json: bool) -> None:
    """Waiting jobs, oldest first, with the signal or the parents each waits for."""
    app = app_from_context(ctx)
    rows = run_or_fail(lambda: app.waiting_jobs(queue=queue, limit=limit))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no waiting jobs")
        return
    table = Table()
    for col in ("id", "queue", "kind", "waits on", "deadline", "created"):
        table.add_column(col, overflow="fold")
    for r in rows:
        on = f"signal {r['wait_key']}" if r["wait_key"] else f"{r['parents_left']} parent(s)"
        table.add_row(str(r["id"]), r["queue"], r["kind"], on, show_time(r["deadline"]) if r["deadline"] else "-",
                      show_time(r["created_at"]))
    print_table(table)


@click.command()
@click.argument("key")
@click.option("--data", help="JSON data for the woken jobs (job.signal).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def signal(ctx: click.Context, key: str, data: str | None, as_json: bool) -> None:
    """Send signal KEY: wake the jobs waiting for it, or keep it for the first that will."""
    try:
        value = json.loads(data) if data is not None else None
    except ValueError as exc:
        raise Fail(f"--data is not JSON: {exc}") from None
    app = app_from_context(ctx)

    def send() -> int:
        with app.connect() as conn:
            return app.signal(conn, key, value)

    woken = run_or_fail(send)
    if as_json:
        emit_json({"key": key, "woken": woken})
    elif woken:
        console.print(f"signal {key}: woke {woken} job{'s' if woken != 1 else ''}")
    else:
        console.print(f"signal {key}: no job waits for it yet; kept for the first that does")


COMMANDS = (batches, waiting, signal)
