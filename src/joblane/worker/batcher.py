"""A reusable async batcher: flush on size or a short timer, back-pressure, retry, drain."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Generic, TypeVar

from ..lifecycle import retry_delay
from ..rules import first_line

T = TypeVar("T")
log = logging.getLogger("joblane.worker")


class Batcher(Generic[T]):
    """Collects items and hands them to ``flush`` in batches.

    ``put`` is the same call whether items go one at a time or in bulk; the
    batcher coalesces what arrives within ``max_wait`` seconds (or
    ``max_size`` items), waits while more than ``max_pending`` are queued,
    puts a failed batch back at the front and retries it with backoff, and
    ``close`` drains what is left. ``on_room`` is called when a batch taken
    for a flush ends a backlog (those who stopped feeding it may go on).
    """

    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[Any]],
        *,
        max_size: int = 500,
        max_wait: float = 0.002,
        max_pending: int = 20_000,
        max_in_flight: int = 1,
        name: str = "batcher",
    ):
        self._flush = flush
        self.max_size = max_size
        self.max_wait = max_wait
        self.max_pending = max_pending
        self.name = name
        self.on_room: Callable[[], None] | None = None  # set by whoever stops feeding it while backlogged
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self._items: list[T] = []
        self._in_flight: dict[int, list[T]] = {}
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._tasks: list[asyncio.Task] = []
        self.flushes = 0
        self.failures = 0

    def start(self) -> None:
        # Several flushers take turns on the queue: while one batch is being
        # written, the next can be, on another connection.
        self._tasks = [asyncio.create_task(self._run(i), name=f"{self.name}-{i}") for i in range(self.max_in_flight)]

    @property
    def pending(self) -> list[T]:
        """Items not yet written (queued or in the flush under way)."""
        flying = [item for batch in self._in_flight.values() for item in batch]
        return flying + self._items

    @property
    def backlogged(self) -> bool:
        return len(self._items) >= self.max_pending

    async def put(self, item: T) -> None:
        self._items.append(item)
        self._ready.set()
        while len(self._items) > self.max_pending and not self._closing:
            self._room.clear()
            await self._room.wait()

    async def _run(self, slot: int) -> None:
        failures = 0
        while True:
            if not self._items:
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            if len(self._items) < self.max_size and not self._closing and failures == 0:
                await asyncio.sleep(self.max_wait)  # let a few more arrive
            batch = self._items[: self.max_size]
            del self._items[: self.max_size]
            if not batch:  # another flusher took them while this one waited
                continue
            self._in_flight[slot] = batch
            if self.on_room is not None and not self.backlogged and len(self._items) + len(batch) >= self.max_pending:
                self.on_room()  # this batch ended a backlog
            try:
                await self._flush(batch)
            except Exception as exc:
                failures += 1
                self.failures += 1
                self._items[0:0] = batch
                delay = retry_delay(failures, base=0.05, cap=5.0, jitter=0.2)
                log.warning("%s: writing %d items failed (%s); retrying in %.2fs", self.name, len(batch),
                            first_line(exc), delay)
                await asyncio.sleep(delay)
            else:
                failures = 0
                self.flushes += 1
            finally:
                self._in_flight.pop(slot, None)
            if len(self._items) <= self.max_pending:
                self._room.set()

    async def close(self, timeout: float | None = None) -> bool:
        """Stop taking the timer's time, write what is queued; True when everything was written."""
        self._closing = True
        self._ready.set()
        self._room.set()
        if not self._tasks:
            return not self._items
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*self._tasks)), timeout)
        except asyncio.TimeoutError:
            for task in self._tasks:
                task.cancel()
            log.error("%s: %d items were not written before the drain timeout", self.name, len(self.pending))
            return False
        return True
