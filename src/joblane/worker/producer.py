"""The producer: the claim loop that leases ready jobs and hands each to the worker.

A claim asks for as many jobs as there are free places (running slots
plus prefetch, at most ``claim_batch``) in one statement, committed before
any of them runs. Unless fixed, the prefetch follows how fast the tasks
finish: enough places to keep the slots busy through two claim round
trips, from 1 to three times the concurrency. Between claims it waits for
a notification (enqueue, a freed place, the end of a pause or a limit's
window) or the poll interval.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Callable, Sized

from .. import store, telemetry
from ..lifecycle import retry_delay, sleep_unless
from ..rules import first_line
from ..store import Store
from .completer import Completer
from .limiter import Limiter

log = logging.getLogger("joblane.worker")


def _claim_order(row) -> tuple[int, int]:
    return row[6], row[0]  # priority, then id (age)


class Producer:
    """Claims jobs for worker ``name`` from ``queues`` and calls ``start(row)`` for each one claimed.

    ``active`` holds the worker's claimed jobs (running or waiting for a run
    slot): the loop claims while fewer than ``capacity`` are held and the
    ``completer`` is not backlogged. ``wake`` ends a wait between claims.
    ``prefetch`` fixes the places beyond the running slots; None sizes them
    from the tasks' run time and the claims' round trip (``size_prefetch``).
    """

    def __init__(self, store: Store, limiter: Limiter, completer: Completer, active: Sized,
                 start: Callable[[Any], None], *, queues: list[str], name: str, lease_seconds: float,
                 concurrency: int, prefetch: int | None, claim_batch: int, poll_interval: float, debounce: float,
                 wake: asyncio.Event, claimers: int | None = None):
        self.store = store
        self.limiter = limiter
        self.completer = completer
        self.active = active
        self.start = start
        self.queues = queues
        self.name = name
        self.lease_seconds = lease_seconds
        self.concurrency = concurrency
        self.adaptive = prefetch is None
        # Adaptive: as many places as the concurrency until the first tasks end, then sized to keep the
        # running slots busy through two claim round trips (prefetch_range). A worker of slow tasks holds
        # one job beyond its slots instead of leasing jobs another worker could run now; one of fast tasks
        # holds up to three times its concurrency, so each claim brings more jobs per round trip.
        self.prefetch = concurrency if prefetch is None else prefetch
        self.prefetch_range = (1, 3 * concurrency) if prefetch is None else (prefetch, prefetch)
        self.running = 0  # claimed jobs whose task holds a run slot (began, not yet freed)
        self._run_seconds: float | None = None  # moving mean of the tasks' run time
        self._claim_seconds: float | None = None  # moving mean of a claim's round trip, commit included
        self.claim_batch = claim_batch
        self.poll_interval = poll_interval
        self._again = False  # the last claim said more may be ready at once (store.claimed_rows)
        self.debounce = debounce
        self.wake = wake
        self.slot = asyncio.Event()  # set when a claimed job leaves ``active`` or a backlog of outcomes ends
        completer.on_room(self.slot.set)  # the last jobs may have finished while it lasted: none would set it
        # Claims in flight at once, each on its own connection: while one waits
        # for its commit, another can already lease the next jobs. Worth it
        # when the places are many against one claim (a claim of 200 into 800).
        self.claimers = claimers or max(1, min(3, self.capacity // (2 * claim_batch)))
        self._asked = 0  # places that claims in flight may fill
        # set while claims come back full: the extra claim loops claim only then,
        # so an idle worker polls with one loop
        self._busy = asyncio.Event()
        self._follow_up = False
        # set once the first claim has come back (rows, none, or an error): the worker's
        # maintenance services wait for it, so a worker's first jobs do not queue behind them
        self.first_claim = asyncio.Event()

    def notified(self) -> None:
        """An enqueue notification for one of our queues."""
        self._follow_up = self.debounce > 0
        self.wake.set()

    @property
    def capacity(self) -> int:
        """The places: running slots plus prefetched jobs."""
        return self.concurrency + self.prefetch

    def began(self) -> None:
        """A claimed job took a run slot: one fewer waits. At the low-water mark, the claim loop looks again."""
        self.running += 1
        if self._waiting() == self.prefetch // 2:
            self.slot.set()

    def freed(self, ran: float | None = None, *, began: bool = False) -> None:
        """A claimed job left ``active``: a place is free (``began``: it held a run slot; ``ran``: seconds run)."""
        if began:
            self.running -= 1
        if ran is not None:
            mean = self._run_seconds
            self._run_seconds = ran if mean is None else mean + (ran - mean) * 0.05
        self.slot.set()
        if self.limiter.active:  # limited queues claim into free run slots only: claim again now
            self.wake.set()

    def interrupt(self) -> None:
        """End any wait at once (the worker is stopping)."""
        self.wake.set()
        self.slot.set()
        self._busy.set()

    async def claim(self, pool: Any, n: int) -> list:
        """Lease up to ``n`` jobs in one statement (per limited queue, when some are limited or paused)."""
        started_ns = telemetry.now_ns()
        async with pool.acquire() as conn:
            if self.limiter.active:  # one of our queues has limits or is paused (worker/limiter.py)
                rows = await self.limiter.claim(conn, n, self.name, self.lease_seconds,
                                                self.concurrency - len(self.active))
            else:
                rows = await store.records(conn, self.store.claim_jobs(self.queues, n, self.name,
                                                                       self.lease_seconds))
        rows, self._again = store.claimed_rows(rows)
        telemetry.claim_span(rows, started_ns, self.queues)  # a no-op unless OpenTelemetry is installed
        return rows

    def claimed_in(self, seconds: float) -> None:
        """A claim's round trip took ``seconds``: resize the prefetch."""
        mean = self._claim_seconds
        self._claim_seconds = seconds if mean is None else mean + (seconds - mean) * 0.2
        self.size_prefetch()

    def size_prefetch(self) -> None:
        """Adaptive prefetch: the jobs the running slots finish in two claim round trips, within its range."""
        if not self.adaptive or self._run_seconds is None or self._claim_seconds is None:
            return
        low, high = self.prefetch_range
        finished = 2 * self._claim_seconds * self.concurrency / max(self._run_seconds, 1e-6)
        before, self.prefetch = self.prefetch, max(low, min(high, math.ceil(finished)))
        if self.prefetch > before:  # more places, a higher low-water mark: a waiting claim loop looks again
            self.slot.set()

    def _free(self) -> int:
        return self.capacity - len(self.active) - self._asked

    def _waiting(self) -> int:
        """Jobs held for a run slot, with those the claims in flight will bring."""
        return len(self.active) - self.running + self._asked

    def _full(self) -> bool:
        """No claim now: no free place, the completer backlogged, or jobs still waiting above the low-water mark.

        The mark, half the prefetch, keeps claims whole: while the jobs held
        for a slot outlast a claim's round trip, the next claim waits for
        more free places rather than asking for the first one freed.
        """
        return self._free() <= 0 or self.completer.backlogged or self._waiting() > self.prefetch // 2

    async def run(self, pool: Any, stopping: asyncio.Event) -> None:
        """Claim until ``stopping`` is set (``claimers`` claims in flight at most)."""
        loops = [asyncio.create_task(self._claim_loop(pool, stopping, first=(i == 0)), name=f"claim-{i}")
                 for i in range(self.claimers)]
        try:
            await asyncio.gather(*loops)
        finally:
            self.first_claim.set()  # stopped before any claim came back: nothing for the services to wait for
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _claim_loop(self, pool: Any, stopping: asyncio.Event, first: bool = True) -> None:
        failures = 0
        while not stopping.is_set():
            if not first and not self._busy.is_set():
                await self._busy.wait()
                continue
            if self._full():
                self.slot.clear()
                if self._full():
                    # whatever frees a place sets ``slot``; the poll interval bounds the wait all the same
                    await sleep_unless(self.slot, self.poll_interval)
                continue
            want = min(self._free(), self.claim_batch)
            self.wake.clear()  # a notification that lands during the claim is kept
            self._asked += want
            began = asyncio.get_running_loop().time()
            try:
                rows = await self.claim(pool, want)
                self.claimed_in(asyncio.get_running_loop().time() - began)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = retry_delay(failures, base=0.05, cap=5.0, jitter=0.2)
                log.warning("claim failed (%s); retrying in %.2fs", first_line(exc), delay)
                await sleep_unless(stopping, delay)
                continue
            finally:
                # the places this claim held are free again (or filled by its rows, now in
                # ``active``): another claim loop waiting for places looks again
                self._asked -= want
                self.slot.set()
                self.first_claim.set()
            failures = 0
            # From here the rows are committed as ours: every one reaches an
            # executor (which gives it back if we are stopping), never dropped.
            # RETURNING comes in no particular order: start them in claim order
            for row in sorted(rows, key=_claim_order):
                self.start(row)
            if len(rows) == want:
                self._busy.set()
            elif self._again:
                # a lane was busy with another worker's claim, or due jobs were just promoted for the
                # next claim: claim again now rather than at the next notification
                self._busy.set()
                if not rows:
                    await asyncio.sleep(0.001)
            else:
                self._busy.clear()
                # After a notification, look once more a debounce window later:
                # enqueues within that window skipped their own notification.
                wait = self.poll_interval
                if self._follow_up:
                    self._follow_up = False
                    wait = min(wait, max(0.002, 2 * self.debounce))
                await sleep_unless(self.wake, wait)
