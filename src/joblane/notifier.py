"""LISTEN on a channel and wake whoever waits for new rows; reconnects on its own.

Shared by the worker (enqueue notifications wake its claim loop) and the
relay (publish notifications wake its batches). A notification only saves
time: both also poll, and every (re)connection wakes them once, so what was
written while nobody listened is found by the next claim.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import asyncpg

from .lifecycle import retry_delay, sleep_unless
from .rules import first_line


log = logging.getLogger("joblane.worker")


class Notifier:
    """Calls ``wake`` when a notification on ``channel`` names one of ``queues`` (its payload), and after
    every (re)connection."""

    def __init__(self, dsn: str, channel: str, queues: set[str], wake: Callable[[], None], *,
                 application_name: str = "joblane listener"):
        self.dsn = dsn
        self.application_name = application_name
        self.channel = channel
        self.queues = queues
        self.wake = wake
        self.connected = asyncio.Event()
        self.notifications = 0

    def _on_notify(self, _conn, _pid, _channel, payload: str) -> None:
        self.notifications += 1
        if payload in self.queues:
            self.wake()

    async def run(self, stopping: asyncio.Event) -> None:
        failures = 0
        while not stopping.is_set():
            conn = None
            try:
                conn = await asyncpg.connect(self.dsn, server_settings={"application_name": self.application_name})
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c: lost.set())
                await conn.add_listener(self.channel, self._on_notify)
                self.connected.set()
                failures = 0
                # Anything enqueued while we were not listening is found by a claim now.
                self.wake()
                while not stopping.is_set() and not lost.is_set() and not conn.is_closed():
                    try:
                        await asyncio.wait_for(_first(stopping, lost), 2.0)
                    except asyncio.TimeoutError:
                        pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning("listener: %s; reconnecting", first_line(exc))
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    try:
                        await asyncio.wait_for(conn.close(), 2.0)
                    except Exception:
                        conn.terminate()
            if not stopping.is_set():
                self.wake()
                await sleep_unless(stopping, retry_delay(failures, base=0.1, cap=5.0, jitter=0.2))


async def _first(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
