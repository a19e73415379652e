"""Exceptions that tasks raise to steer their job, and errors joblane raises."""

from __future__ import annotations

from typing import Any


class JoblaneError(Exception):
    """A usage or configuration error; the message says what to do."""


class SchemaVersionError(JoblaneError):
    """The database schema is missing or newer than this code."""


class RetryAfter(Exception):
    """Try again after ``seconds`` without spending an attempt (a 429, a rate limit)."""

    def __init__(self, seconds: float, reason: str | None = None, *, pause_queue: bool = False):
        if seconds < 0:
            raise ValueError("RetryAfter seconds must be >= 0")
        self.seconds = float(seconds)
        self.reason = reason
        self.pause_queue = pause_queue
        super().__init__(reason or f"retry after {self.seconds:g}s")


class PermanentError(Exception):
    """The job cannot succeed: fail it now, whatever attempts are left."""


class Hold(Exception):
    """Stop and wait for a person: the job becomes ``held`` until released or rejected."""

    def __init__(self, reason: str, data: Any = None):
        self.reason = reason
        self.data = data
        super().__init__(reason)


class WaitFor(Exception):
    """Park the job until ``app.signal(conn, key, data)``: it waits with no worker and no lease.

    The job runs again when the signal comes, with ``job.signal`` holding its
    data. A signal sent before the wait is kept and consumed by it. After
    ``timeout`` seconds (None: no limit) ``on_timeout`` decides: ``"retry"``
    runs the job again with ``job.signal`` None, ``"fail"`` fails it.
    """

    def __init__(self, key: str, *, timeout: float | None = None, on_timeout: str = "retry"):
        if not isinstance(key, str) or not key or len(key) > 1000 or "\x00" in key:
            raise ValueError(f"WaitFor needs a key of 1-1000 characters, got {key!r}")
        if timeout is not None:
            timeout = float(timeout)
            if not 0 <= timeout <= 10 * 365 * 86400:
                raise ValueError(f"WaitFor timeout must be from 0 to ten years in seconds, got {timeout!r}")
        if on_timeout not in ("retry", "fail"):
            raise ValueError(f"WaitFor on_timeout must be 'retry' or 'fail', got {on_timeout!r}")
        self.key = key
        self.timeout = timeout
        self.on_timeout = on_timeout
        super().__init__(f"waiting for {key}")


class Interrupted(BaseException):
    """Raised inside a plain task's thread to stop it: its timeout passed, its job was cancelled, or its
    worker is shutting down (``reason``).

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in the task does not swallow
    it; ``finally`` blocks and context managers run as it passes. It arrives at the thread's next
    Python bytecode: a thread blocked in C (a socket read, ``time.sleep``) sees it only when that call
    returns, and its job stays leased until then (``executor="process"`` stops such work at once).
    """

    reason = "interrupted"


class TaskTimedOut(Interrupted):
    reason = "timed out"


class TaskCancelled(Interrupted):
    reason = "cancelled"


class WorkerShutdown(Interrupted):
    reason = "shut down"
