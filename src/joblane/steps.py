"""Checkpointed steps: ``await job.step("classify", call_model, text)`` runs once per job.

A step's JSON result is written (in its own short transaction) as soon as
the step succeeds. When the job is tried again, a finished step returns its
stored result instead of running again, so a job with three model calls
that fails on the third does not pay for the first two twice.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, Callable

from . import store
from .errors import JoblaneError
from .store import Store


class Steps:
    """The step store of one try of one job; the worker attaches it to ``Job``."""

    def __init__(self, pool: Any, store: Store, job_id: int, attempt: int, loop: asyncio.AbstractEventLoop):
        self._pool = pool
        self._store = store
        self._job_id = job_id
        self._attempt = attempt
        self._loop = loop
        self._done: dict[str, Any] | None = None
        self.replayed: list[str] = []  # steps answered from the store in this try

    async def _load(self) -> dict[str, Any]:
        if self._done is None:
            rows = await store.records(self._pool, self._store.job_steps(self._job_id))
            self._done = {name: (json.loads(result) if result is not None else None) for name, result in rows}
        return self._done

    async def _save(self, name: str, text: str) -> None:
        await store.run(self._pool, self._store.save_step(self._job_id, name, self._attempt, text))

    async def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise JoblaneError(f"a step needs a name of 1-200 characters, got {name!r}")
        done = await self._load()
        if name in done:
            self.replayed.append(name)
            return done[name]
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        try:
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise JoblaneError(f"step {name!r} returned a value that is not JSON-serialisable: {exc}") from None
        await self._save(name, text)
        done[name] = json.loads(text)  # what a retry will see
        return done[name]

    def run_sync(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``run`` from a plain (threaded) task: the store's I/O goes through the worker's loop."""
        if inspect.iscoroutinefunction(fn):
            raise JoblaneError(f"step {name!r}: step_sync takes a plain function; await job.step(...) for async ones")

        async def load() -> dict[str, Any]:
            return await self._load()

        done = asyncio.run_coroutine_threadsafe(load(), self._loop).result()
        if name in done:
            self.replayed.append(name)
            return done[name]
        value = fn(*args, **kwargs)
        try:
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise JoblaneError(f"step {name!r} returned a value that is not JSON-serialisable: {exc}") from None
        asyncio.run_coroutine_threadsafe(self._save(name, text), self._loop).result()
        done[name] = json.loads(text)
        return done[name]
