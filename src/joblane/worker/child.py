"""``@app.task(executor="process")``: each try in a child process of its own, which can always be stopped.

A thread blocked in C code (a model SDK's socket read, a PDF library, a
long ``time.sleep``) does not see an interruption until the call returns.
A process can be ended: a timeout, a cancel or the end of the shutdown
grace sends the child SIGTERM, then SIGKILL after ``KILL_AFTER`` seconds,
and the try is over once the child is reaped. The job's payload goes to the
child and its result, its ``job.record`` fields and its error come back as
JSON (errors as their kind and text). A child that dies by itself (a
segfault, the OOM killer, ``os._exit``) is a lost try. A child dies with the
worker too (``PR_SET_PDEATHSIG`` on Linux), so a worker killed with SIGKILL
leaves no try running while its job's lease runs out.

Children are forked from a ``forkserver`` that has imported joblane and the
task's module once, so a try starts in milliseconds, not the seconds of a
fresh interpreter. The task function is found again in the child by its
module and qualified name: it must be defined at a module's top level.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import importlib
import inspect
import json
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable

from ..errors import Hold, JoblaneError, PermanentError, RetryAfter, TaskTimedOut
from ..rules import ERROR_LIMIT

KILL_AFTER = 3.0  # seconds between SIGTERM and SIGKILL of a child told to stop

_context: Any = None
_context_lock = threading.Lock()
_preloaded: set[str] = set()


class ChildError(Exception):
    """An exception the task raised in its child process, re-raised in the worker by its kind and text."""

    def __init__(self, message: str, child_traceback: str | None = None):
        super().__init__(message)
        self.child_traceback = child_traceback


class ChildLost(Exception):
    """The child process ended without an answer: killed, crashed, or exited."""


def function_ref(fn: Callable[..., Any]) -> tuple[str, str]:
    """Where the child finds ``fn`` again; refused at registration when it could not."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<locals>" in name or "<lambda>" in name:
        raise JoblaneError(f"executor='process' needs a function defined at a module's top level, not {name!r}")
    return module, name


def _forkserver(module: str) -> Any:
    global _context
    with _context_lock:
        if _context is None:
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            _context = multiprocessing.get_context(method)
        if _context.get_start_method() == "forkserver" and module not in _preloaded and module != "__main__":
            _preloaded.add(module)
            # read when the server starts (the first child); modules named later are imported per child
            _context.set_forkserver_preload(["joblane", "joblane.worker.child", *sorted(_preloaded)])
        return _context


def _die_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when the process that forked it ends."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(ref: tuple[str, str], fields: dict[str, Any], out: Any) -> None:
    """In the child: run the task, send back ("ok", result, meta) or ("error", ...), exit."""
    _die_with_parent()
    if os.getppid() == 1:
        os._exit(1)  # the process that forked it ended before it could ask to die with it
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal reaches the whole group: the worker decides
    from ..types import Job

    job = Job(**fields)
    try:
        module = sys.modules.get("__mp_main__") if ref[0] == "__main__" else None
        target: Any = module or importlib.import_module(ref[0])
        for part in ref[1].split("."):
            target = getattr(target, part)
        value = asyncio.run(target(job)) if inspect.iscoroutinefunction(target) else target(job)
        result = None if value is None else json.dumps(value, allow_nan=False, separators=(",", ":"))
        message: tuple = ("ok", result, job.meta)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the worker as data
        message = ("error", _describe(exc), job.meta)
    try:
        out.send_bytes(json.dumps(message, default=repr).encode())
    finally:
        out.close()
        os._exit(0)


def _terminated(signum: int, frame: Any) -> None:
    raise TaskTimedOut()  # ends the task with its finally blocks run; the worker says why it was stopped


