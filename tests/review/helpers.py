"""Helpers of the AI-workflow tests: the command line in-process, rows as dicts."""

from __future__ import annotations

import json

from click.testing import CliRunner

from joblane.cli import main
from joblane.queries import quote_ident


def run_cli(app, *args: str):
    """`joblane ARGS` in this process against the app's schema; returns click's Result."""
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "COLUMNS": "200"}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def cli_json(app, *args: str):
    result = run_cli(app, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rows(conn, app, sql: str, params=()) -> list[dict]:
    """Run SQL with {jobs}/{attempts}/... replaced by the app's tables; rows as dicts."""
    names = ("jobs", "attempts", "queue_limits", "queue_pauses", "queue_starts")
    text = sql.format(**{n: f"{quote_ident(app.schema)}.{n}" for n in names})
    cur = conn.execute(text, params)
    cols = [c.name for c in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


async def run_until(app, predicate, timeout: float = 30.0, **worker_options):
    """Run the app's worker in this event loop until ``predicate()`` holds (jobs may wait out a pause)."""
    import asyncio

    from joblane.worker import Worker

    options = {"poll_interval": 0.05, "flush_interval": 0.001, "grace_seconds": 5.0, "listen": False}
    worker = Worker(app, **{**options, **worker_options})
    runner = asyncio.create_task(worker.run(install_signals=False))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while not predicate():
            if loop.time() > deadline or runner.done():
                raise AssertionError(f"condition not met after {timeout}s")
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await runner
