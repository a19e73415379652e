"""`joblane ...`: the command line. A leaf: it reads through App and named queries, no queue logic here."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import json
import logging
import os
import sys
from typing import Any, Callable

import click
import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .app import App
from .errors import JoblaneError
from .types import JOB_STATES

console = Console()
err_console = Console(stderr=True)


class Fail(click.ClickException):
    """A one-line error with exit code 1."""

    def show(self, file=None) -> None:  # noqa: ARG002 - click's signature
        # the message is text, not markup; soft_wrap keeps it on one line at any terminal width
        err_console.print(f"[red]error:[/red] {escape(self.message)}", highlight=False, markup=True, soft_wrap=True)


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the App it names."""
    if ":" not in spec:
        raise Fail(f"APP must look like module:attribute (e.g. myproject.tasks:app), got {spec!r}")
    module_name, attr = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Fail(f"cannot import {module_name!r}: {exc}") from None
    except JoblaneError as exc:  # e.g. App() refusing JOBLANE_SCHEMA while the module loads
        raise Fail(f"cannot load {spec!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise Fail(f"{spec!r} is not a joblane.App (found {type(app).__name__})")
    return app


def _app(ctx: click.Context, spec: str | None = None) -> App:
    if spec:
        app = load_app(spec)
        if ctx.obj["dsn"]:
            app._dsn = ctx.obj["dsn"]
        return app
    try:
        return App(ctx.obj["dsn"], schema=ctx.obj["schema"])
    except (ValueError, JoblaneError) as exc:
        raise Fail(str(exc)) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def emit_json(data: Any) -> None:
    click.echo(json.dumps(_jsonable(data), indent=None, default=str))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def _when(value: dt.datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except JoblaneError as exc:
        raise Fail(str(exc)) from None
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Fail(f"database error: {first}") from None


def _ids(values: tuple[str, ...]) -> list[int]:
    ids = []
    for v in values:
        try:
            ids.append(int(v))
        except ValueError:
            raise Fail(f"job ids are integers, got {v!r}") from None
    return ids


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--database-url", envvar="DATABASE_URL", help="PostgreSQL URL (default: $DATABASE_URL).")
@click.option("--schema", envvar="JOBLANE_SCHEMA", default=None, help="Schema name (default: joblane).")
@click.version_option(package_name="joblane")
@click.pass_context
def main(ctx: click.Context, database_url: str | None, schema: str | None) -> None:
    """joblane: PostgreSQL as your job queue and transactional outbox."""
    ctx.obj = {"dsn": database_url, "schema": schema}


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Create or upgrade joblane's tables (safe to run twice)."""
    app = _app(ctx)
    applied = _run(app.migrate)
    from .migrations import latest_version

    if as_json:
        emit_json({"schema": app.schema, "applied": applied, "version": latest_version()})
    elif applied:
        console.print(f"schema [bold]{app.schema}[/bold]: applied {', '.join(map(str, applied))}; now at version {latest_version()}")
    else:
        console.print(f"schema [bold]{app.schema}[/bold] is up to date (version {latest_version()})")


@main.command()
@click.argument("app_spec", metavar="APP")
@click.option("-q", "--queue", "queues", multiple=True, help="Queue to serve (repeatable; default: the app's task queues).")
@click.option("-c", "--concurrency", default=10, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--claim-batch", type=click.IntRange(1, 10_000), help="Most jobs per claim (default: concurrency).")
@click.option("--poll-interval", default=1.0, show_default=True, type=click.FloatRange(0.01, 3600))
@click.option("--lease", "lease_seconds", type=click.FloatRange(1, 86400), help="Lease length in seconds (default: the app's, 30).")
@click.option("--grace", "grace_seconds", default=30.0, show_default=True, type=click.FloatRange(0, 86400),
              help="Seconds running tasks get to finish after SIGTERM.")
@click.option("--no-listen", is_flag=True, help="Poll only (for PgBouncer in transaction pooling).")
@click.option("--connect-timeout", default=60.0, show_default=True, type=click.FloatRange(0, 86400),
              help="Seconds a starting worker waits for an unreachable database before it exits.")
@click.option("--retention", "retention_seconds", default=7 * 86400.0, show_default=True, type=click.FloatRange(0),
              help="Prune done/cancelled jobs older than this many seconds.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics at http://0.0.0.0:PORT/metrics (needs joblane[telemetry]).")
@click.option("-v", "--verbose", is_flag=True)
@click.pass_context
def worker(ctx: click.Context, app_spec: str, queues: tuple[str, ...], concurrency: int, claim_batch: int | None,
           poll_interval: float, lease_seconds: float | None, grace_seconds: float, no_listen: bool,
           retention_seconds: float, log_format: str, verbose: bool, connect_timeout: float,
           metrics_port: int | None = None) -> None:
    """Run the tasks of APP (module:attribute naming a joblane.App)."""
    from .worker import Worker

    app = _app(ctx, app_spec)
    _setup_logging(log_format, verbose)
    w = _run(lambda: Worker(app, queues=list(queues) or None, concurrency=concurrency, claim_batch=claim_batch,
                            poll_interval=poll_interval, lease_seconds=lease_seconds, grace_seconds=grace_seconds,
                            listen=not no_listen, retention_seconds=retention_seconds,
                            connect_timeout=connect_timeout))
    if metrics_port is not None:
        from .telemetry import serve_metrics

        _run(lambda: serve_metrics(w, metrics_port))
    _run(lambda: asyncio.run(w.run()))


def _setup_logging(fmt: str, verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    handler: logging.Handler
    if fmt == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_JsonFormatter())
    else:
        from rich.logging import RichHandler

        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False)
    logging.basicConfig(level=level, handlers=[handler], format="%(message)s")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
                           "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
                           **getattr(record, "joblane", {})})  # a job outcome's fields (telemetry.py)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Jobs per queue and state, and the age of the oldest ready job."""
    app = _app(ctx)
    rows = _run(app.status)
    if as_json:
        emit_json(rows)
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
        table.add_row(name, *[f"{q[s]:,}" for s in JOB_STATES], _age(q["oldest"]))
    if not per_queue:
        console.print(f"no jobs in schema {app.schema}")
    else:
        console.print(table)


