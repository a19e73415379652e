"""Run one claimed job and turn what happened into an Outcome. No SQL here."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import traceback
from concurrent.futures import Executor
from typing import Any

from ..app import Task
from ..errors import Hold, PermanentError, RetryAfter
from ..types import (
    DONE,
    FAILED,
    HELD,
    OUTCOME_DONE,
    OUTCOME_FAILED,
    OUTCOME_HELD,
    OUTCOME_RETRY,
    OUTCOME_SNOOZED,
    PENDING,
    Job,
    Outcome,
)

ERROR_LIMIT = 4000


def describe(exc: BaseException) -> str:
    """One line for last_error: the exception type and message, NUL-free and bounded."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.replace("\x00", "\\0").replace("\n", " ")[:ERROR_LIMIT]


def _json_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, default=str, separators=(",", ":")).replace("\\u0000", "\\\\0")


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


async def execute(task: Task | None, job: Job, threads: Executor | None) -> Outcome:
    """Run ``job`` with ``task`` and return its outcome.

    ``asyncio.CancelledError`` propagates: the worker decides whether a
    cancelled job is given back (shutdown) or was revoked (cancelled by an admin).
    """
    started = now()
    meta_extra: dict[str, Any] = {}
    try:
        if task is None:
            raise PermanentError(
                f"unknown task kind {job.kind!r} in queue {job.queue!r}: "
                "is the module that defines it imported by the worker?"
            )
        if task.is_async:
            call = task.fn(job)
        else:
            call = asyncio.get_running_loop().run_in_executor(threads, task.fn, job)
        if task.timeout is not None:
            try:
                value = await asyncio.wait_for(call, task.timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"task {job.kind!r} timed out after {task.timeout:g}s") from None
        else:
            value = await call
        result = None
        if value is not None:
            try:
                result = json.dumps(value, allow_nan=False, separators=(",", ":"))
            except (TypeError, ValueError) as exc:
                raise PermanentError(f"task returned a value that is not JSON-serialisable: {exc}") from None
            if "\\u0000" in result:
                raise PermanentError("task returned a value with a NUL character, which jsonb cannot store")
        return _outcome(job, DONE, OUTCOME_DONE, started, result=result)
    except asyncio.CancelledError:
        raise
    except RetryAfter as exc:
        meta_extra["retry_after"] = exc.seconds
        if exc.pause_queue:
            meta_extra["pause_queue"] = True
        return _outcome(job, PENDING, OUTCOME_SNOOZED, started, error=describe(exc), delay=exc.seconds,
                        refund=1, extra=meta_extra)
    except Hold as exc:
        if exc.data is not None:
            meta_extra["hold_data"] = exc.data
        return _outcome(job, HELD, OUTCOME_HELD, started, error=describe(exc),
                        result=_json_or_none(exc.data), extra=meta_extra)
    except PermanentError as exc:
        return _outcome(job, FAILED, OUTCOME_FAILED, started, error=describe(exc))
    except Exception as exc:  # any other error is transient until the budget is spent
        meta_extra["traceback"] = "".join(traceback.format_exception(exc))[-ERROR_LIMIT:].replace("\x00", "")
        if job.attempt >= job.max_attempts:
            return _outcome(job, FAILED, OUTCOME_FAILED, started,
                            error=f"gave up after {job.attempt} attempts: {describe(exc)}", extra=meta_extra)
        delay = task.backoff(job.attempt) if task is not None else 0.0
        return _outcome(job, PENDING, OUTCOME_RETRY, started, error=describe(exc), delay=delay, extra=meta_extra)


def give_back(job: Job, started: dt.datetime | None, reason: str) -> Outcome:
    """A job the worker could not finish before shutting down: pending again, attempt not spent."""
    return _outcome(job, PENDING, OUTCOME_SNOOZED, started or now(), error=reason, refund=1)


def _outcome(job: Job, state: str, outcome: str, started: dt.datetime, *, error: str | None = None,
             delay: float = 0.0, refund: int = 0, result: str | None = None,
             extra: dict[str, Any] | None = None) -> Outcome:
    meta = dict(job.meta)
    if extra:
        meta.update(extra)
    return Outcome(
        job_id=job.id,
        attempt=job.attempt,
        state=state,
        outcome=outcome,
        error=error,
        delay=float(delay),
        refund=refund,
        result=result,
        started_at=started,
        finished_at=now(),
        meta=_json_or_none(meta) if meta else None,
    )
