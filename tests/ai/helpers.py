"""Helpers of the AI-workflow tests: rows as dicts with {table} names in the app's schema."""

from __future__ import annotations

import asyncio
import contextlib

from joblane.queries import quote_ident

TABLES = ("jobs", "attempts", "budgets", "budget_usage", "budget_holds", "step_cache", "job_steps", "queue_starts",
          "queue_pauses")


def rows(conn, app, sql: str, params=()) -> list[dict]:
    text = sql.format(**{n: f"{quote_ident(app.schema)}.{n}" for n in TABLES})
    cur = conn.execute(text, params)
    cols = [c.name for c in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


@contextlib.asynccontextmanager
async def running_worker(app, **options):
    """The app's worker in this event loop for the length of the block."""
    from joblane.worker import Worker

    worker = Worker(app, **{"poll_interval": 0.05, "flush_interval": 0.001, "grace_seconds": 5.0, "listen": False,
                            **options})
    runner = asyncio.create_task(worker.run(install_signals=False))
    await worker.started.wait()
    try:
        yield worker
    finally:
        worker.request_stop()
        await runner


async def until(predicate, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met after {timeout}s")
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def dashboard(app):
    """The dashboard of ``app`` in-process (Starlette's test client), as a browser on this machine reaches it."""
    import warnings

    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

    from joblane.web import create_app

    with TestClient(create_app(app, refresh_seconds=0), base_url="http://127.0.0.1", follow_redirects=False) as c:
        yield c