@main.group(invoke_without_command=True)
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--kind")
@click.option("--queue")
@click.option("--before", "before_id", type=int, help="Only ids below this (next page).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs(ctx: click.Context, state, kind, queue, before_id, limit, as_json) -> None:
    """List jobs, newest first (`joblane jobs show ID` for one)."""
    if ctx.invoked_subcommand:
        return
    app = _app(ctx)
    rows = _run(lambda: app.list_jobs(state=state, kind=kind, queue=queue, before_id=before_id, limit=limit))
    if as_json:
        emit_json(rows)
        return
    table = Table()
    for col in ("id", "queue", "kind", "state", "attempts", "run after", "last error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(str(r["id"]), r["queue"], r["kind"], r["state"], f"{r['attempts']}/{r['max_attempts']}",
                      _when(r["run_after"]), (r["last_error"] or "")[:80])
    console.print(table if rows else "no jobs match")
    if len(rows) == limit:
        console.print(f"[dim]more: --before {rows[-1]['id']}[/dim]")


@jobs.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def jobs_show(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """One job with its payload, result and every attempt."""
    app = _app(ctx)
    job = _run(lambda: app.get_job(job_id))
    if job is None:
        raise Fail(f"no job {job_id} in schema {app.schema}")
    if as_json:
        emit_json(job)
        return
    table = Table(show_header=False, title=f"job {job_id}")
    for key in ("kind", "queue", "state", "priority", "attempts", "max_attempts", "run_after", "unique_key",
                "replay_of", "worker", "lease_until", "last_error", "created_at", "finished_at"):
        value = job[key]
        table.add_row(key, _when(value) if isinstance(value, dt.datetime) else ("-" if value is None else str(value)))
    table.add_row("payload", json.dumps(job["payload"], indent=2))
    # a held job's result is the data its task gave to Hold, for the reviewer
    table.add_row("hold data" if job["state"] == "held" else "result",
                  "-" if job["result"] is None else escape(json.dumps(job["result"], indent=2)))
    if job.get("replays"):
        table.add_row("replayed by", ", ".join(f"{r['id']} ({r['state']})" for r in job["replays"]))
    console.print(table)
    if job["attempt_rows"]:
        at = Table(title="attempts")
        for col in ("#", "outcome", "worker", "started", "finished", "error", "meta"):
            at.add_column(col, overflow="fold")
        for a in job["attempt_rows"]:
            at.add_row(str(a["attempt"]), a["outcome"], a["worker"] or "-", _when(a["started_at"]),
                       _when(a["finished_at"]), (a["error"] or "")[:100],
                       json.dumps({k: v for k, v in (a["meta"] or {}).items() if k != "traceback"})[:100])
        console.print(at)


def _report(action: str, asked: list[int] | None, done: list[int], app: App, as_json: bool) -> None:
    skipped: dict[int, str] = {}
    if asked:
        rest = [i for i in asked if i not in set(done)]
        if rest:
            states = app.job_states(rest)
            skipped = {i: states.get(i, "missing") for i in rest}
    if as_json:
        emit_json({action: done, "skipped": {str(k): v for k, v in skipped.items()}})
        return
    console.print(f"{action}: {len(done)} job{'s' if len(done) != 1 else ''}" + (f" ({', '.join(map(str, done[:20]))}{'...' if len(done) > 20 else ''})" if done else ""))
    for i, s in skipped.items():
        console.print(f"[yellow]skipped {i}: {'no such job' if s == 'missing' else 'it is ' + s}[/yellow]")


@main.command()
@click.argument("job_ids", nargs=-1)
@click.option("--kind", help="Retry every failed job of this kind.")
@click.option("--queue", help="Retry every failed job in this queue.")
@click.option("--all-failed", is_flag=True, help="Retry every failed job.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def retry(ctx: click.Context, job_ids, kind, queue, all_failed, as_json) -> None:
    """Put failed (or cancelled, by id) jobs back to pending."""
    ids = _ids(job_ids) if job_ids else None
    if ids is None and not (kind or queue or all_failed):
        raise Fail("give job ids, --kind, --queue or --all-failed")
    if ids is not None and (kind or queue or all_failed):
        raise Fail("give either job ids or a filter, not both")
    app = _app(ctx)
    if all_failed and not (kind or queue):
        done = _run(lambda: app._admin(None, "retry_jobs", [None, None, None, "failed"]))
        done = sorted(r[0] for r in done)
    else:
        done = _run(lambda: app.retry(ids=ids, kind=kind, queue=queue))
    _report("retried", ids, done, app, as_json)


@main.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--reason", help="Recorded as last_error.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cancel(ctx: click.Context, job_ids, reason, as_json) -> None:
    """Cancel pending, held or running jobs (a running task stops at its next heartbeat)."""
    ids = _ids(job_ids)
    app = _app(ctx)
    done = _run(lambda: app.cancel(ids=ids, reason=reason))
    _report("cancelled", ids, done, app, as_json)


from .web.command import dashboard  # noqa: E402 - registered last, after the helpers it uses

main.add_command(dashboard)

from .outbox.cli import outbox, relay  # noqa: E402 - registered last, after the helpers it uses

main.add_command(relay)
main.add_command(outbox)

from .grants import grants  # noqa: E402 - registered last, after the helpers it uses

main.add_command(grants)

from .review_commands import COMMANDS as _review_commands  # noqa: E402 - registered last, after the helpers it uses

for _command in _review_commands:
    main.add_command(_command)

def _register_bench() -> None:
    from .bench_commands import bench_command

    main.add_command(bench_command)


_register_bench()

from .demo import demo as _demo  # noqa: E402 - registered last, after the helpers it uses

main.add_command(_demo)

if __name__ == "__main__":  # pragma: no cover
    main()
