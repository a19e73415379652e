"""joblane: PostgreSQL as your job queue and transactional outbox."""

from .app import App, Task
from .errors import (Hold, Interrupted, JoblaneError, PermanentError, RetryAfter, SchemaVersionError, TaskCancelled,
                     TaskTimedOut, WaitFor, WorkerShutdown)
from .flows import Batch
from .types import Job, JobSpec

__version__ = "0.1.0"

__all__ = [
    "App",
    "Batch",
    "Hold",
    "Interrupted",
    "Job",
    "JobSpec",
    "JoblaneError",
    "PermanentError",
    "RetryAfter",
    "SchemaVersionError",
    "Task",
    "TaskCancelled",
    "TaskTimedOut",
    "WaitFor",
    "WorkerShutdown",
]
