"""Plain ``def`` tasks in the worker's threads, and how they are stopped.

A thread cannot be killed. Until now a timeout, a cancel or the end of the
shutdown grace stopped waiting for a plain task's thread, not the thread: its
job was given back (or retried) while the task went on running, and another
worker could start it beside the first. Here a try that is told to stop
gets an exception raised inside its thread (``PyThreadState_SetAsyncExc``,
as Dramatiq's time limits do), and the try is over only when its thread
has returned: until then ``run_in_thread`` does not return, so the job
stays in the worker's active jobs and its lease is extended.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import logging
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable

from ..errors import Interrupted, TaskTimedOut

log = logging.getLogger("joblane.worker")

# prototypes of our own: setting argtypes on ctypes.pythonapi's shared function would change it for everyone
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))

# how often a try that was told to stop and has not is named in the log
STILL_RUNNING_EVERY = 10.0


class ThreadTry:
    """One call of a plain task in a pool thread, which another thread can interrupt.

    At most one exception is ever raised into the thread, and only while the
    task's own call runs: once the call has returned the try is marked over
    under the lock, and anything still pending is cleared, so an interruption
    never reaches the pool's next task or its loop.
    """

    def __init__(self, fn: Callable[..., Any], *args: Any):
        self.fn = fn
        self.args = args
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._running = False
        self.interrupted: type[Interrupted] | None = None  # what it was told, once
        self.told_at: float | None = None  # monotonic time it was told to stop

    def __call__(self) -> Any:
        with self._lock:
            self._ident = threading.get_ident()
            self._running = True
            if self.interrupted is not None:  # told to stop before it began: do not begin
                self._running = False
                raise self.interrupted()
        try:
            return self.fn(*self.args)
        finally:
            self._end()

    def _end(self) -> None:
        # An interruption set just as the call returned may be delivered anywhere in here: catch it
        # and finish the job of marking the try over, which stops any further one from being set.
        while True:
            try:
                with self._lock:
                    self._running = False
                    told = self.interrupted is not None
                if told:  # none was ever set otherwise: the common case pays no call into the C API
                    _clear_async_exc(self._ident, None)  # NULL: clear one that is still pending
                return
            except Interrupted:
                continue

    def interrupt(self, kind: type[Interrupted]) -> bool:
        """Raise ``kind`` in the task's thread at its next bytecode; False when it is not running (any more)."""
        with self._lock:
            if self.interrupted is not None:
                return self._running
            self.interrupted = kind
            self.told_at = time.monotonic()
            if not self._running:
                return False
            return _set_async_exc(self._ident, kind) == 1


async def run_in_thread(threads: Executor | None, fn: Callable[..., Any], job: Any,
                        timeout: float | None, stop_reason: Callable[[], type[Interrupted]]) -> Any:
    """``fn(job)`` in a thread of ``threads``; returns or raises what it did, once its thread is done with it.

    After ``timeout`` seconds the thread is interrupted with TaskTimedOut and, once it has stopped,
    TimeoutError is raised. When this coroutine is cancelled (a cancel or a shutdown: ``stop_reason()``
    says which) the thread is interrupted and waited for, then CancelledError propagates; a task that
    returned meanwhile gives its value instead. A thread that does not stop (blocked in C code) keeps
    this coroutine, and so the job's lease, until it does.
    """
    try_ = ThreadTry(fn, job)
    # the thread sees this task's context (the run span, so the task's own spans nest under it); the
    # concurrent future is kept: the asyncio one is cancelled with this coroutine, the thread is not
    done = (threads or _fallback_pool()).submit(contextvars.copy_context().run, try_)
    cancelled = False
    try:
        if timeout is None:
            return await asyncio.wrap_future(done)  # the common case: no timer, no extra future
        return await asyncio.wait_for(asyncio.wrap_future(done), timeout)
    except asyncio.CancelledError:
        if done.done() and not done.cancelled():
            return done.result()  # it ended as the cancel came: its own value or error
        cancelled = True
        try_.interrupt(stop_reason())
    except TimeoutError:
        if done.done():
            raise  # the task's own TimeoutError, not the timer's
        try_.interrupt(TaskTimedOut)
    if not done.cancelled():  # a try cancelled before its thread took it never ran
        await _until_stopped(asyncio.wrap_future(done), try_, job)
    if done.cancelled():  # still queued for a thread when it was told: it never ran
        if cancelled:
            raise asyncio.CancelledError()
        raise TimeoutError(f"task {job.kind!r} timed out after {timeout:g}s waiting for a thread")
    try:
        value = done.result()
    except TaskTimedOut:
        raise TimeoutError(f"task {job.kind!r} timed out after {timeout:g}s") from None
    except Interrupted:
        if cancelled:
            raise asyncio.CancelledError() from None
        raise
    return value


_pool: ThreadPoolExecutor | None = None


def _fallback_pool() -> ThreadPoolExecutor:
    """Threads for a caller that brings none (the worker brings its own, sized to its concurrency)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(thread_name_prefix="joblane-task")
    return _pool


async def _until_stopped(future: asyncio.Future, try_: ThreadTry, job: Any) -> None:
    """Wait for an interrupted try's thread to return, whatever cancels this coroutine meanwhile."""
    told = time.monotonic()
    future.add_done_callback(_retrieved)  # the caller reads the concurrent future's result instead
    while not future.done():
        try:
            await asyncio.wait({future}, timeout=STILL_RUNNING_EVERY)
        except asyncio.CancelledError:  # cancelled again (a cancel during a timeout, a shutdown): keep waiting
            continue
        if not future.done():
            log.warning("job %d (%s) was told to stop (%s) %.0fs ago and its thread still runs (blocked outside "
                        "Python?): its lease is kept until it returns", job.id, job.kind,
                        (try_.interrupted or Interrupted).reason, time.monotonic() - told,
                        extra={"joblane": {"job_id": job.id, "stopping_seconds": round(time.monotonic() - told, 1)}})


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
