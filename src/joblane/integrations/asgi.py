"""A lifespan for FastAPI and Starlette: a connection pool for request handlers, and optionally a worker.

::

    api = FastAPI(lifespan=joblane.integrations.asgi.lifespan(jobs))

    @api.post("/leads")
    async def create_lead(request: Request):
        async with request.state.joblane_pool.acquire() as conn, conn.transaction():
            ...                                        # your INSERT
            await jobs.enqueue_async(conn, "enrich_lead", {...})

The state the lifespan yields (``request.state`` in handlers) holds
``joblane_pool`` (an asyncpg pool on the app's database, or None with
``pool=False``, e.g. when handlers enqueue on their SQLAlchemy
``AsyncSession``) and ``joblane_worker`` (the in-process worker, or None).

``worker=True`` runs the app's worker in the web process for as long as it
serves: handy for a small service, a demo or tests. Production usually runs
``joblane worker`` as its own process, so the two scale and restart apart.

Inside a lifespan of your own::

    @contextlib.asynccontextmanager
    async def app_lifespan(api):
        async with joblane_lifespan(jobs)(api) as state:
            ...
            yield {**state, "other": thing}
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable

import asyncpg

from ..app import App
from ..errors import JoblaneError


def lifespan(
    app: App,
    *,
    pool: bool = True,
    pool_min_size: int = 1,
    pool_max_size: int = 10,
    worker: bool = False,
    **worker_options: Any,
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """A lifespan function for ``FastAPI(lifespan=...)`` / ``Starlette(lifespan=...)``.

    ``worker_options`` go to ``joblane.worker.Worker`` (queues, concurrency,
    grace_seconds, ...). On shutdown the worker stops claiming and its
    running jobs get ``grace_seconds`` to finish.
    """

    @contextlib.asynccontextmanager
    async def run(_asgi_app: Any) -> AsyncIterator[dict[str, Any]]:
        connections = None
        running = None
        runner: asyncio.Task | None = None
        try:
            if pool:
                connections = await asyncpg.create_pool(app.dsn, min_size=pool_min_size, max_size=pool_max_size)
            if worker:
                from ..worker import Worker

                running = Worker(app, **worker_options)
                runner = asyncio.create_task(running.run(install_signals=False), name="joblane worker")
                started = asyncio.create_task(running.started.wait())
                await asyncio.wait([runner, started], return_when=asyncio.FIRST_COMPLETED)
                if runner.done():  # it failed to start (no schema, no database): say so at start-up
                    started.cancel()
                    runner.result()
                    raise JoblaneError("the joblane worker stopped as it started")
            yield {"joblane_pool": connections, "joblane_worker": running}
        finally:
            if runner is not None and not runner.done():
                running.request_stop()
                await runner
            if connections is not None:
                await connections.close()

    return run
