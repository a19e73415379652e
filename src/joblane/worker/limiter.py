"""The worker's side of queue limits, budgets and pauses: which of its queues are limited, budgeted or paused,
and the limited claim.

Limits are declared with ``app.limit(...)`` or ``joblane limits set``
(``joblane.ratelimit``), spend caps with ``app.budget(...)`` or ``joblane
budgets set`` (``joblane.budgets``), and both are enforced in the database,
so every worker on every host shares them. A queue with limits, budgets or
both is claimed through ``claim_jobs_limited`` (one short transaction, see
sql/limits.sql), which enforces them together; queues with neither keep the
plain claim, untouched.

``RetryAfter(seconds, pause_queue=True)`` pauses the whole queue: the worker
that caught it stops claiming from the queue at once and writes
``queue_pauses``; every claim, limited or plain, checks the pause in the
same statement, so every worker stops at once. The refresh (every
``refresh_interval`` seconds, 2 by default) only tells this worker which
queues need the limited claim and when a pause ends, to wake up then.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from typing import Any, Callable, Mapping

from .. import store
from ..lifecycle import retry_delay, sleep_unless
from ..migrations import lock_key
from ..ratelimit import Limit
from ..rules import first_line
from ..store import Store

log = logging.getLogger("joblane.worker")


class Limiter:
    """What a worker needs of limits: which of its queues are limited or paused, and the limited claim.

    ``active`` is False while none of the worker's queues has limits or a
    pause; the worker then uses its plain claim and never calls in here.
    ``limits`` are the app's declared limits (``app.rate_limits``), written
    at ``start``.
    """

    def __init__(self, store: Store, queues: list[str], limits: Mapping[str, Limit], *, wake: Callable[[], None],
                 refresh_interval: float = 2.0, budgets: Mapping[str, Any] | None = None):
        self.store = store
        self.queues = list(queues)
        self.limits = limits
        self.budgets = budgets or {}  # name -> budgets.Budget, written at start like the limits
        self.refresh_interval = refresh_interval
        self.limited: set[str] = set()  # queues with limits or budgets: the limited claim
        self.budgeted: set[str] = set()  # of those, the queues with spend caps: the claim folds their holds first
        self._locks: dict[str, int] = {}  # queue -> advisory key of its claims (lock_queue_claims)
        self.active = False
        self._wake = wake
        self._paused: dict[str, float] = {}  # queue -> time.monotonic() when the pause ends
        self._recording: set[str] = set()  # queues whose pause this worker is writing (a refresh keeps them)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._turn = 0
        self._pool: Any = None

    async def start(self, pool: Any, stopping: asyncio.Event) -> None:
        """Write the app's declared limits and load which queues are limited or paused (before any claim)."""
        self._pool = pool
        failures = 0
        while True:
            try:
                async with pool.acquire() as conn:
                    for limit in self.limits.values():
                        await store.run(conn, self.store.upsert_queue_limit(*limit.args()))
                    for budget in self.budgets.values():
                        declared = await store.records(conn, self.store.declare_budget(*budget.args()))
                        self._note_operator_cap(budget, declared)
                    await self._refresh(conn)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if stopping.is_set():
                    return
                delay = retry_delay(failures, base=0.2, cap=5.0)
                log.warning("cannot load queue limits (%s); retrying in %.1fs", first_line(exc), delay)
                await asyncio.sleep(delay)

    @staticmethod
    def _note_operator_cap(budget: Any, declared: list) -> None:
        """Say so when a cap an operator set stands over the one the app declares."""
        if declared and declared[0]["cap_source"] == "operator" and declared[0]["cap"] != budget.cap:
            log.warning("budget %s: the cap an operator set (%g, at %s) stands over the declared %g; "
                        "`joblane budgets reset %s` returns to the declared cap", budget.name, declared[0]["cap"],
                        declared[0]["cap_set_at"], budget.cap, budget.name)

    async def run(self, stopping: asyncio.Event) -> None:
        """Refresh the limited and paused queues every ``refresh_interval`` seconds (jittered)."""
        try:
            while not stopping.is_set():
                await sleep_unless(stopping, self.refresh_interval * random.uniform(0.8, 1.2))
                if stopping.is_set():
                    return
                try:
                    async with self._pool.acquire() as conn:
                        await self._refresh(conn)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("queue limits refresh failed (%s)", first_line(exc))
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    async def _refresh(self, conn: Any) -> None:
        rows = await store.records(conn, self.store.queue_controls(self.queues))
        now = time.monotonic()
        self.limited = {r[0] for r in rows if r[1] != "pause"}
        self.budgeted = {r[0] for r in rows if r[1] == "budget"}
        paused = {r[0]: now + float(r[2]) for r in rows if r[1] == "pause"}
        for queue in self._recording & self._paused.keys():
            paused[queue] = max(paused.get(queue, 0.0), self._paused[queue])
        self._paused = paused
        self._update()
        if self._paused:
            self._wake_at(min(self._paused.values()))

    def _update(self) -> None:
        self.active = bool(self.limited) or any(q in self.queues for q in self._paused)

    def _wake_at(self, at: float) -> None:
        """Wake the claim loop at monotonic time ``at`` (keeps only the earliest pending wake-up)."""
        if at >= self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, at - time.monotonic()) + 0.002, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._wake()

    async def pause(self, queue: str, seconds: float, reason: str | None) -> None:
        """Pause ``queue`` here at once and for every worker through ``queue_pauses``."""
        until = time.monotonic() + seconds
        self._paused[queue] = max(until, self._paused.get(queue, 0.0))
        self._update()
        self._wake_at(until)
        log.warning("queue %s paused for %.1fs: %s", queue, seconds, reason or "RetryAfter(pause_queue=True)")
        self._recording.add(queue)
        try:
            async with self._pool.acquire() as conn:
                await store.run(conn, self.store.pause_queue(queue, float(seconds), reason))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("could not record the pause of queue %s (%s); other workers will not see it",
                        queue, first_line(exc))
        finally:
            self._recording.discard(queue)

    def paused_for(self, queue: str) -> float:
        """Seconds ``queue`` stays paused, as this worker knows it (0 when it is not paused)."""
        until = self._paused.get(queue)
        return max(0.0, until - time.monotonic()) if until is not None else 0.0

    async def claim(self, conn: Any, n: int, worker: str, lease: float, run_free: int) -> list:
        """Claim up to ``n`` jobs: the plain claim for unlimited queues, the limited claim for the others.

        A limited queue claims only into the worker's free run slots
        (``run_free``), never to prefetch: a job that waited locally for a
        slot would start later than the window it was counted in.
        """
        now = time.monotonic()
        if self._paused:
            for queue in [q for q, until in self._paused.items() if until <= now]:
                del self._paused[queue]
            self._update()
        limited = self.limited
        plain = [q for q in self.queues if q not in limited and q not in self._paused]
        groups: list[str | None] = [q for q in self.queues if q in limited and q not in self._paused]
        if plain:
            groups.append(None)
        if self._paused:
            self._wake_at(min(self._paused.values()))
        if not groups:
            return []
        # take turns at going first, so a busy group cannot starve the others
        self._turn = (self._turn + 1) % len(groups)
        groups = groups[self._turn:] + groups[:self._turn]
        rows: list = []
        for group in groups:
            if group is None:
                want = n - _jobs(rows)
                if want > 0:
                    rows.extend(await store.records(conn, self.store.claim_jobs(plain, want, worker, lease)))
            else:
                want = min(n, run_free) - _jobs(rows)
                if want > 0:
                    rows.extend(await self._claim_limited(conn, group, want, worker, lease))
        return rows

    async def _claim_limited(self, conn: Any, queue: str, n: int, worker: str, lease: float) -> list:
        """The claim of a queue with limits, budgets or both (sql/limits.sql): one statement enforces them
        together, after the queue's lock and, when it has budgets, the fold of its finished tries' holds."""
        key = self._locks.get(queue)
        if key is None:
            key = self._locks[queue] = lock_key(self.store.schema, f"claim:{queue}")
        async with conn.transaction():
            await store.records(conn, self.store.lock_queue_claims(key))
            if queue in self.budgeted:
                await store.records(conn, self.store.fold_budget_holds(queue))
            result = await store.records(conn, self.store.claim_jobs_limited(queue, n, worker, lease))
        return self._claimed(result, n)

    def _claimed(self, result: list, n: int) -> list:
        """The jobs a limited claim leased (its result has one row with no job when it leased
        none); when it leased fewer than ``n`` because of a limit, wake the claim loop when that ends."""
        rows = [r for r in result if r[0] is not None]
        retry_in = result[0]["retry_in"] if result else None
        if len(rows) < n and retry_in is not None and retry_in > 0:
            self._wake_at(time.monotonic() + retry_in)
        return rows


def _jobs(rows: list) -> int:
    """The jobs among claimed rows (claim_jobs may end with a row of NULLs: store.claimed_rows)."""
    return sum(1 for r in rows if r[0] is not None)
