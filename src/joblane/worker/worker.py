"""Worker lifecycle: connections, the claim loop, heartbeats, maintenance, signals, shutdown.

Data flows one way: the claim loop leases jobs and starts an executor per
job; each executor returns an Outcome; the completer writes outcomes in
bulk. No transaction is open while a task runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import asyncpg

from .. import telemetry
from ..app import App
from ..errors import JoblaneError, SchemaVersionError
from ..lifecycle import GracefulSignals, retry_delay, sleep_unless
from ..maintenance import Pruner, Rescuer, Scheduler
from ..migrations import check_async
from ..notifier import Notifier
from ..ratelimit import Limiter
from ..steps import Steps
from ..store import for_schema_store, outcome_rows
from ..types import Job, Outcome
from .batcher import Batcher
from .executor import execute, give_back, now

log = logging.getLogger("joblane.worker")


def _claim_order(row) -> tuple[int, int]:
    return row[6], row[0]  # priority, then id (age)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Worker:
    """Runs the app's tasks from one or more queues.

    ``concurrency`` jobs run at once; a claim asks for as many jobs as there
    are free slots (at most ``claim_batch``). Leases last ``lease_seconds``
    and are extended every ``heartbeat_seconds`` while tasks run.
    """

    def __init__(
        self,
        app: App,
        *,
        queues: list[str] | None = None,
        concurrency: int = 10,
        claim_batch: int | None = None,
        prefetch: int | None = None,
        poll_interval: float = 1.0,
        lease_seconds: float | None = None,
        heartbeat_seconds: float | None = None,
        grace_seconds: float = 30.0,
        listen: bool = True,
        flush_interval: float = 0.002,
        flush_size: int = 500,
        rescue_interval: float | None = None,
        retention_seconds: float = 7 * 86400.0,
        prune_failed: bool = False,
        prune_interval: float = 60.0,
        name: str | None = None,
        connect_timeout: float = 60.0,
    ):
        if concurrency < 1:
            raise JoblaneError("concurrency must be at least 1")
        if poll_interval <= 0:
            raise JoblaneError("poll_interval must be positive")
        if grace_seconds < 0:
            raise JoblaneError("grace_seconds must be >= 0")
        if not connect_timeout >= 0:
            raise JoblaneError("connect_timeout must be >= 0")
        # how long a starting worker waits for an unreachable database before it exits
        self.connect_timeout = float(connect_timeout)
        self.app = app
        self.queues = [q for q in (queues or app.queues())]
        for q in self.queues:
            from ..app import _check_queue

            _check_queue(q)
        self.concurrency = concurrency
        # Jobs claimed ahead of free slots wait (leased, heartbeated) for one, so
        # the next claim's round trip overlaps the running tasks. Given back on
        # shutdown without spending an attempt.
        self.prefetch = concurrency if prefetch is None else prefetch
        if self.prefetch < 0:
            raise JoblaneError("prefetch must be >= 0")
        self.capacity = concurrency + self.prefetch
        # a claim fills every free place, prefetch included: one round trip per
        # (concurrency + prefetch) jobs rather than per concurrency
        self.claim_batch = max(1, claim_batch or self.capacity)
        self.poll_interval = poll_interval
        self.lease_seconds = float(lease_seconds or app.lease_seconds)
        self.heartbeat_seconds = float(heartbeat_seconds or self.lease_seconds / 3)
        if self.heartbeat_seconds >= self.lease_seconds:
            raise JoblaneError("heartbeat_seconds must be shorter than lease_seconds")
        self.grace_seconds = grace_seconds
        self.listen = listen
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats: Counter[str] = Counter()
        # shown in pg_stat_activity, so an operator can tell whose connection is whose
        self.application_name = f"joblane worker {os.getpid()}"

        q = app.queries
        self._claim_sql = q.claim_jobs
        self._complete_sql = q.complete_jobs
        self._extend_sql = q.extend_leases
        self.completer: Batcher[Outcome] = Batcher(
            self._write_outcomes, max_size=flush_size, max_wait=flush_interval, max_in_flight=2, name="completer"
        )
        # app.store, unless testing.app_on_schema re-pointed app.schema (it leaves app.store as it was)
        self.store = for_schema_store(app.schema)
        self.rescuer = Rescuer(self.store, interval=rescue_interval or max(1.0, self.lease_seconds / 3))
        self.pruner = Pruner(self.store, retention=retention_seconds, prune_failed=prune_failed,
                             interval=prune_interval)

        self._active: dict[int, tuple[asyncio.Task, Job]] = {}
        self._revoked: set[int] = set()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._slot = asyncio.Event()
        self._run_slots = asyncio.Semaphore(concurrency)
        self._follow_up = False
        self._pool: asyncpg.Pool | None = None
        self._threads: ThreadPoolExecutor | None = None
        self.started = asyncio.Event()
        self.limiter = Limiter(app, self.queues, wake=self._wake.set)  # queue limits and pauses

    # -- public control ---------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running tasks get ``grace_seconds`` to finish."""
        self._stopping.set()
        self._wake.set()
        self._slot.set()

    @property
    def active_jobs(self) -> list[int]:
        return list(self._active)

    # -- database ---------------------------------------------------------

    async def _connect(self) -> asyncpg.Pool:
        failures = 0
        deadline = asyncio.get_running_loop().time() + self.connect_timeout
        while True:
            try:
                pool = await asyncpg.create_pool(self.app.dsn, min_size=3, max_size=6,
                                                 server_settings={"application_name": self.application_name})
                async with pool.acquire() as conn:
                    await check_async(conn, self.app.schema)
                return pool
            except (SchemaVersionError, JoblaneError):
                raise
            except asyncpg.InvalidCatalogNameError as exc:
                raise JoblaneError(f"cannot use the database: {_first_line(exc)}") from None
            except asyncpg.InvalidAuthorizationSpecificationError as exc:
                raise JoblaneError(f"cannot log in to the database: {_first_line(exc)}") from None
            except asyncpg.ClientConfigurationError as exc:  # a malformed URL: retrying cannot help
                raise JoblaneError(f"invalid database URL: {_first_line(exc)}") from None
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError) as exc:
                failures += 1
                if self._stopping.is_set():
                    raise JoblaneError(f"stopped before the database answered: {_first_line(exc)}") from None
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise JoblaneError(f"cannot reach the database after {self.connect_timeout:g}s"
                                       f" ({_first_line(exc)}): is DATABASE_URL right and the server up?") from None
                delay = min(retry_delay(failures, base=0.2, cap=5.0), left)
                log.warning("database not reachable (%s); retrying in %.1fs", _first_line(exc), delay)
                await self._sleep(delay)

    async def _claim(self, n: int) -> list:
        started_ns = telemetry.now_ns()
        async with self._pool.acquire() as conn:
            if self.limiter.active:  # one of our queues has limits or is paused (ratelimit.py)
                rows = await self.limiter.claim(conn, n, self._claim_sql, self.name, self.lease_seconds,
                                                self.concurrency - len(self._active))
            else:
                rows = await conn.fetch(self._claim_sql, self.queues, n, self.name, self.lease_seconds)
        telemetry.claim_span(rows, started_ns, self.queues)  # a no-op unless OpenTelemetry is installed
        return rows

    async def _write_outcomes(self, batch: list[Outcome]) -> None:
        rows = outcome_rows(batch)
        async with self._pool.acquire() as conn:
            applied = await conn.fetch(self._complete_sql, rows, self.name)
        for o in batch:
            self.stats[o.outcome] += 1
        skipped = len(batch) - len(applied)
        if skipped:
            self.stats["stale"] += skipped
            log.info("completer: %d outcomes arrived after their job was rescued or cancelled", skipped)

    # -- the claim loop ---------------------------------------------------

    async def _produce(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            free = self.capacity - len(self._active)
            if free <= 0 or self.completer.backlogged:
                self._slot.clear()
                if self.capacity - len(self._active) <= 0 or self.completer.backlogged:
                    await self._slot.wait()
                continue
            want = min(free, self.claim_batch)
            self._wake.clear()  # a notification that lands during the claim is kept
            try:
                rows = await self._claim(want)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = retry_delay(failures, base=0.05, cap=5.0, jitter=0.2)
                log.warning("claim failed (%s); retrying in %.2fs", _first_line(exc), delay)
                await self._sleep(delay)
                continue
            failures = 0
            # From here the rows are committed as ours: every one reaches an
            # executor (which gives it back if we are stopping), never dropped.
            # RETURNING comes in no particular order: start them in claim order
            for row in sorted(rows, key=_claim_order):
                self._start(row)
            if len(rows) < want:
                # After a notification, look once more a debounce window later:
                # enqueues within that window skipped their own notification.
                wait = self.poll_interval
                if self._follow_up:
                    self._follow_up = False
                    wait = min(wait, max(0.002, 2 * self.app.notify_debounce))
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass

    def _notified(self) -> None:
        self._follow_up = self.app.notify_debounce > 0
        self._wake.set()

    def _start(self, row) -> None:
        job = Job(
            id=row[0], queue=row[1], kind=row[2], payload=json.loads(row[3]), attempt=row[4],
            max_attempts=row[5], priority=row[6], created_at=row[7], replay_of=row[8],
        )
        job._steps = Steps(self._pool, self.app.queries, job.id, job.attempt, self._loop)
        task = asyncio.create_task(self._run_job(job, row.get("headers")))  # trace context of the enqueue
        self._active[job.id] = (task, job)

    async def _run_job(self, job: Job, headers: str | None = None) -> None:
        outcome: Outcome | None
        started = None
        try:
            async with self._run_slots:
                started = now()
                if self._stopping.is_set():
                    outcome = give_back(job, started, "worker shutting down before the task started")
                elif self.limiter.active and self.limiter.paused_for(job.queue):  # claimed before a pause
                    outcome = self.limiter.put_back(job, started)
                else:
                    with telemetry.run_span(job, headers) as span:
                        outcome = await execute(self.app.tasks.get(job.kind), job, self._threads)
                        telemetry.end_run(span, outcome)
        except asyncio.CancelledError:
            if job.id in self._revoked:
                outcome = None  # cancelled or rescued elsewhere; the database already says so
            else:
                when = "finished" if started is not None else "started"
                outcome = give_back(job, started, f"worker {self.name} shut down before the task {when}")
        finally:
            self._active.pop(job.id, None)
            self._slot.set()
            if self.limiter.active:  # limited queues claim into free run slots only: claim again now
                self._wake.set()
        if outcome is not None:
            telemetry.job_finished(self, job, outcome, headers)  # metrics and the log line
            if outcome.pause:  # RetryAfter(pause_queue=True): stop the queue here and for every worker
                await self.limiter.pause(job.queue, outcome.pause, outcome.error)
            await self.completer.put(outcome)

    # -- heartbeats -------------------------------------------------------

    async def _heartbeat(self, done: asyncio.Event) -> None:
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), self.heartbeat_seconds)
                return
            except asyncio.TimeoutError:
                pass
            running = list(self._active)
            ids = running + [o.job_id for o in self.completer.pending]
            if not ids:
                continue
            try:
                async with self._pool.acquire() as conn:
                    owned = {r[0] for r in await conn.fetch(self._extend_sql, ids, self.name, self.lease_seconds)}
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat failed (%s)", _first_line(exc))
                continue
            for job_id in running:
                if job_id not in owned and job_id in self._active:
                    task, job = self._active[job_id]
                    log.warning("job %d (%s) is no longer ours (cancelled or rescued): stopping its task",
                                job_id, job.kind)
                    self._revoked.add(job_id)
                    task.cancel()

    # -- lifecycle --------------------------------------------------------

    async def _sleep(self, seconds: float) -> None:
        await sleep_unless(self._stopping, seconds)

    async def run(self, *, install_signals: bool = True) -> Counter[str]:
        """Run until ``request_stop()`` or SIGTERM/SIGINT; returns counts of outcomes."""
        loop = asyncio.get_running_loop()
        if install_signals:
            GracefulSignals(self.request_stop, log, draining=f"finishing running jobs (grace {self.grace_seconds:.0f}s)",
                            abandoning="running jobs return when their leases expire").install(loop)
        self._loop = loop
        self._threads = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="joblane-task")
        self._pool = await self._connect()
        await self.limiter.start(self._pool, self._stopping)  # before the first claim
        log.info("worker %s: queues %s, concurrency %d", self.name, ",".join(self.queues), self.concurrency)
        self.completer.start()
        services_done = asyncio.Event()
        background = [
            asyncio.create_task(self._heartbeat(services_done), name="heartbeat"),
            asyncio.create_task(self.rescuer.run(self._pool, self._stopping), name="rescuer"),
            asyncio.create_task(self.pruner.run(self._pool, self._stopping), name="pruner"),
            asyncio.create_task(self.limiter.run(self._stopping), name="limiter"),
        ]
        if self.app.periodic_tasks:  # every worker runs the scheduler; each tick is enqueued once
            self.scheduler = Scheduler(self.app)
            background.append(asyncio.create_task(self.scheduler.run(self._pool, self._stopping), name="scheduler"))
        notifier = None
        if self.listen:
            notifier = Notifier(self.app.dsn, self.app.channel, set(self.queues), self._notified,
                                application_name=self.application_name)
            background.append(asyncio.create_task(notifier.run(self._stopping), name="notifier"))
        self.started.set()
        try:
            await self._produce()
        finally:
            await self._shutdown(services_done, background)
            if install_signals:
                GracefulSignals.remove(loop)
        return self.stats

    async def _shutdown(self, services_done: asyncio.Event, background: list[asyncio.Task]) -> None:
        self.request_stop()
        tasks = [t for t, _ in self._active.values()]
        if tasks:
            log.info("waiting up to %.0fs for %d running jobs", self.grace_seconds, len(tasks))
            _, still = await asyncio.wait(tasks, timeout=self.grace_seconds)
            if still:
                log.warning("giving back %d jobs that did not finish within the grace period", len(still))
                for t in still:
                    t.cancel()
                await asyncio.gather(*still, return_exceptions=True)
        drained = await self.completer.close(timeout=max(10.0, self.lease_seconds))
        if not drained:
            log.error("some outcomes were not written; those jobs return when their leases expire")
        services_done.set()
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), 5.0)
            except Exception:
                self._pool.terminate()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped: %s", self.name, dict(self.stats))
