"""Rows, states and outcomes shared by every part of joblane (imports nothing from joblane)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

PENDING = "pending"
RUNNING = "running"
DONE = "done"
FAILED = "failed"
HELD = "held"
CANCELLED = "cancelled"

JOB_STATES = (PENDING, RUNNING, DONE, FAILED, HELD, CANCELLED)
UNFINISHED_STATES = (PENDING, RUNNING, HELD)

# attempts.outcome
OUTCOME_DONE = "done"
OUTCOME_RETRY = "retry"
OUTCOME_SNOOZED = "snoozed"
OUTCOME_FAILED = "failed"
OUTCOME_HELD = "held"
OUTCOME_LOST = "lost"


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
    _steps: Any = field(default=None, repr=False, compare=False)

    async def step(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (plain or async) once per job: a retry gets the stored JSON result.

        ``await job.step("classify", call_model, text)``. The result is saved
        as soon as the step succeeds, so a failure in a later step does not
        repeat this one. Step names are unique within a job.
        """
        if self._steps is None:
            raise RuntimeError("job.step needs a worker (or joblane.testing.drain) to run the job")
        return await self._steps.run(name, fn, *args, **kwargs)

    def step_sync(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``step`` for plain (threaded) tasks."""
        if self._steps is None:
            raise RuntimeError("job.step_sync needs a worker (or joblane.testing.drain) to run the job")
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


@dataclass(slots=True)
class Outcome:
    """What became of one try; the completer writes many of these at once."""

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
