"""Heartbeats from a thread of their own, with their own connection, and a watch on the event loop.

A task that blocks the event loop (an ``async def`` calling a blocking SDK,
``time.sleep`` in a coroutine) stops every coroutine of the worker. Were the
leases extended by a coroutine, they would run out while the task still
runs, another worker would rescue the job and run it a second time. So the
worker's leases, and its row in the process registry, are extended here: a
thread with a psycopg connection of its own, which a blocked loop cannot
stop. The same thread watches the loop: when the loop has not ticked for
``stall_warning`` seconds it logs which task blocks it (the file and line
the loop's thread is in) and counts the stall.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import psycopg

from .. import store
from ..rules import first_line

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

log = logging.getLogger("joblane.worker")

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the joblane package folder


def snapshot(read: Callable[[], Any]) -> list:
    """``list(read())`` of a collection the event loop may be changing meanwhile."""
    for _ in range(100):
        try:
            return list(read())
        except RuntimeError:  # changed size during iteration: read again
            continue
    return []


class LoopWatch:
    """Ticks on the event loop; the heartbeat thread reads how long ago the last tick was."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.last_tick = time.monotonic()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self.last_tick = time.monotonic()
            await asyncio.sleep(self.interval)

    def lag(self) -> float:
        return time.monotonic() - self.last_tick


class Heartbeat(threading.Thread):
    """Every ``interval`` seconds: extend the leases of the worker's jobs and its registration, in one thread.

    ``jobs()`` returns the ids to extend (running, prefetched, and those whose
    outcome is not yet written); ``revoke(ids)`` is called on the event loop
    with the running jobs the worker no longer owns (cancelled or rescued).
    """

    def __init__(self, *, dsn: str, store: Store, worker: str, lease_seconds: float, interval: float,
                 jobs: Callable[[], list[int]], running: Callable[[], int], revoke: Callable[[set[int]], None],
                 register: Callable[[], store.Statement], loop: asyncio.AbstractEventLoop, watch: LoopWatch,
                 stall_warning: float, current_job: Callable[[], str | None], stats: Any,
                 application_name: str, stopping: Callable[[], str | None] = lambda: None):
        super().__init__(name="joblane-heartbeat", daemon=True)
        self.dsn = dsn
        self.store = store
        self.worker = worker
        self.lease_seconds = lease_seconds
        self.interval = interval
        self.jobs = jobs
        self.running = running
        self.revoke = revoke
        self.register = register
        self.loop = loop
        self.loop_thread = threading.get_ident()  # made on the loop's thread
        self.watch = watch
        self.stall_warning = stall_warning
        self.current_job = current_job
        self.stats = stats
        self.application_name = application_name
        self.stopping = stopping  # JSON text for processes.stopping: what keeps a stopping worker alive
        self.stopped = threading.Event()
        self._now = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._stalled_since: float | None = None

    def wake(self) -> None:
        """Beat at once (the worker began to stop: say so in the registry now, not a beat later)."""
        self._now.set()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(timeout)

    # -- the thread ---------------------------------------------------------

    def run(self) -> None:
        next_beat = time.monotonic() + self.interval
        check = min(0.5, self.stall_warning / 4, self.interval)
        while not self.stopped.wait(check):
            self._watch_loop()
            if time.monotonic() >= next_beat or self._now.is_set():
                self._now.clear()
                self._beat()
                next_beat = time.monotonic() + self.interval
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a broken connection: nothing more to do with it
                pass
            self._conn = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            # no server-side prepared statements (store.fetch never prepares), so PgBouncer in
            # transaction pooling is fine here too
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10,
                                         application_name=self.application_name, prepare_threshold=None)
        return self._conn

    def _beat(self) -> None:
        ids = self.jobs()
        owned: set[int] = set()
        try:
            conn = self._connection()
            if ids:
                owned = {r[0] for r in store.fetch(conn, self.store.extend_leases(ids, self.worker,
                                                                                   self.lease_seconds))}
            if not store.fetch(conn, self.store.heartbeat_process(self.worker, self.running(), self.lease_seconds,
                                                                  self.stopping())):
                store.fetch(conn, self.register())  # dropped while unreachable: register again
        except Exception as exc:  # noqa: BLE001 - the next beat tries again on a new connection
            log.warning("heartbeat failed (%s)", first_line(exc))
            self._close()
            return
        lost = set(ids) - owned
        if lost:
            try:
                self.loop.call_soon_threadsafe(self.revoke, lost)
            except RuntimeError:  # the loop is closed: the worker is gone
                pass

    def _watch_loop(self) -> None:
        lag = self.watch.lag()
        if lag >= self.stall_warning:
            if self._stalled_since is None:
                self._stalled_since = self.watch.last_tick
                self.stats["loop_stalls"] += 1
                log.warning("the event loop has been blocked for %.1fs by %s: a blocking call in an async task "
                            "stops every coroutine of the worker (run it in a plain def task, or "
                            "asyncio.to_thread); its leases are kept meanwhile",
                            lag, self._blocker(), extra={"joblane": {"loop_blocked_seconds": round(lag, 3)}})
        elif self._stalled_since is not None:
            blocked = time.monotonic() - self._stalled_since
            self.stats["loop_stalled_seconds"] += blocked
            log.warning("the event loop is free again after %.1fs", blocked,
                        extra={"joblane": {"loop_blocked_seconds": round(blocked, 3)}})
            self._stalled_since = None

    def _blocker(self) -> str:
        """The job whose task runs on the loop now, and the innermost line of user code the loop's thread is in."""
        where = ""
        frame = sys._current_frames().get(self.loop_thread)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(_HERE) and "asyncio" not in filename and not filename.startswith("<"):
                where = f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
                break
            frame = frame.f_back
        job = self.current_job()
        return ", ".join(p for p in (job, where) if p) or "a task"
