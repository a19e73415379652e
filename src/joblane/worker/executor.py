"""Run one claimed job and turn what happened into an Outcome. No SQL here."""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable

from ..errors import Hold, Interrupted, JoblaneError, PermanentError, RetryAfter, WaitFor, WorkerShutdown
from ..rules import ERROR_LIMIT, bounded_delay, check_json_text, describe, lenient_json
from ..types import Job, Outcome
from .child import ChildLost, run_in_child
from .threads import run_in_thread

if TYPE_CHECKING:  # pragma: no cover
    from ..app import Task


def now() -> float:
    """Epoch seconds: what Outcome.started_at/finished_at hold (cheaper than datetimes on the hot path)."""
    return time.time()


async def execute(task: Task | None, job: Job, threads: Executor | None,  # noqa: C901
                  stop_reason: Callable[[], type[Interrupted]] = lambda: WorkerShutdown) -> Outcome:
    """Run ``job`` with ``task`` and return its outcome.

    ``asyncio.CancelledError`` propagates: the worker decides whether a
    cancelled job is given back (shutdown) or was revoked (cancelled by an admin).
    A plain task's thread or a child process is stopped first (``stop_reason()``
    is raised in the thread): this returns or raises only once the try is over.
    """
    started = now()
    meta_extra: dict[str, Any] = {}
    try:
        if task is None:
            raise PermanentError(
                f"unknown task kind {job.kind!r} in queue {job.queue!r}: "
                "is the module that defines it imported by the worker?"
            )
        if task.executor == "process":
            value = await run_in_child(task.fn, job, task.timeout)
        elif not task.is_async:
            value = await run_in_thread(threads, task.fn, job, task.timeout, stop_reason)
        elif task.timeout is not None:
            try:
                value = await asyncio.wait_for(task.fn(job), task.timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"task {job.kind!r} timed out after {task.timeout:g}s") from None
        else:
            value = await task.fn(job)
        result = None
        if value is not None:
            try:
                result = json.dumps(value, allow_nan=False, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                raise PermanentError(f"task returned a value that is not JSON-serialisable: {exc}") from None
            try:
                check_json_text("the task's return value", result)
            except JoblaneError as exc:
                raise PermanentError(str(exc)) from None
        if task.lean:  # nothing of a lean task's success is kept: no result; what it recorded only for its cost
            return Outcome.done(job.id, job.attempt, started_at=started, finished_at=now(), lean=True,
                                meta=_meta(job) if job.meta else None)
        return Outcome.done(job.id, job.attempt, result=result, started_at=started, finished_at=now(),
                            meta=_meta(job))
    except asyncio.CancelledError:
        raise
    except RetryAfter as exc:
        meta_extra["retry_after"] = exc.seconds
        if exc.pause_queue:
            meta_extra["pause_queue"] = True
        return Outcome.snooze(job.id, job.attempt, error=describe(exc), delay=bounded_delay(exc.seconds),
                              pause=bounded_delay(exc.seconds) if exc.pause_queue else 0.0,
                              started_at=started, finished_at=now(), meta=_meta(job, meta_extra))
    except Hold as exc:
        if exc.data is not None:
            meta_extra["hold_data"] = exc.data
        return Outcome.hold(job.id, job.attempt, error=describe(exc), data=lenient_json(exc.data),
                            started_at=started, finished_at=now(), meta=_meta(job, meta_extra))
    except WaitFor as exc:
        return Outcome.waiting(job.id, job.attempt, key=exc.key, timeout=exc.timeout, on_timeout=exc.on_timeout,
                               started_at=started, finished_at=now(), meta=_meta(job))
    except ChildLost as exc:
        spent = job.attempt >= job.max_attempts
        return Outcome.lost(job.id, job.attempt, error=str(exc) + ("; no attempts left" if spent else ""),
                            spent=spent, started_at=started, finished_at=now(), meta=_meta(job))
    except PermanentError as exc:
        return Outcome.fail(job.id, job.attempt, error=describe(exc), started_at=started, finished_at=now(),
                            meta=_meta(job))
    except Exception as exc:  # any other error is transient until the budget is spent
        told = getattr(exc, "child_traceback", None) or "".join(traceback.format_exception(exc))
        meta_extra["traceback"] = told[-ERROR_LIMIT:].replace("\x00", "")
        if job.attempt >= job.max_attempts:
            return Outcome.fail(job.id, job.attempt, error=f"gave up after {job.attempt} attempts: {describe(exc)}",
                                started_at=started, finished_at=now(), meta=_meta(job, meta_extra))
        # a user's backoff may answer NaN, a negative number or infinity: bounded_delay makes it storable
        delay = bounded_delay(task.backoff(job.attempt)) if task is not None else 0.0
        return Outcome.retry(job.id, job.attempt, error=describe(exc), delay=delay, started_at=started,
                             finished_at=now(), meta=_meta(job, meta_extra))


def give_back(job: Job, started: float | None, reason: str, *, delay: float = 0.0) -> Outcome:
    """A job the worker did not run or finish (shutdown, a paused queue): pending again in
    ``delay`` seconds, attempt not spent."""
    return Outcome.give_back(job.id, job.attempt, reason=reason, delay=bounded_delay(delay),
                             started_at=started or now(), finished_at=now(), meta=_meta(job))


def _meta(job: Job, extra: dict[str, Any] | None = None) -> str | None:
    """``attempts.meta`` of this try: what the task recorded, the steps answered from the store, ``extra``."""
    meta = dict(job.meta)
    steps = job._steps
    if steps is not None and steps.replayed:
        meta["steps_reused"] = list(steps.replayed)
    if extra:
        meta.update(extra)
    return lenient_json(meta) if meta else None
