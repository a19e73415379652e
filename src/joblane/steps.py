"""Checkpointed steps: ``await job.step("classify", call_model, text)`` runs once per job.

A step's JSON result is written (in its own short transaction) as soon as
the step succeeds. When the job is tried again, a finished step returns its
stored result instead of running again, so a job with three model calls
that fails on the third does not pay for the first two twice.

A cached step (``cache=True``) may also reuse the result of an identical call
made by any other job: ``step_cache`` keys it by the step name and a stable
hash of the arguments, the model and the prompt version the task recorded
(or an explicit ``cache_key``). A hit calls nothing and is recorded on the
attempt (``meta.cache``: the key, and the tokens and cost the call recorded
with ``job.record`` while it ran, now saved). The first job to claim a key
makes the call; a job that finds the key claimed waits for that result (up to
``CACHE_WAIT`` seconds, then calls on its own), so two racing jobs make one call.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import time
from typing import Any, Callable

from . import store
from .errors import JoblaneError
from .rules import parse_duration
from .store import Store

log = logging.getLogger("joblane.worker")

CACHE_WAIT = 120.0  # how long a job waits for another job's call on the same key (its claim lasts as long)
USAGE_FIELDS = ("tokens", "input_tokens", "output_tokens", "cost")  # what a hit saves, from job.record


def cache_key(name: str, args: tuple, kwargs: dict, meta: dict[str, Any], explicit: str | None = None) -> str:
    """The cache key of a step: its name and a hash of its arguments, model and prompt version (or ``explicit``)."""
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit:
            raise JoblaneError(f"step {name!r}: cache_key must be a non-empty string, got {explicit!r}")
        basis: Any = ["key", explicit]
    else:
        basis = ["call", list(args), kwargs, meta.get("model"), meta.get("prompt_version")]
    try:
        text = json.dumps(basis, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        raise JoblaneError(f"step {name!r}: cache=True hashes the step's arguments as JSON and these are not;"
                           f" pass cache_key=... (a string naming the call)") from None
    return f"{name}:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}"


def _usage(meta: dict[str, Any]) -> dict[str, float]:
    return {k: float(meta[k]) for k in USAGE_FIELDS
            if isinstance(meta.get(k), (int, float)) and not isinstance(meta.get(k), bool)}


def _dumps(name: str, value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise JoblaneError(f"step {name!r} returned a value that is not JSON-serialisable: {exc}") from None


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
        text = _dumps(name, value)
        await self._save(name, text)
        done[name] = json.loads(text)  # what a retry will see
        return done[name]

    async def run_cached(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict, *,
                         meta: dict[str, Any], ttl: Any = "7d", key: str | None = None) -> Any:
        """``run`` whose result any job may reuse for an identical call (see the module's text)."""
        if not isinstance(name, str) or not name or len(name) > 200:
            raise JoblaneError(f"a step needs a name of 1-200 characters, got {name!r}")
        ttl_seconds = None if ttl is None else parse_duration(ttl, "ttl")
        done = await self._load()
        if name in done:
            self.replayed.append(name)
            return done[name]
        full_key = cache_key(name, args, kwargs, meta, key)

        async def call() -> Any:
            value = fn(*args, **kwargs)
            return await value if inspect.isawaitable(value) else value

        text = await self._through_cache(name, full_key, call, meta, ttl_seconds)
        await self._save(name, text)
        done[name] = json.loads(text)
        return done[name]

    async def _through_cache(self, name: str, key: str, call: Callable[[], Any], meta: dict[str, Any],
                             ttl_seconds: float | None) -> str:
        """The result of ``call()`` as JSON text: another job's stored result, or this job's call, stored."""
        deadline = time.monotonic() + CACHE_WAIT
        pause = 0.05
        while True:
            claimed = await store.records(self._pool, self._store.cache_claim(key, name, self._job_id, self._attempt,
                                                                               CACHE_WAIT))
            if claimed:
                before = _usage(meta)
                try:
                    text = _dumps(name, await call())
                except BaseException:
                    await store.run(self._pool, self._store.cache_release(key, self._job_id, self._attempt))
                    raise
                after = _usage(meta)
                spent = {k: round(v - before.get(k, 0.0), 12) for k, v in after.items() if v != before.get(k)}
                entry = {**spent, "model": meta.get("model"), "prompt_version": meta.get("prompt_version"),
                         "job_id": self._job_id}
                await store.run(self._pool, self._store.cache_fill(key, self._job_id, self._attempt, text,
                                                                   json.dumps(entry), ttl_seconds))
                meta.setdefault("cache", []).append({"step": name, "key": key, "hit": False})
                return text
            hit = await store.records(self._pool, self._store.cache_hit(key))
            if hit:
                result, stored = hit[0]
                entry = json.loads(stored) if stored else {}
                note: dict[str, Any] = {"step": name, "key": key, "hit": True, "from_job": entry.get("job_id")}
                for field in USAGE_FIELDS:
                    if isinstance(entry.get(field), (int, float)):
                        note[f"{field}_saved"] = entry[field]
                meta.setdefault("cache", []).append(note)
                return result
            if time.monotonic() > deadline:
                log.warning("step %s: waited %.0fs for another job's call on the same cache key; calling", name,
                            CACHE_WAIT)
                return _dumps(name, await call())
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 1.0)

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
