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
