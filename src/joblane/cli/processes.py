"""`joblane workers`: the live workers and relays, from their registrations."""

from __future__ import annotations

import click

from .. import admin, rules
from .common import Table, app_from_context, console, emit_json, print_table, run_or_fail, show_time


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """Live workers and relays: host, pid, version, queues, running jobs, last heartbeat."""
    app = app_from_context(ctx)
    rows = run_or_fail(lambda: admin.processes(app))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no live workers or relays")
        return
    table = Table(box=None, header_style="bold")
    for col in ("name", "role", "host", "pid", "version", "queues", "kinds", "running", "started", "last seen"):
        table.add_column(col, overflow="fold")
    now = rules.utc_now()
    stopping = [r for r in rows if r.get("stopping")]
    for r in rows:
        running = f"{r['running']}/{r['concurrency']}" if r["concurrency"] else str(r["running"])
        table.add_row(r["name"], r["role"], r["host"], str(r["pid"]), r["version"], ",".join(r["queues"]) or "-",
                      str(len(r["kinds"])), running, show_time(r["started_at"]),
                      rules.format_age((now - r["last_seen"]).total_seconds()) + " ago")
    print_table(table)
    for r in stopping:
        console.print(f"{r['name']} is stopping ({rules.format_age(stopping_for(r['stopping']))}): "
                      f"{waiting_on(r['stopping'])}", soft_wrap=True)


def stopping_for(stopping: dict) -> float:
    return max(0.0, rules.utc_now().timestamp() - float(stopping.get("since") or 0))


def waiting_on(stopping: dict) -> str:
    """What keeps a stopping worker alive: "job 5 (ocr) running 40s, told to stop 8s ago"."""
    parts = []
    for j in stopping.get("jobs") or []:
        text = f"job {j['id']} ({j['kind']})"
        if j.get("running") is not None:
            text += f" running {rules.format_age(j['running'])}"
        if j.get("told") is not None:
            text += f", told to stop {rules.format_age(j['told'])} ago"
        parts.append(text)
    return "; ".join(parts) or "its last outcomes"


COMMANDS = (workers,)
