"""The Worker: configuration, connecting, signals, shutdown, heartbeats and the wiring of its pieces.

Data flows one way: the producer (producer.py) leases jobs and the worker
starts an executor (executor.py) per job; each executor returns an Outcome;
the completer (completer.py) writes outcomes in bulk. No transaction is
open while a task runs. Queue limits and pauses are the limiter's
(limiter.py); the maintenance services (rescuer, pruner, vacuumer, history, scheduler) and the
notifier run beside them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import asyncpg

from .. import store, telemetry
from ..errors import JoblaneError, SchemaVersionError, TaskCancelled, WorkerShutdown
from ..lifecycle import POOLER_FOUND, GracefulSignals, retry_delay, sleep_unless, version
from ..maintenance import History, Pruner, Rescuer, Rotator, Scheduler, Vacuumer
from ..maintenance.service import Service
from ..migrations import check_async
from ..notifier import Notifier
from ..rules import check_queue, first_line, plural, tally
from ..steps import Steps
from ..types import Job, Outcome
from .completer import Completer
from .executor import execute, give_back, now
from .heartbeat import Heartbeat, LoopWatch, snapshot
from .limiter import Limiter
from .producer import Producer

if TYPE_CHECKING:  # pragma: no cover
    from ..app import App

log = logging.getLogger("joblane.worker")

CONNECT_TRY_SECONDS = 5.0  # one connection attempt of a starting worker
_EAGER = sys.version_info >= (3, 12)  # asyncio.Task(eager_start=True)


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
        claimers: int | None = None,
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
        prune_interval: float = 10.0,
        vacuum_interval: float = 10.0,
        ring_turn_seconds: float = 10.0,
        name: str | None = None,
        connect_timeout: float = 60.0,
        pgbouncer: bool | None = None,
        stall_warning: float = 2.0,
        unknown_kind_timeout: float = 600.0,
        stop_seconds: float = 10.0,
        exit_when_stuck: bool = False,
    ):
        if concurrency < 1:
            raise JoblaneError("concurrency must be at least 1")
        if poll_interval <= 0:
            raise JoblaneError("poll_interval must be positive")
        if grace_seconds < 0:
            raise JoblaneError("grace_seconds must be >= 0")
        if not connect_timeout >= 0:
            raise JoblaneError("connect_timeout must be >= 0")
        if not stall_warning > 0:
            raise JoblaneError("stall_warning must be a positive number of seconds")
        if not unknown_kind_timeout >= 0:
            raise JoblaneError("unknown_kind_timeout must be >= 0 seconds")
        if not stop_seconds >= 0:
            raise JoblaneError("stop_seconds must be >= 0")
        # after the grace, how long tries told to stop get to end before the worker leaves without them;
        # a try that would not stop (a thread blocked in C code) is never given back while it runs: the
        # CLI's worker exits (exit_when_stuck), the thread dies with it and the lease runs out; an
        # embedded worker keeps the lease and waits for it
        self.stop_seconds = float(stop_seconds)
        self.exit_when_stuck = bool(exit_when_stuck)
        if not vacuum_interval >= 0:
            raise JoblaneError("vacuum_interval must be >= 0 seconds (0 leaves vacuum to autovacuum)")
        # Behind PgBouncer in transaction pooling: no named prepared statements
        # (asyncpg's statement cache off) and no LISTEN (it needs a session): poll.
        # None: found out at start, from the connection's two ends (_through_pooler).
        self.pgbouncer = None if pgbouncer is None else bool(pgbouncer)
        if self.pgbouncer:
            listen = False
        self.stall_warning = float(stall_warning)
        # a job of a kind no live worker knows fails once it is this old; before
        # that, and while another live worker knows the kind, it is given back
        self.unknown_kind_timeout = float(unknown_kind_timeout)
        # how long a starting worker waits for an unreachable database before it exits
        self.connect_timeout = float(connect_timeout)
        self.app = app
        self.queues = [check_queue(q) for q in (queues or app.queues())]
        self.concurrency = concurrency
        # Jobs claimed ahead of free slots wait (leased, heartbeated) for one, so
        # the next claim's round trip overlaps the running tasks. Given back on
        # shutdown without spending an attempt. None: sized as the tasks run
        # (Producer.size_prefetch), from 1 to three times the concurrency.
        if prefetch is not None and prefetch < 0:
            raise JoblaneError("prefetch must be >= 0")
        if claimers is not None and not 1 <= claimers <= 16:
            raise JoblaneError("claimers must be between 1 and 16")
        # a claim fills every free place, prefetch included: one round trip per
        # (concurrency + prefetch) jobs rather than per concurrency
        most = concurrency + (3 * concurrency if prefetch is None else prefetch)
        self.claim_batch = max(1, claim_batch or most)
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

        self.store = app.store
        self.completer = Completer(self.store, self.name, self.stats, flush_size=flush_size,
                                   flush_interval=flush_interval)
        self.rescuer = Rescuer(self.store, interval=rescue_interval or max(1.0, self.lease_seconds / 3))
        # the ring of the claims' ready entries (migrations 0013 and 0017), turned every ring_turn_seconds
        self.rotator = Rotator(self.store, turn_every=ring_turn_seconds)
        self.pruner = Pruner(self.store, retention=retention_seconds, prune_failed=prune_failed,
                             interval=prune_interval)
        # vacuums jobs when its dead row versions pile up between autovacuum's passes (0: autovacuum only)
        self.vacuumer = Vacuumer(self.store, tables=("jobs",), interval=vacuum_interval) if vacuum_interval else None
        self.history = History(self.store)  # roll-ups of the attempts, for the dashboard's history page
        self.scheduler: Scheduler | None = None  # made at run() when the app has periodic schedules

        self._active: dict[int, tuple[asyncio.Task | None, Job]] = {}
        self._heartbeat: Heartbeat | None = None
        self._loop_watch = LoopWatch()
        self._kinds_elsewhere: dict[str, tuple[float, bool]] = {}  # kind -> (checked at, known by a live worker)
        self._unknown_logged: set[str] = set()
        self._revoked: set[int] = set()
        self._began: dict[int, float] = {}  # job id -> monotonic time its try began to run
        self._told: dict[int, float] = {}  # job id -> monotonic time its try was told to stop
        self._stopping_since: float | None = None  # epoch seconds the shutdown began
        self._stopping = asyncio.Event()
        self._run_slots = asyncio.Semaphore(concurrency)
        self._pool: asyncpg.Pool | None = None
        self._threads: ThreadPoolExecutor | None = None
        self.started = asyncio.Event()
        wake = asyncio.Event()
        self.limiter = Limiter(self.store, self.queues, app.rate_limits, wake=wake.set, budgets=app.budgets)  # queue limits and pauses
        self.producer = Producer(self.store, self.limiter, self.completer, self._active, self._start,
                                 queues=self.queues, name=self.name, lease_seconds=self.lease_seconds,
                                 concurrency=concurrency, prefetch=prefetch, claim_batch=self.claim_batch,
                                 poll_interval=poll_interval, debounce=app.notify_debounce, wake=wake,
                                 claimers=claimers)

    # -- public control ---------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running tasks get ``grace_seconds`` to finish."""
        self._stopping.set()
        self.producer.interrupt()

    @property
    def active_jobs(self) -> list[int]:
        return list(self._active)

    # -- database ---------------------------------------------------------

    async def _connect(self) -> asyncpg.Pool:
        failures = 0
        deadline = asyncio.get_running_loop().time() + self.connect_timeout
        while True:
            try:
                if self.pgbouncer is None:
                    self.pgbouncer = await self._through_pooler()
                options: dict = {"statement_cache_size": 0} if self.pgbouncer else {}
                # Each claim loop and each completer flush holds a connection while
                # its statement runs; the services share the rest, and a vacuum
                # (seconds long) has one of its own.
                # a server that accepts and never answers fails a try in CONNECT_TRY_SECONDS (asyncpg's own
                # default, 60 s, would be the whole connect_timeout before a first word)
                pool = await asyncpg.create_pool(self.app.dsn, min_size=3,
                                                 max_size=4 + self.producer.claimers + (self.vacuumer is not None),
                                                 server_settings={"application_name": self.application_name},
                                                 reset=store.keep_session, timeout=CONNECT_TRY_SECONDS, **options)
                async with pool.acquire() as conn:
                    await check_async(conn, self.app.schema)
                return pool
            except (SchemaVersionError, JoblaneError):
                raise
            except asyncpg.InvalidCatalogNameError as exc:
                raise JoblaneError(f"cannot use the database: {first_line(exc)}") from None
            except asyncpg.InvalidAuthorizationSpecificationError as exc:
                raise JoblaneError(f"cannot log in to the database: {first_line(exc)}") from None
            except asyncpg.ClientConfigurationError as exc:  # a malformed URL: retrying cannot help
                raise JoblaneError(f"invalid database URL: {first_line(exc)}") from None
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError) as exc:
                failures += 1
                if self._stopping.is_set():
                    raise JoblaneError(f"stopped before the database answered: {first_line(exc)}") from None
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise JoblaneError(f"cannot reach the database after {self.connect_timeout:g}s"
                                       f" ({first_line(exc)}): is DATABASE_URL right and the server up?") from None
                delay = min(retry_delay(failures, base=0.2, cap=5.0), left)
                why = (f"no answer within {CONNECT_TRY_SECONDS:g}s" if isinstance(exc, asyncio.TimeoutError)
                       else first_line(exc) or type(exc).__name__)
                if failures == 1:  # the first failure says what to check at once, not when the wait ends
                    log.error("cannot reach the database (%s): is DATABASE_URL right and the server up? "
                              "Retrying for up to %gs (--connect-timeout)", why, self.connect_timeout)
                else:
                    log.warning("database still not reachable (%s); retrying in %.1fs, giving up in %.0fs",
                                why, delay, left)
                await self._sleep(delay)

    async def _through_pooler(self) -> bool:
        """Whether the database is reached through a pooler or proxy; if so, run as with ``pgbouncer=True``.

        In transaction pooling a prepared statement or a LISTEN belongs to a server connection the next
        transaction may not get: the claims would fail with "prepared statement does not exist" and
        retry while jobs wait. The same look at the connection's two ends as enqueue's (store.reaches_server).
        """
        pooled = await store.dsn_through_pooler(self.app.dsn, self.application_name, CONNECT_TRY_SECONDS)
        if pooled:
            self.listen = False
            log.info(POOLER_FOUND, self.poll_interval)
        return pooled

    # -- running one job --------------------------------------------------

    def _start(self, row) -> None:
        job = Job(
            id=row[0], queue=row[1], kind=row[2], payload=json.loads(row[3]), attempt=row[4],
            max_attempts=row[5], priority=row[6], created_at=row[7], replay_of=row[8],
        )
        job._steps = Steps(self._pool, self.store, job.id, job.attempt, self._loop)
        headers = row.get("headers")  # trace context of the enqueue; and the signal that woke a waiting job
        if headers is not None and '"joblane.signal"' in headers:
            woke = json.loads(headers).get("joblane.signal") or {}
            job.signal, job.signal_key = woke.get("data"), woke.get("key")
        if not _EAGER:
            self._active[job.id] = (asyncio.create_task(self._run_job(job, headers)), job)
            return
        # Python 3.12+: the task's first step runs in this call, so a job that finishes without waiting never
        # goes through the event loop's queue (about 15 % more no-op jobs a second: benchmarks/notes.md). The
        # job is active before its task exists (it may finish, and leave active, before the call returns);
        # until then its task is None, which _job_on_the_loop reads as "the job starting on the loop now".
        self._active[job.id] = (None, job)
        task = asyncio.Task(self._run_job(job, headers), loop=self._loop, eager_start=True)
        # Its first step may have left active already and then waited after (writing the outcome when the
        # completer is backlogged, pausing the queue): only a job still starting gets its task recorded.
        if self._active.get(job.id, (task,))[0] is None:  # a done task has left active
            self._active[job.id] = (task, job)

    async def _run_job(self, job: Job, headers: str | None = None) -> None:
        outcome: Outcome | None
        started = None
        ran = None  # seconds the task ran, when it did
        quiet = False
        try:
            async with self._run_slots:
                started = now()
                self.producer.began()
                if self._stopping.is_set():
                    outcome = give_back(job, started, "worker shutting down before the task started")
                elif self.limiter.active and self.limiter.paused_for(job.queue):  # claimed before a pause
                    # pending again at the end of the pause, its attempt not spent
                    outcome = give_back(job, started, f"queue {job.queue} is paused",
                                        delay=self.limiter.paused_for(job.queue))
                elif job.kind not in self.app.tasks and (left := await self._wait_for_kind(job)) is not None:
                    outcome = give_back(job, started, left[0], delay=left[1])
                    quiet = True  # said once per kind in _wait_for_kind
                else:
                    self._began[job.id] = time.monotonic()
                    with telemetry.run_span(job, headers) as span:
                        outcome = await execute(self.app.tasks.get(job.kind), job, self._threads,
                                                lambda: TaskCancelled if job.id in self._revoked else WorkerShutdown)
                        telemetry.end_run(span, outcome)
                    ran = outcome.finished_at - outcome.started_at  # sizes the prefetch
        except asyncio.CancelledError:
            if job.id in self._revoked:
                outcome = None  # cancelled or rescued elsewhere; the database already says so
            else:
                when = "finished" if started is not None else "started"
                outcome = give_back(job, started, f"worker {self.name} shut down before the task {when}")
        finally:
            self._active.pop(job.id, None)
            self._began.pop(job.id, None)
            self._told.pop(job.id, None)
            self.producer.freed(ran, began=started is not None)
        if outcome is not None:
            telemetry.job_finished(self, job, outcome, headers, quiet=quiet)  # metrics and the log line
            if outcome.pause:  # RetryAfter(pause_queue=True): stop the queue here and for every worker
                await self.limiter.pause(job.queue, outcome.pause, outcome.error)
            await self.completer.put(outcome)

    # -- kinds this worker does not know (rolling deploys) --------------------

    async def _wait_for_kind(self, job: Job) -> tuple[str, float] | None:
        """Why and how long to give back a job of a kind this worker does not know; None to fail it now.

        During a rolling deploy the producers may be newer than this worker:
        while another live worker knows the kind, the job is left for it; while
        none does, it waits until it is ``unknown_kind_timeout`` old, then fails.
        """
        known = await self._known_elsewhere(job.kind)
        age = time.time() - job.created_at.timestamp() if job.created_at else 0.0
        if not known and age >= self.unknown_kind_timeout:
            return None
        if job.kind not in self._unknown_logged:
            self._unknown_logged.add(job.kind)
            log.warning("this worker does not know task kind %r (queue %s); %s", job.kind, job.queue,
                        "leaving its jobs to a live worker that does" if known else
                        f"no live worker knows it either: its jobs wait, and fail once "
                        f"{self.unknown_kind_timeout:g}s old")
        if known:
            return (f"worker {self.name} does not know task kind {job.kind!r}: left for a live worker that does",
                    random.uniform(1.0, 3.0))
        return (f"no live worker knows task kind {job.kind!r}: waiting for one (it fails once "
                f"{self.unknown_kind_timeout:g}s old)", min(30.0, max(1.0, self.unknown_kind_timeout - age)))

    async def _known_elsewhere(self, kind: str) -> bool:
        checked = self._kinds_elsewhere.get(kind)
        if checked is not None and time.monotonic() - checked[0] < 5.0:
            return checked[1]
        try:
            async with self._pool.acquire() as conn:
                known = bool(await store.value(conn, self.store.kind_known_live(kind, self.name)))
        except Exception as exc:  # noqa: BLE001 - when unsure, wait rather than fail
            log.warning("cannot read which workers know %r (%s)", kind, first_line(exc))
            known = True
        self._kinds_elsewhere[kind] = (time.monotonic(), known)
        return known

    # -- heartbeats and the process registry --------------------------------

    def _registration(self) -> store.Statement:
        return self.store.register_process(self.name, "worker", socket.gethostname(), os.getpid(), version(),
                                           self.queues, sorted(self.app.tasks), self.concurrency,
                                           self.lease_seconds)

    def _leased_ids(self) -> list[int]:
        """Every job whose lease this worker must keep: running, prefetched, or its outcome not yet written."""
        return snapshot(lambda: self._active) + [o.job_id for o in snapshot(lambda: self.completer.pending)]

    def _revoke(self, lost: set[int]) -> None:
        """On the loop: stop the tasks of jobs that are no longer ours (cancelled, or rescued meanwhile)."""
        for job_id in lost:
            if job_id in self._active:
                task, job = self._active[job_id]
                log.warning("job %d (%s) is no longer ours (cancelled or rescued): stopping its task",
                            job_id, job.kind)
                self._revoked.add(job_id)
                self._told.setdefault(job_id, time.monotonic())
                if task is not None:
                    task.cancel()

    def _job_on_the_loop(self) -> str | None:
        """From the heartbeat thread: the job whose task the loop is running now."""
        task = asyncio.current_task(self._loop)
        starting = None
        for job_id, (job_task, job) in snapshot(lambda: self._active.items()):
            if job_task is task:
                return f"job {job_id} ({job.kind})"
            if job_task is None:  # its task is running its first step inside _start (eager start)
                starting = f"job {job_id} ({job.kind})"
        return starting

    # -- what keeps a stopping worker alive --------------------------------------

    def _waiting_on(self, among: set[asyncio.Task] | None = None) -> list[dict]:
        """The worker's active jobs (those of ``among``, when given): id, kind, seconds running and seconds
        since told to stop (None: not begun, not told). Read from the heartbeat thread too."""
        now_ = time.monotonic()
        jobs = []
        for job_id, (task, job) in snapshot(lambda: self._active.items()):
            if among is not None and task not in among:
                continue
            began, told = self._began.get(job_id), self._told.get(job_id)
            jobs.append({"id": job_id, "kind": job.kind,
                         "running": None if began is None else round(now_ - began, 1),
                         "told": None if told is None else round(now_ - told, 1)})
        return jobs

    def _running_text(self, among: set[asyncio.Task] | None = None) -> str:
        """"job 5 (resize) running 12s, job 7 (ocr) told to stop 3s ago" for the log, the first ten."""
        parts = [f"job {j['id']} ({j['kind']}) " + (f"told to stop {j['told']:.0f}s ago" if j["told"] is not None
                                                    else f"running {j['running']:.0f}s" if j["running"] is not None
                                                    else "waiting for a slot")
                 for j in self._waiting_on(among)]
        more = f" and {len(parts) - 10} more" if len(parts) > 10 else ""
        return ", ".join(parts[:10]) + more

    def _stopping_state(self) -> str | None:
        """From the heartbeat thread: processes.stopping, the jobs a stopping worker waits for (JSON text)."""
        if self._stopping_since is None:
            return None
        return json.dumps({"since": self._stopping_since, "jobs": self._waiting_on()[:50]})

    async def _stuck(self, still: set[asyncio.Task]) -> None:
        """Tries told to stop that have not: never given back while they run. An embedded worker waits
        for them, their leases kept; the CLI's (``exit_when_stuck``) goes on with its shutdown and
        leaves the process at its end (``_shutdown``)."""
        what = self._running_text(still)
        if not self.exit_when_stuck:
            log.error("%s did not stop %gs after being told (blocked outside Python?): waiting for them; their "
                      "leases are kept until they return", what, self.stop_seconds)
            await asyncio.wait(still)
            return
        log.error("%s did not stop %gs after being told (blocked outside Python?): exiting without them; their "
                  "jobs are not given back, and are rescued once their leases (%gs) run out", what,
                  self.stop_seconds, self.lease_seconds)
        self.stats["stuck"] += len(still)

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
        served = {t.queue for t in self.app.tasks.values()}
        for queue in self.queues:
            if queue not in served:
                log.warning("queue %r has no task of this app (its queues: %s): jobs there wait for a worker "
                            "that knows their kind", queue, ", ".join(sorted(served)) or "none")
        self.completer.start(self._pool)
        async with self._pool.acquire() as conn:
            await store.records(conn, self._registration())
        self._heartbeat = Heartbeat(
            dsn=self.app.dsn, store=self.store, worker=self.name, lease_seconds=self.lease_seconds,
            interval=self.heartbeat_seconds, jobs=self._leased_ids, running=lambda: len(self._active),
            revoke=self._revoke, register=self._registration, loop=loop, watch=self._loop_watch,
            stall_warning=self.stall_warning, current_job=self._job_on_the_loop, stats=self.stats,
            application_name=f"{self.application_name} heartbeat", stopping=self._stopping_state)
        self._heartbeat.start()
        services_done = asyncio.Event()
        background = [
            asyncio.create_task(self._loop_watch.run(services_done), name="loop-watch"),
            asyncio.create_task(self.limiter.run(self._stopping), name="limiter"),
        ]
        # The maintenance services begin once the first claim is back: started beside it, their
        # first rounds (a dozen statements) took the server's cores from it on a small machine.
        services = [self.rescuer, self.rotator, self.pruner, self.history]
        if self.vacuumer is not None:
            services.append(self.vacuumer)
        if self.app.periodic_tasks:  # every worker runs the scheduler; each tick is enqueued once
            self.scheduler = Scheduler(self.app)
            services.append(self.scheduler)
        background += [asyncio.create_task(self._after_first_claim(s), name=s.name) for s in services]
        notifier = None
        if self.listen:
            notifier = Notifier(self.app.dsn, self.app.channel, set(self.queues), self.producer.notified,
                                application_name=self.application_name)
            background.append(asyncio.create_task(notifier.run(self._stopping), name="notifier"))
        self.started.set()
        try:
            await self.producer.run(self._pool, self._stopping)
        finally:
            await self._shutdown(services_done, background)
            if install_signals:
                GracefulSignals.remove(loop)
        return self.stats

    async def _after_first_claim(self, service: Service) -> None:
        await self.producer.first_claim.wait()  # set by the producer's end too
        if not self._stopping.is_set():
            await service.run(self._pool, self._stopping)

    async def _shutdown(self, services_done: asyncio.Event, background: list[asyncio.Task]) -> None:
        self.request_stop()
        self._stopping_since = time.time()
        if self._heartbeat is not None:
            self._heartbeat.wake()  # the registry says at once that this worker stops, and for which jobs
        tasks = [t for t, _ in self._active.values() if t is not None]
        if tasks:
            log.info("waiting up to %.0fs for %s: %s", self.grace_seconds, plural(len(tasks), "running job"),
                     self._running_text())
            _, still = await asyncio.wait(tasks, timeout=self.grace_seconds)
            if still:
                log.warning("giving back %s that did not finish within the grace period; stopping their tasks: %s",
                            plural(len(still), "job"), self._running_text(still))
                told = time.monotonic()
                for job_id, (task, _) in snapshot(lambda: self._active.items()):
                    if task in still:
                        self._told.setdefault(job_id, told)
                if self._heartbeat is not None:
                    self._heartbeat.wake()
                for t in still:
                    t.cancel()
                _, still = await asyncio.wait(still, timeout=self.stop_seconds)
                if still:
                    await self._stuck(still)
        drained = await self.completer.close(timeout=max(10.0, self.lease_seconds))
        if not drained:
            log.error("some outcomes were not written; those jobs return when their leases expire")
        services_done.set()
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._heartbeat is not None:
            await asyncio.to_thread(self._heartbeat.stop)
        if self._pool is not None:
            try:
                async with self._pool.acquire() as conn:
                    await store.records(conn, self.store.deregister_process(self.name))
            except Exception as exc:  # noqa: BLE001 - the rescuer drops the row once its lease runs out
                log.warning("could not deregister (%s)", first_line(exc))
            try:
                await asyncio.wait_for(self._pool.close(), 5.0)
            except Exception:
                self._pool.terminate()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped: %s", self.name, tally(self.stats, "no jobs run"),
                 extra={"joblane": {"stats": dict(self.stats)}})
        if self.stats["stuck"] and self.exit_when_stuck:
            logging.shutdown()
            # the threads that would not stop end with the process: nothing of their tries runs after this
            os._exit(3)