def _describe(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RetryAfter):
        return {"kind": "RetryAfter", "seconds": exc.seconds, "reason": exc.reason, "pause_queue": exc.pause_queue}
    if isinstance(exc, Hold):
        try:
            json.dumps(exc.data)
            data = exc.data
        except (TypeError, ValueError):
            data = repr(exc.data)
        return {"kind": "Hold", "reason": exc.reason, "data": data}
    text = "".join(traceback.format_exception(exc))[-ERROR_LIMIT:]
    if isinstance(exc, PermanentError):
        return {"kind": "PermanentError", "text": str(exc), "traceback": text}
    return {"kind": type(exc).__name__, "text": str(exc), "traceback": text}


def _rebuild(error: dict[str, Any]) -> BaseException:
    kind = error.get("kind")
    if kind == "RetryAfter":
        return RetryAfter(error["seconds"], error.get("reason"), pause_queue=bool(error.get("pause_queue")))
    if kind == "Hold":
        return Hold(error["reason"], error.get("data"))
    if kind == "PermanentError":
        return PermanentError(error.get("text") or "permanent error")
    return _error_class(str(kind))(error.get("text") or "", error.get("traceback"))


@functools.lru_cache(maxsize=256)
def _error_class(name: str) -> type[ChildError]:
    """A ChildError named as the child's exception, so last_error reads "ValueError: ..." as for a thread."""
    return type(name if name.isidentifier() else "ChildError", (ChildError,), {})


async def run_in_child(fn: Callable[..., Any], job: Any, timeout: float | None) -> Any:
    """``fn(job)`` in a child process; its value, or the exception it raised (rebuilt) raised here.

    On ``timeout`` the child is stopped and TimeoutError raised; when this coroutine is cancelled
    (a cancel, a shutdown) the child is stopped and CancelledError propagates. Either way the
    child has been reaped before this returns. ChildLost when it died without an answer.
    """
    ref = function_ref(fn)
    ctx = _forkserver(ref[0])
    fields = {"id": job.id, "queue": job.queue, "kind": job.kind, "payload": job.payload, "attempt": job.attempt,
              "max_attempts": job.max_attempts, "priority": job.priority, "created_at": job.created_at,
              "replay_of": job.replay_of, "signal": job.signal, "signal_key": job.signal_key}
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(ref, fields, writer),
                       name=f"joblane-task-{job.id}", daemon=False)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, proc.start)
    except BaseException:
        reader.close()
        writer.close()
        raise
    writer.close()
    answered: asyncio.Future = loop.create_future()
    fd = reader.fileno()

    def readable() -> None:
        loop.remove_reader(fd)
        if not answered.done():
            answered.set_result(None)

    loop.add_reader(fd, readable)
    try:
        try:
            await asyncio.wait_for(asyncio.shield(answered), timeout)
        except asyncio.TimeoutError:
            await _stop(proc)
            raise TimeoutError(f"task {job.kind!r} timed out after {timeout:g}s (its process was stopped)") from None
        except asyncio.CancelledError:
            await _stop(proc)
            raise
        try:
            message = json.loads(reader.recv_bytes())
        except (EOFError, OSError):
            message = None
        await loop.run_in_executor(None, proc.join, 5.0)
        if proc.is_alive():  # answered and then did not exit: stop it before the try is over
            await _stop(proc)
    finally:
        loop.remove_reader(fd)
        reader.close()
        if proc.exitcode is None:
            await _stop(proc)
    if message is None:
        raise ChildLost(f"the task's process ended without an answer ({_exit_text(proc.exitcode)})")
    status, body, meta = message
    if isinstance(meta, dict):
        job.meta.update(meta)
    if status == "ok":
        return None if body is None else json.loads(body)
    raise _rebuild(body)


async def _stop(proc: Any) -> None:
    """SIGTERM, then SIGKILL after KILL_AFTER seconds; returns once the child is reaped."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if proc.exitcode is None:
            proc.terminate()
            proc.join(KILL_AFTER)
        if proc.exitcode is None:
            proc.kill()
            proc.join()

    # a second cancel (a shutdown during a timeout) must not end the wait before the child is reaped
    stopping = loop.run_in_executor(None, stop)
    cancelled = False
    while not stopping.done():
        try:
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
