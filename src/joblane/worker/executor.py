"""Run one claimed job and turn what happened into an Outcome. No SQL here."""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import time
import traceback
from concurrent.futures import Executor
from typing import Any

from ..app import JoblaneError, Task
from ..rules import MAX_DELAY as _MAX_DELAY, NUL_ESCAPE as _NUL_ESCAPE, check_json_text, has_lone_surrogate
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
    """One line for last_error: the exception type and message, NUL-free, valid UTF-8 and bounded."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the outcome
        message = "(message could not be read)"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    # lone surrogates (bytes decoded with surrogateescape) cannot be sent as UTF-8
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\x00", "\\0").replace("\n", " ")[:ERROR_LIMIT]


def _json_or_none(value: Any) -> str | None:
    """JSON for metadata and hold data that PostgreSQL always accepts.

    One outcome that jsonb refuses would fail the whole completion batch on
    every retry, so what it cannot store is replaced instead: NaN and
    infinities by null, NUL by "\\0", lone surrogates by "?".
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        try:
            text = json.dumps(json.loads(json.dumps(value, default=str), parse_constant=lambda _: None),
                              separators=(",", ":"))
        except (TypeError, ValueError):  # circular or odd keys: keep a readable trace of it
            text = json.dumps(repr(value))
    text = _NUL_ESCAPE.sub(r"\1\\\\0", text)
    if has_lone_surrogate(text):
        text = json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _bounded(seconds: Any) -> float:
    """A delay PostgreSQL can add to now() (a backoff or RetryAfter may say NaN, inf or 1e300)."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return 0.0
    if seconds != seconds or seconds < 0:
        return 0.0
    return min(seconds, _MAX_DELAY)


def now() -> float:
    """Epoch seconds: what Outcome.started_at/finished_at hold (cheaper than datetimes on the hot path)."""
    return time.time()


async def execute(task: Task | None, job: Job, threads: Executor | None) -> Outcome:  # noqa: C901
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
            # the thread sees this task's context (the run span, so the task's own spans nest under it)
            call = asyncio.get_running_loop().run_in_executor(threads, contextvars.copy_context().run, task.fn, job)
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
            try:
                check_json_text("the task's return value", result)
            except JoblaneError as exc:
                raise PermanentError(str(exc)) from None
        return _outcome(job, DONE, OUTCOME_DONE, started, result=result)
    except asyncio.CancelledError:
        raise
    except RetryAfter as exc:
        meta_extra["retry_after"] = exc.seconds
        if exc.pause_queue:
            meta_extra["pause_queue"] = True
        snoozed = _outcome(job, PENDING, OUTCOME_SNOOZED, started, error=describe(exc), delay=exc.seconds,
                           refund=1, extra=meta_extra)
        if exc.pause_queue:
            snoozed.pause = _bounded(exc.seconds)
        return snoozed
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


def give_back(job: Job, started: float | None, reason: str) -> Outcome:
    """A job the worker could not finish before shutting down: pending again, attempt not spent."""
    return _outcome(job, PENDING, OUTCOME_SNOOZED, started or now(), error=reason, refund=1)


def _outcome(job: Job, state: str, outcome: str, started: float, *, error: str | None = None,
             delay: float = 0.0, refund: int = 0, result: str | None = None,
             extra: dict[str, Any] | None = None) -> Outcome:
    delay = float(delay)
    if not math.isfinite(delay) or delay < 0:  # a user's backoff function returned nonsense
        delay = 0.0 if delay != float("inf") else 10 * 365 * 86400.0
    meta = dict(job.meta)
    steps = job._steps
    if steps is not None and steps.replayed:
        meta["steps_reused"] = list(steps.replayed)
    if extra:
        meta.update(extra)
    return Outcome(
        job_id=job.id,
        attempt=job.attempt,
        state=state,
        outcome=outcome,
        error=error,
        delay=_bounded(delay),
        refund=refund,
        result=result,
        started_at=started,
        finished_at=now(),
        meta=_json_or_none(meta) if meta else None,
    )
