"""Rows, states and outcomes shared by every part of joblane (imports only joblane.errors)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import WaitFor

PENDING = "pending"
RUNNING = "running"
DONE = "done"
FAILED = "failed"
HELD = "held"
CANCELLED = "cancelled"
WAITING = "waiting"  # for its parents (after=) or for a signal (WaitFor); the claim never reads it

JOB_STATES = (PENDING, RUNNING, DONE, FAILED, HELD, CANCELLED, WAITING)
UNFINISHED_STATES = (PENDING, RUNNING, HELD, WAITING)
FINISHED_STATES = (DONE, FAILED, CANCELLED)

# attempts.outcome
OUTCOME_DONE = "done"
OUTCOME_RETRY = "retry"
OUTCOME_SNOOZED = "snoozed"
OUTCOME_FAILED = "failed"
OUTCOME_HELD = "held"
OUTCOME_LOST = "lost"
OUTCOME_WAITING = "waiting"

# what a child does when a parent fails or is cancelled for good
PARENT_FAILURE_POLICIES = ("cancel", "run", "hold")


@dataclass
class Job:
    """One try of a job, as a task sees it.

    ``attempt`` is 1 on the first try. ``record(...)`` attaches metadata to
    this try's row in ``attempts`` (model, prompt version, tokens, cost...).
    """

    id: int
    kind: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    priority: int = 0
    created_at: dt.datetime | None = None
    replay_of: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    signal: Any = None  # the data of the signal that woke this job (WaitFor), else None
    signal_key: str | None = None  # the key of that signal
    _steps: Any = field(default=None, repr=False, compare=False)

    def wait_for_sync(self, key: str, *, timeout: float | None = None, on_timeout: str = "retry") -> Any:
        """The data of signal ``key`` when it woke this job; else park the job until it comes (raises WaitFor)."""
        if self.signal_key == key:
            return self.signal
        raise WaitFor(key, timeout=timeout, on_timeout=on_timeout)

    async def wait_for(self, key: str, *, timeout: float | None = None, on_timeout: str = "retry") -> Any:
        """``data = await job.wait_for("approval:7", timeout=86400)``: ``wait_for_sync`` for async tasks."""
        return self.wait_for_sync(key, timeout=timeout, on_timeout=on_timeout)

    async def step(self, name: str, fn: Any, *args: Any, cache: bool = False, ttl: Any = "7d",
                   cache_key: str | None = None, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (plain or async) once per job: a retry gets the stored JSON result.

        ``await job.step("classify", call_model, text)``. The result is saved
        as soon as the step succeeds, so a failure in a later step does not
        repeat this one. Step names are unique within a job.

        ``cache=True`` lets any job reuse the result of an identical call for
        ``ttl`` (``"7d"``; None: until cleared), keyed by the step name and a
        hash of the arguments, the model and prompt version recorded so far
        (or ``cache_key``). See joblane.steps.
        """
        if self._steps is None:
            raise RuntimeError("job.step needs a worker (or joblane.testing.drain) to run the job")
        if cache:
            return await self._steps.run_cached(name, fn, args, kwargs, meta=self.meta, ttl=ttl, key=cache_key)
        return await self._steps.run(name, fn, *args, **kwargs)

    def step_sync(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``step`` for plain (threaded) tasks."""
        if self._steps is None:
            raise RuntimeError("job.step_sync needs a worker (or joblane.testing.drain) to run the job")
        if {"cache", "ttl", "cache_key"} & kwargs.keys():
            raise ValueError("a cached step is async: await job.step(name, fn, ..., cache=True)")
        return self._steps.run_sync(name, fn, *args, **kwargs)

    def record(self, **fields: Any) -> None:
        """Add fields to this attempt's metadata (stored as ``attempts.meta``)."""
        self.meta.update(fields)

    def settle(self, cost: float) -> None:
        """Report what this try really cost in its queue's weighted limit (tokens, say).

        It replaces the estimate the job reserved when it started, once the
        try has finished (stored as ``attempts.meta.settled_cost``).
        """
        cost = float(cost)
        if not (cost >= 0 and cost != float("inf")):
            raise ValueError(f"settle() takes a finite cost >= 0, got {cost!r}")
        self.meta["settled_cost"] = cost


class Outcome(NamedTuple):
    """What became of one try; the completer writes many of these at once.

    Built by one of the named constructors below, one per final state of a
    try, and never changed afterwards (a tuple: immutable, and built in a
    fraction of a frozen dataclass's time, once per job on the hot path). ``started_at``/``finished_at`` are
    epoch seconds (``time.time()``); ``result`` and ``meta`` are JSON text.
    """

    job_id: int
    attempt: int
    state: str  # the job's next state
    outcome: str  # attempts.outcome
    error: str | None = None
    delay: float = 0.0  # seconds until run_after, when state is pending
    refund: int = 0  # 1 when the try does not spend the attempt budget
    result: str | None = None  # JSON text
    started_at: float | None = None  # epoch seconds (time.time())
    finished_at: float | None = None
    meta: str | None = None  # JSON text
    pause: float = 0.0  # seconds to pause the job's queue (RetryAfter(pause_queue=True))
    lean: bool = False  # done, of a lean task (App.task(lean=True)): the row is deleted, no attempts row
    wait: str | None = None  # WaitFor: the key; the completer parks the job instead of completing it
    timeout: float | None = None  # WaitFor: seconds until on_timeout applies (None: no limit)
    on_timeout: str | None = None  # WaitFor: "retry" or "fail"

    @classmethod
    def done(cls, job_id: int, attempt: int, *, result: str | None = None, started_at: float | None = None,
             finished_at: float | None = None, meta: str | None = None, lean: bool = False) -> Outcome:
        """The task returned: ``done``, with its return value as JSON text (or None).

        ``lean``: the task keeps no history of success, so the job is deleted
        instead (its result and meta are not kept).
        """
        return cls(job_id, attempt, DONE, OUTCOME_DONE, result=result, started_at=started_at,
                   finished_at=finished_at, meta=meta, lean=lean)

    @classmethod
    def retry(cls, job_id: int, attempt: int, *, error: str, delay: float, started_at: float | None = None,
              finished_at: float | None = None, meta: str | None = None) -> Outcome:
        """A transient error: ``pending`` again in ``delay`` seconds; the attempt is spent."""
        return cls(job_id, attempt, PENDING, OUTCOME_RETRY, error=error, delay=delay, started_at=started_at,
                   finished_at=finished_at, meta=meta)

    @classmethod
    def snooze(cls, job_id: int, attempt: int, *, error: str, delay: float, pause: float = 0.0,
               started_at: float | None = None, finished_at: float | None = None,
               meta: str | None = None) -> Outcome:
        """``RetryAfter``: ``pending`` again in ``delay`` seconds, the attempt refunded;
        ``pause`` > 0 pauses the job's whole queue that long."""
        return cls(job_id, attempt, PENDING, OUTCOME_SNOOZED, error=error, delay=delay, refund=1,
                   started_at=started_at, finished_at=finished_at, meta=meta, pause=pause)

    @classmethod
    def give_back(cls, job_id: int, attempt: int, *, reason: str, delay: float = 0.0,
                  started_at: float | None = None, finished_at: float | None = None,
                  meta: str | None = None) -> Outcome:
        """A try the worker did not run or finish (shutdown, a paused queue): a snooze of
        ``delay`` seconds with the attempt refunded."""
        return cls.snooze(job_id, attempt, error=reason, delay=delay, started_at=started_at,
                          finished_at=finished_at, meta=meta)

    @classmethod
    def fail(cls, job_id: int, attempt: int, *, error: str, started_at: float | None = None,
             finished_at: float | None = None, meta: str | None = None) -> Outcome:
        """``PermanentError`` or a spent budget: ``failed``, whatever attempts are left."""
        return cls(job_id, attempt, FAILED, OUTCOME_FAILED, error=error, started_at=started_at,
                   finished_at=finished_at, meta=meta)

    @classmethod
    def hold(cls, job_id: int, attempt: int, *, error: str, data: str | None = None,
             started_at: float | None = None, finished_at: float | None = None,
             meta: str | None = None) -> Outcome:
        """``Hold``: ``held`` until a person releases or rejects it; ``data`` (JSON text) is kept as its result."""
        return cls(job_id, attempt, HELD, OUTCOME_HELD, error=error, result=data, started_at=started_at,
                   finished_at=finished_at, meta=meta)

    @classmethod
    def lost(cls, job_id: int, attempt: int, *, error: str, spent: bool, started_at: float | None = None,
             finished_at: float | None = None, meta: str | None = None) -> Outcome:
        """A try whose worker was lost: ``pending`` again, or ``failed`` when the budget is ``spent``.

        (The rescuer writes these itself in ``rescue_expired``; this is the same outcome as a value.)
        """
        return cls(job_id, attempt, FAILED if spent else PENDING, OUTCOME_LOST, error=error,
                   started_at=started_at, finished_at=finished_at, meta=meta)


    @classmethod
    def waiting(cls, job_id: int, attempt: int, *, key: str, timeout: float | None, on_timeout: str,
                started_at: float | None = None, finished_at: float | None = None,
                meta: str | None = None) -> Outcome:
        """``WaitFor``: ``waiting`` for signal ``key`` with no worker and no lease; the attempt refunded."""
        return cls(job_id, attempt, WAITING, OUTCOME_WAITING, error=f"waiting for {key}", refund=1,
                   started_at=started_at, finished_at=finished_at, meta=meta, wait=key, timeout=timeout,
                   on_timeout=on_timeout)


@dataclass
class JobSpec:
    """One job for ``App.enqueue_many``."""

    kind: str
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    run_after: dt.datetime | None = None
    delay: float | None = None
    max_attempts: int | None = None
    unique_key: str | None = None
    held: bool = False
    after: Any = None  # ids of jobs (or indexes of earlier jobs in the same enqueue_many: -1, -2, ... see App)
    on_parent_failure: str | None = None  # "cancel" (default), "run" or "hold"
    batch: Any = None  # a Batch (App.batch) or its id
