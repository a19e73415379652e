"""The relay: claim pending outbox rows in batches, deliver them through their route's sink, record the outcome.

Same shape as the maintenance services: validated configuration with
defaults, ``run_once()`` that does one batch and returns what it did, and a
loop that waits for a notification or a jittered poll between batches.

One batch is three steps and two transactions in PostgreSQL:
1. claim: one statement leases up to ``batch_size`` rows (SKIP LOCKED, so
   relays running side by side take different rows) and commits, so no
   transaction stays open while a destination is slow; it reads each
   topic's entries from a cursor (migration 17), never the rows sent
   before (a relay's claims take turns; its batches deliver side by side);
2. deliver: each route's sink gets its rows at once; rows of one key on an
   ordered route go out one after another, and a failure holds back the
   rest of that key;
3. finish: one statement marks the whole batch sent, retried (with
   backoff), failed or released, guarded by the lease this relay holds,
   in a transaction planned without nested loops (hash_joins_only).
A relay that dies between 1 and 3 leaves its rows leased; when the lease
ends any relay takes them again (every half lease each relay gives such rows
new entries: ``requeue_lost_outbox``) and re-sends them with the same
idempotency key.

Logs (logger ``joblane.outbox``): a line per retried row (INFO) and per
failed row (WARNING) with the reason, a line per sent row at DEBUG, and
every ``summary_interval`` seconds a summary of what was sent, retried and
failed (only when something was); once per topic, a WARNING when pending
rows wait that no live relay's route matches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import asyncpg

from .. import store, telemetry
from ..errors import JoblaneError
from ..lifecycle import POOLER_FOUND, GracefulSignals, retry_delay, sleep_unless, version
from ..maintenance import OutboxPruner, Rotator, Vacuumer
from ..migrations import check_async
from ..notifier import Notifier
from ..rules import bounded_delay, bounded_text, plural, tally
from .message import Delivery, Message, describe
from .publish import channel
from .routes import Route, route_for

if TYPE_CHECKING:  # pragma: no cover
    from ..app import App

log = logging.getLogger("joblane.outbox")

CONNECT_TRY_SECONDS = 5.0  # one connection attempt of a starting relay (asyncpg's own default is 60 s)
MAX_RETRY_AFTER = 86400.0  # the longest Retry-After a destination may ask for
SENT, RETRY, FAILED, RELEASED = "sent", "retry", "failed", "released"


@dataclass
class RelayResult:
    """What one ``run_once()`` did."""

    claimed: int = 0
    sent: int = 0  # delivered now, or found by read-back
    found: int = 0  # of those, already at the destination (read-back): not sent again
    retried: int = 0
    failed: int = 0
    released: int = 0  # handed back untried: an earlier row of the key failed in this batch
    stale: int = 0  # outcomes not recorded: the lease had passed to another relay
    ids: dict[str, list[int]] = field(default_factory=dict)

    def add(self, other: "RelayResult") -> None:
        for name in ("claimed", "sent", "found", "retried", "failed", "released", "stale"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(slots=True)
class _Outcome:
    message: Message
    outcome: str
    delay: float = 0.0
    error: str | None = None
    max_attempts: int | None = None


class Relay:
    """Delivers the app's outbox through the sinks routed with ``app.route(prefix, sink)``.

    ``concurrency`` batches of up to ``batch_size`` rows are in flight at
    once. A claimed row is leased for ``lease_seconds``, extended while its
    batch is still being delivered. Relays find new rows by LISTEN/NOTIFY
    (unless ``listen=False``, e.g. behind PgBouncer in transaction pooling)
    and by polling every ``poll_interval`` seconds (with jitter).
    """

    def __init__(
        self,
        app: App,
        *,
        routes: Sequence[Route] | None = None,
        batch_size: int = 200,
        concurrency: int = 2,
        poll_interval: float = 1.0,
        lease_seconds: float = 30.0,
        grace_seconds: float = 15.0,
        delivery_timeout: float = 300.0,
        listen: bool = True,
        jitter: float = 0.2,
        retention_seconds: float = 7 * 86400.0,
        prune_interval: float = 10.0,
        vacuum_interval: float = 10.0,
        ring_turn_seconds: float = 10.0,
        name: str | None = None,
        connect_timeout: float = 60.0,
        pgbouncer: bool | None = None,
        summary_interval: float = 60.0,
        gather_seconds: float = 0.02,
    ):
        routes = list(app.routes if routes is None else routes)
        if not routes:
            raise JoblaneError("the app routes no topic: add app.route(\"prefix.\", sink) before starting a relay")
        if not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
            raise JoblaneError("batch_size must be an integer from 1 to 10000")
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 64:
            raise JoblaneError("concurrency must be an integer from 1 to 64")
        if not poll_interval > 0:
            raise JoblaneError("poll_interval must be positive")
        if not lease_seconds >= 1:
            raise JoblaneError("lease_seconds must be at least 1")
        if grace_seconds < 0:
            raise JoblaneError("grace_seconds must be >= 0")
        if not delivery_timeout > 0:
            raise JoblaneError("delivery_timeout must be positive")
        if not 0 <= jitter < 1:
            raise JoblaneError("jitter must be in [0, 1)")
        if not summary_interval > 0:
            raise JoblaneError("summary_interval must be positive")
        if not vacuum_interval >= 0:
            raise JoblaneError("vacuum_interval must be >= 0 seconds (0 leaves vacuum to autovacuum)")
        self.app = app
        self.routes = routes
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.poll_interval = float(poll_interval)
        self.lease_seconds = float(lease_seconds)
        self.heartbeat_seconds = self.lease_seconds / 3
        self.grace_seconds = float(grace_seconds)
        self.delivery_timeout = float(delivery_timeout)
        # behind PgBouncer in transaction pooling: no named prepared statements, poll instead of LISTEN
        self.pgbouncer = None if pgbouncer is None else bool(pgbouncer)  # None: found out at start
        self.listen = listen and not self.pgbouncer
        self.jitter = jitter
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        if not connect_timeout >= 0:
            raise JoblaneError("connect_timeout must be >= 0")
        # how long a starting relay waits for an unreachable database before it exits
        self.connect_timeout = float(connect_timeout)
        self.application_name = f"joblane relay {os.getpid()}"
        self.stats: Counter[str] = Counter()
        # every summary_interval seconds one log line of what was sent, retried and failed since the last one
        self.summary_interval = float(summary_interval)
        self.metrics: Any = None  # telemetry.RelayMetrics, set by telemetry.serve_relay_metrics
        self.store = app.store
        self.pruner = OutboxPruner(self.store, retention=retention_seconds, interval=prune_interval)
        # vacuums the outbox when its dead row versions pile up between autovacuum's passes (0: autovacuum only)
        self.vacuumer = Vacuumer(self.store, tables=("outbox",), interval=vacuum_interval) if vacuum_interval else None
        # the ring of entries the claims read (shared with the workers' claim, migrations 0013 and 0017): a
        # relay turns it too, so an outbox served by relays alone gives its space back; one process at a time
        self.rotator = Rotator(self.store, turn_every=ring_turn_seconds)
        self._prefixes = [r.prefix for r in routes]
        self._ordered = [r.ordered for r in routes]
        self._claiming = asyncio.Lock()
        self._swept_at = float("-inf")  # when requeue_lost last ran (the event loop's clock)
        self._unrouted_said: set[str] = set()  # topics whose rows wait with no route, already logged
        self._sinks = list({id(r.sink): r.sink for r in routes}.values())
        self._pool: asyncpg.Pool | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        if not 0 <= gather_seconds <= 1:
            raise JoblaneError("gather_seconds must be from 0 to 1")
        # after a notification, how long a loop lets more publishes commit before it claims
        self.gather_seconds = float(gather_seconds)
        # when the last notification arrived and when the last claim statement began (the event loop's
        # clock): a loop woken by a notification that a claim begun since has already seen does not claim
        self._woken_at = float("-inf")
        self._claim_began = float("-inf")
        self._last_full = False  # the last claim took a whole batch: more may wait
        self.started = asyncio.Event()

    # -- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Connect to PostgreSQL, check the schema, open every sink."""
        if self._pool is not None:
            return
        self._pool = await self._connect()
        for sink in self._sinks:
            try:
                await sink.open()
            except Exception as exc:
                # A destination that is down now is retried with each batch
                # (sinks connect lazily); its rows back off meanwhile.
                log.warning("relay: cannot open %r yet (%s); its rows wait and retry", sink, describe(exc))

    async def close(self) -> None:
        for sink in self._sinks:
            await _quietly(sink.close())
        await self._close_pool()

    async def __aenter__(self) -> "Relay":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def request_stop(self) -> None:
        """Stop claiming; batches in flight are delivered and recorded within ``grace_seconds``."""
        self._stopping.set()
        self._wake.set()

    async def _plan_for_arguments(self, conn: asyncpg.Connection) -> None:
        await store.run(conn, self.store.plan_for_arguments())

    async def _connect(self) -> asyncpg.Pool:
        try:
            # Behind PgBouncer in transaction pooling nothing is prepared (asyncpg's cache off), so every
            # statement is planned for its arguments; elsewhere each connection asks for that when it
            # connects (plan_for_arguments: a generic plan of finish_outbox costs 20x).
            if self.pgbouncer is None:
                self.pgbouncer = await store.dsn_through_pooler(self.app.dsn, self.application_name,
                                                                CONNECT_TRY_SECONDS)
                if self.pgbouncer:
                    self.listen = False
                    log.info(POOLER_FOUND, self.poll_interval)
            options: dict = {"statement_cache_size": 0} if self.pgbouncer else {"init": self._plan_for_arguments}
            pool = await asyncpg.create_pool(self.app.dsn, min_size=1,
                                             max_size=self.concurrency + 3 + (self.vacuumer is not None),
                                             reset=store.keep_session, **options, timeout=CONNECT_TRY_SECONDS,
                                             server_settings={"application_name": self.application_name})
        except (asyncpg.InvalidCatalogNameError, asyncpg.InvalidAuthorizationSpecificationError) as exc:
            raise JoblaneError(f"cannot use the database: {describe(exc)}") from None
        except asyncpg.ClientConfigurationError as exc:  # a malformed URL: retrying cannot help
            raise JoblaneError(f"invalid database URL: {describe(exc)}") from None
        except (OSError, asyncpg.PostgresError, asyncio.TimeoutError) as exc:
            why = (f"no answer within {CONNECT_TRY_SECONDS:g}s" if isinstance(exc, asyncio.TimeoutError)
                   else describe(exc))
            raise _Unreachable(f"cannot connect to the database: {why}") from None
        try:
            async with pool.acquire() as conn:
                await check_async(conn, self.app.schema)
        except BaseException:
            pool.terminate()
            raise
        return pool

    async def _close_pool(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), 5.0)
            except Exception:
                pool.terminate()

    # -- one batch --------------------------------------------------------

    async def run_once(self, limit: int | None = None, *, redundant: bool = False) -> RelayResult:
        """Claim, deliver and record one batch (at most ``limit`` rows, default ``batch_size``).

        ``redundant``: the caller was woken by a notification; when a claim of another loop began after
        it arrived (and did not come back full), that claim saw the rows announced, and this one claims
        nothing. Two loops woken by one publish then make one claim, not two."""
        if self._pool is None:
            await self.start()
        result = RelayResult()
        async with self._claiming:
            if redundant and self._claim_began > self._woken_at and not self._last_full:
                return result  # a claim that began after the notification took what it announced
            async with self._pool.acquire() as conn:
                for _ in range(4):
                    self._claim_began = asyncio.get_running_loop().time()
                    self.stats["claims"] += 1
                    rows = await store.records(conn, self.store.claim_outbox(
                        limit or self.batch_size, self._prefixes, self._ordered, self.name, self.lease_seconds))
                    # the last row (id NULL) says whether to claim again at once: a topic was busy with another
                    # relay's claim, or rows that came due were promoted, which only a later claim takes
                    *rows, stop = rows
                    if rows:
                        break
                    # nothing to do: rows a dead relay left leased get new entries (at most every half lease)
                    if not stop[6] and not await self._requeue_lost_due(conn):
                        break
            self._last_full = len(rows) >= (limit or self.batch_size)
        if not rows:
            return result
        result.claimed = len(rows)
        # From here the rows are leased to us: every one gets an outcome, or
        # (if this process dies) comes back when its lease ends.
        messages = [_message(r) for r in rows]
        budgets = {r[0]: r[7] for r in rows}
        heartbeat = asyncio.create_task(self._heartbeat([m.id for m in messages]))
        started_ns = telemetry.now_ns()
        try:
            outcomes = await asyncio.wait_for(self._deliver(messages, budgets), self.delivery_timeout)
        except asyncio.TimeoutError:
            # Some may have arrived: they are sent again, with the same keys.
            error = f"delivery of the batch took longer than {self.delivery_timeout:g}s"
            outcomes = [self._judge(route_for(self.routes, m.topic), m, Delivery.retry(error), budgets.get(m.id))
                        for m in messages]
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        telemetry.delivered(outcomes, started_ns)  # one span per row, child of its publish; no-op without OpenTelemetry
        applied = await self._finish(outcomes)
        for o in outcomes:
            if o.message.id not in applied:
                result.stale += 1
                continue
            if o.outcome == SENT:
                result.sent += 1
            elif o.outcome == RETRY:
                result.retried += 1
            elif o.outcome == FAILED:
                result.failed += 1
            else:
                result.released += 1
            result.ids.setdefault(o.outcome, []).append(o.message.id)
        result.found = sum(1 for o in outcomes if o.error == _FOUND and o.message.id in applied)
        for name in ("claimed", "sent", "found", "retried", "failed", "released", "stale"):
            self.stats[name] += getattr(result, name)
        self._report([o for o in outcomes if o.message.id in applied], started_ns)
        if result.stale:
            log.info("relay: %d outcomes arrived after another relay took the rows over", result.stale)
        return result

    async def _deliver(self, messages: list[Message], budgets: dict[int, int | None]) -> list[_Outcome]:
        by_route: dict[int, tuple[Route, list[Message]]] = {}
        lost: list[_Outcome] = []
        for m in messages:
            route = route_for(self.routes, m.topic)
            if route is None:  # cannot happen: the claim only takes routed topics
                lost.append(_Outcome(m, RELEASED))
                continue
            by_route.setdefault(id(route), (route, []))[1].append(m)
        groups = await asyncio.gather(*(self._deliver_route(route, ms, budgets) for route, ms in by_route.values()))
        return lost + [o for group in groups for o in group]

    async def _deliver_route(self, route: Route, messages: list[Message],
                             budgets: dict[int, int | None]) -> list[_Outcome]:
        if not route.ordered:
            waves = [messages]
        else:
            # Rows of one (topic, key) go out one after another, in id order;
            # rows without a key and the heads of different keys go together.
            queues: dict[tuple[str, str], list[Message]] = defaultdict(list)
            first = []
            for m in sorted(messages, key=lambda m: m.id):
                if m.key is None:
                    first.append(m)
                else:
                    queues[(m.topic, m.key)].append(m)
            waves = []
            depth = max((len(q) for q in queues.values()), default=0)
            for i in range(max(depth, 1)):
                wave = (first if i == 0 else []) + [q[i] for q in queues.values() if i < len(q)]
                waves.append(wave)
        outcomes: list[_Outcome] = []
        blocked: set[tuple[str, str]] = set()
        for wave in waves:
            ready = []
            for m in wave:
                if m.key is not None and (m.topic, m.key) in blocked:
                    outcomes.append(_Outcome(m, RELEASED))
                else:
                    ready.append(m)
            if not ready:
                continue
            deliveries = await self._send(route, ready)
            for m, d in zip(ready, deliveries):
                outcome = self._judge(route, m, d, budgets.get(m.id))
                outcomes.append(outcome)
                if route.ordered and m.key is not None and outcome.outcome != SENT:
                    blocked.add((m.topic, m.key))
        return outcomes

    async def _send(self, route: Route, messages: list[Message]) -> list[Delivery]:
        """Deliver through the route's sink, asking read-back first about the messages tried before."""
        sink = route.sink
        results: dict[int, Delivery] = {}
        to_send = messages
        if sink.reads_back:
            again = [m for m in messages if m.attempt > 1]
            if again:
                answers = await asyncio.gather(*(sink.find(m) for m in again), return_exceptions=True)
                for m, found in zip(again, answers):
                    if isinstance(found, BaseException):
                        results[m.id] = Delivery.retry(f"read-back failed, not re-sent: {describe(found)}")
                    elif found:
                        results[m.id] = _FOUND_DELIVERY
                to_send = [m for m in messages if m.id not in results]
        if to_send:
            try:
                deliveries = await sink.send(to_send)
                if len(deliveries) != len(to_send):
                    raise RuntimeError(f"{sink!r} answered {len(deliveries)} results for {len(to_send)} messages")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = f"{sink!r}: {describe(exc)}"
                deliveries = [Delivery.retry(error)] * len(to_send)
            for m, d in zip(to_send, deliveries):
                results[m.id] = d
        return [results[m.id] for m in messages]

    def _judge(self, route: Route, m: Message, d: Delivery, budget: int | None) -> _Outcome:
        most = budget or route.max_attempts
        if d.ok:
            return _Outcome(m, SENT, error=_FOUND if d is _FOUND_DELIVERY else None, max_attempts=most)
        # A destination's error text (a response body) may hold NUL or undecodable bytes, which
        # PostgreSQL refuses: one such row would keep its whole batch from being recorded.
        error = bounded_text(d.error or "delivery failed")
        if d.permanent:
            return _Outcome(m, FAILED, error=error, max_attempts=most)
        if m.attempt >= most:
            return _Outcome(m, FAILED, error=bounded_text(f"gave up after {m.attempt} attempts: {error}"),
                            max_attempts=most)
        if d.retry_after is not None:
            delay = min(MAX_RETRY_AFTER, bounded_delay(d.retry_after))
        else:
            delay = bounded_delay(route.backoff(m.attempt))
        return _Outcome(m, RETRY, delay=delay, error=error, max_attempts=most)

    def _report(self, outcomes: list[_Outcome], started_ns: int) -> None:
        """Metrics, and a log line per recorded outcome: retries at INFO, failures at WARNING, the rest at DEBUG."""
        if self.metrics is not None:
            self.metrics.observe(outcomes, started_ns)
        for o in outcomes:
            level = _LEVELS.get(o.outcome, logging.DEBUG)
            if not log.isEnabledFor(level):
                continue
            m = o.message
            fields = {"outbox_id": m.id, "topic": m.topic, "key": m.key, "idempotency_key": m.idempotency_key,
                      "attempt": m.attempt, "max_attempts": o.max_attempts, "outcome": o.outcome}
            if o.outcome == RETRY:
                fields["retry_in"] = round(o.delay, 3)
                what = f"retry in {o.delay:.3g}s"
            elif o.outcome == RELEASED:
                what = "released (an earlier row of its key was not sent)"
            else:
                what = o.outcome
            if o.error:
                fields["error"] = o.error
            why = f": {o.error}" if o.error else ""
            tries = f"/{o.max_attempts}" if o.max_attempts else ""
            log.log(level, "outbox %d %s attempt %d%s: %s%s", m.id, m.topic, m.attempt, tries, what, why,
                    extra={"joblane": fields})

    async def _summaries(self) -> None:
        """Every ``summary_interval`` seconds, one line of what was done since the last one (none when idle)."""
        names = ("sent", "retried", "failed", "released", "stale")
        last = {n: self.stats[n] for n in names}
        while True:
            await asyncio.sleep(self.summary_interval)
            now = {n: self.stats[n] for n in names}
            delta = {n: now[n] - last[n] for n in names}
            last = now
            if any(delta.values()):
                log.info("relay: in the last %gs: %s", self.summary_interval,
                         ", ".join(f"{v} {n}" for n, v in delta.items() if v or n in ("sent", "retried", "failed")),
                         extra={"joblane": {"seconds": self.summary_interval, **delta}})

    async def check_unrouted(self) -> list[tuple[str, int]]:
        """Warn, once per topic, about pending rows that no route of this relay or of another live relay
        matches (the claim never takes them, so they would wait without a word); returns the newly said
        (topic, count) pairs. A topic is said again if its rows leave and others come."""
        async with self._pool.acquire() as conn:
            live = await store.records(conn, self.store.list_processes())
            prefixes = set(self._prefixes)
            prefixes.update("" if t == "*" else t for r in live if r[1] == "relay" for t in r[5])
            rows = await store.records(conn, self.store.unrouted_outbox(sorted(prefixes), 100))
        waiting = {r[0]: r[1] for r in rows}
        self._unrouted_said &= set(waiting)
        new = [(t, n) for t, n in waiting.items() if t not in self._unrouted_said]
        routes = ", ".join(repr(p) for p in sorted(prefixes))
        for topic, n in new:
            self._unrouted_said.add(topic)
            log.warning("relay: %s of topic %r %s with no route (routes: %s): add app.route(prefix, sink) for "
                        "it, or discard %s (joblane outbox --topic %s)", plural(n, "message"), topic,
                        "waits" if n == 1 else "wait", routes, "it" if n == 1 else "them", topic,
                        extra={"joblane": {"topic": topic, "messages": n, "unrouted": True}})
        return new

    async def _watch_unrouted(self) -> None:
        """check_unrouted now and every ``summary_interval`` seconds."""
        while not self._stopping.is_set():
            try:
                await self.check_unrouted()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.debug("relay: unrouted check: %s", describe(exc))
            await sleep_unless(self._stopping, self.summary_interval)

    async def _finish(self, outcomes: list[_Outcome]) -> set[int]:
        if not outcomes:
            return set()
        cols: list[list[Any]] = [[], [], [], [], []]
        for o in outcomes:
            error = None if o.error == _FOUND else o.error
            for col, value in zip(cols, (o.message.id, o.outcome, o.message.attempt, o.delay, error)):
                col.append(value)
        for attempt in range(4):
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    await store.run(conn, self.store.hash_joins_only())
                    rows = await store.records(conn, self.store.finish_outbox(*cols, self.name))
                return {r[0] for r in rows}
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == 3:
                    log.error("could not record %d outcomes (%s): those rows are delivered again when their "
                              "leases end", len(outcomes), describe(exc))
                    return set()
                await asyncio.sleep(0.2 * 2 ** attempt * random.uniform(0.8, 1.2))
        return set()

    async def _heartbeat(self, ids: list[int]) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                async with self._pool.acquire() as conn:
                    await store.run(conn, self.store.extend_outbox_leases(ids, self.name, self.lease_seconds))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("relay: lease extension failed (%s)", describe(exc))

    # -- the loop ---------------------------------------------------------

    async def _loop(self, index: int) -> None:
        failures = 0
        while not self._stopping.is_set():
            woken = self._wake.is_set()
            if woken and not self._last_full and self.gather_seconds > 0:
                # woken by a publish: let the next few commit first, so that a claim takes several rows
                # rather than one claim per row (each claim costs a statement and a commit)
                await self._sleep(self.gather_seconds)
            self._wake.clear()  # a notification that lands during the batch is kept
            try:
                # A stop request lets this batch finish: only the grace
                # period's end cancels it (its rows then return when their
                # leases end).
                result = await self.run_once(redundant=woken)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = retry_delay(failures, base=0.1, cap=10.0, jitter=0.2)
                log.warning("relay: batch failed (%s); retrying in %.2fs", describe(exc), delay)
                await self._sleep(delay)
                continue
            failures = 0
            if result.claimed:
                log.debug("relay %d: %s", index, {k: v for k, v in vars(result).items() if v and k != "ids"})
            if result.claimed < self.batch_size:
                await self._wait(self.poll_interval * random.uniform(1 - self.jitter, 1 + self.jitter))

    async def _wait(self, seconds: float) -> None:
        await sleep_unless(self._wake, seconds)

    def _notified(self, *_: object) -> None:
        self._woken_at = asyncio.get_running_loop().time()
        self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        await sleep_unless(self._stopping, seconds)

    async def requeue_lost(self, conn: asyncpg.Connection | None = None) -> int:
        """Give the pending rows whose lease expired (a relay died with them) new entries; returns how many.

        The claim that leased them consumed their entries (migration 17), so
        without this no claim would find them again."""
        if conn is None:
            async with self._pool.acquire() as conn:
                return await self.requeue_lost(conn)
        self._swept_at = asyncio.get_running_loop().time()
        n = await store.value(conn, self.store.requeue_lost_outbox()) or 0
        if n:
            log.info("relay: %s whose lease expired %s claimed again", plural(n, "message"),
                     "is" if n == 1 else "are", extra={"joblane": {"lost_leases": n}})
        return n

    async def _requeue_lost_due(self, conn: asyncpg.Connection) -> int:
        """requeue_lost, when the last one ran half a lease ago or more (it walks every leased row)."""
        if asyncio.get_running_loop().time() - self._swept_at < self.lease_seconds / 2:
            return 0
        return await self.requeue_lost(conn)

    async def _requeue_lost(self) -> None:
        """requeue_lost every half lease, busy or not: a dead relay's rows come back within 1.5 leases."""
        while not self._stopping.is_set():
            try:
                async with self._pool.acquire() as conn:
                    await self._requeue_lost_due(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.debug("relay: lost leases: %s", describe(exc))
            await sleep_unless(self._stopping, self.lease_seconds / 2)

    async def _registered(self) -> None:
        """Register in ``processes`` and renew it every third of the lease (a relay's loop runs no user code)."""
        while not self._stopping.is_set():
            try:
                async with self._pool.acquire() as conn:
                    # a relay runs no jobs: its row says it is alive and which topics it serves
                    if not await store.records(conn, self.store.heartbeat_process(self.name, 0, self.lease_seconds)):
                        await store.records(conn, _registration(self))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.debug("relay registration: %s", describe(exc))
            await sleep_unless(self._stopping, self.heartbeat_seconds)

    async def _deregister(self) -> None:
        try:
            async with self._pool.acquire() as conn:
                await store.records(conn, self.store.deregister_process(self.name))
        except Exception as exc:  # noqa: BLE001 - the rescuer drops the row once its lease runs out
            log.debug("relay deregistration: %s", describe(exc))

    async def run(self, *, install_signals: bool = True) -> Counter[str]:
        """Relay until ``request_stop()`` or SIGTERM/SIGINT; returns counts of what was done."""
        loop = asyncio.get_running_loop()
        if install_signals:
            GracefulSignals(self.request_stop, log,
                            draining=f"finishing the batches in flight (grace {self.grace_seconds:.0f}s)",
                            abandoning="leased rows come back when their leases end").install(loop)
        try:
            failures = 0
            deadline = loop.time() + self.connect_timeout
            while True:
                try:
                    await self.start()
                    break
                except _Unreachable as exc:
                    failures += 1
                    if self._stopping.is_set():
                        raise
                    if loop.time() >= deadline:
                        raise JoblaneError(f"{exc} (gave up after {self.connect_timeout:g}s): "
                                           "is DATABASE_URL right and the server up?") from None
                    delay = min(retry_delay(failures, base=0.2, cap=5.0), max(0.0, deadline - loop.time()))
                    if failures == 1:  # the first failure says what to check at once, not when the wait ends
                        log.error("%s: is DATABASE_URL right and the server up? Retrying for up to %gs "
                                  "(--connect-timeout)", exc, self.connect_timeout)
                    else:
                        log.warning("%s; retrying in %.1fs", exc, delay)
                    await self._sleep(delay)
            log.info("relay %s: %s", self.name,
                     ", ".join(f"{r.prefix or '*'} -> {r.sink!r}{' (ordered)' if r.ordered else ''}"
                               for r in self.routes))
            background = [asyncio.create_task(self.pruner.run(self._pool, self._stopping), name="outbox-pruner"),
                          asyncio.create_task(self.rotator.run(self._pool, self._stopping), name="outbox-rotator"),
                          asyncio.create_task(self._requeue_lost(), name="outbox-lost-leases"),
                          asyncio.create_task(self._summaries(), name="outbox-summary"),
                          asyncio.create_task(self._registered(), name="outbox-registration"),
                          asyncio.create_task(self._watch_unrouted(), name="outbox-unrouted")]
            if self.vacuumer is not None:
                background.append(asyncio.create_task(self.vacuumer.run(self._pool, self._stopping),
                                                      name="outbox-vacuumer"))
            if self.listen:
                notifier = Notifier(self.app.dsn, channel(self.app), {""}, self._notified,
                                    application_name=self.application_name)
                background.append(asyncio.create_task(notifier.run(self._stopping), name="outbox-listener"))
            loops = [asyncio.create_task(self._loop(i), name=f"relay-{i}") for i in range(self.concurrency)]
            self.started.set()
            await self._stopping.wait()
            _, still = await asyncio.wait(loops, timeout=self.grace_seconds)
            if still:
                log.warning("relay: %s did not finish within the grace period; their rows come back "
                            "when their leases end", plural(len(still), "batch"))
                for t in still:
                    t.cancel()
                await asyncio.gather(*still, return_exceptions=True)
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self._deregister()
        finally:
            await self.close()
            if install_signals:
                GracefulSignals.remove(loop)
        log.info("relay %s stopped: %s", self.name, tally(self.stats, "nothing delivered"),
                 extra={"joblane": {"stats": {k: v for k, v in self.stats.items() if v}}})
        return self.stats


# -- the process registry (joblane workers, the dashboard) ---------------------

def _registration(relay: Relay) -> store.Statement:
    topics = [r.prefix or "*" for r in relay.routes]
    return relay.store.register_process(relay.name, "relay", socket.gethostname(), os.getpid(), version(), topics,
                                        [], relay.concurrency, relay.lease_seconds)


class _Unreachable(JoblaneError):
    """PostgreSQL did not answer; the relay keeps trying."""


_FOUND = "found at the destination by read-back; not sent again"
_LEVELS = {RETRY: logging.INFO, FAILED: logging.WARNING}
_FOUND_DELIVERY = Delivery(True, _FOUND)


def _message(row) -> Message:
    return Message(
        id=row[0], topic=row[1], key=row[2], idempotency_key=row[3], body=row[4].encode(),
        headers=json.loads(row[5]) if row[5] else {}, attempt=row[6], created_at=row[8],
    )


async def _quietly(awaitable) -> None:
    try:
        await asyncio.wait_for(awaitable, 10.0)
    except Exception as exc:
        log.warning("relay: closing failed (%s)", describe(exc))
