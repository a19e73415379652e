"""Vacuumer: vacuum a queue's hot table as soon as its dead row versions pile up, not once a minute."""

from __future__ import annotations

import time
from typing import Any, Callable

from .. import store
from ..rules import holder_name, holder_text
from ..store import Statement, Store
from .service import Service


# a session whose snapshot or transaction is at least this old, found behind a vacuum that removed next
# to nothing, holds the horizon; a younger one is a busy database's ordinary traffic
HELD_SECONDS = 5.0


class Vacuumer(Service):
    """Vacuums ``tables`` (of ``jobs`` and ``outbox``) whose dead row versions reach ``min_dead``.

    Every claim and every completion leaves a dead version of a job's row,
    and until a vacuum removes it the claims step over its entry in the
    index of ready jobs: a claim of 200 behind 250,000 claimed jobs reads
    about 1,500 index pages instead of a few. Autovacuum looks for work once
    per ``autovacuum_naptime`` (a minute by default): at a few thousand jobs
    a second, hundreds of thousands of dead versions pile up in between and
    claims slow down.

    This service reads the statistics every ``check`` seconds (at most
    ``interval``) and vacuums a table that has ``min_dead`` dead versions
    and no vacuum for a while: ``interval`` seconds at most, less when its
    last vacuum here was quick. The wait after a vacuum is its duration
    divided by ``share`` (at least ``check``), so vacuuming takes at most
    about that share of the time: a small hot table is vacuumed every
    second or two, a big one no more often than its vacuums can afford. A
    quiet queue is left to autovacuum.

    While a session holds an old snapshot (an idle ``REPEATABLE READ``
    transaction, a long report), a replication slot or a prepared transaction
    holds the horizon back, no vacuum can remove the versions deleted since:
    vacuuming again every second then only costs I/O. A vacuum that leaves
    most of the dead versions behind looks up what holds the horizon
    (``horizon_holder``), says so once in the log, naming it, and the table
    is not vacuumed again until that holder has ended or moved on.

    ``VACUUM`` cannot run in a transaction, so a round takes no advisory lock:
    ``SKIP_LOCKED`` passes over a table that autovacuum, another worker or
    another relay is vacuuming, and the statistics show a table just
    vacuumed elsewhere as done. Only the table's owner may vacuum it: for
    another role the check finds nothing to do and autovacuum keeps the job.
    """

    name = "vacuumer"

    def __init__(self, store: Store, *, tables: tuple[str, ...], interval: float = 10.0, min_dead: int = 20_000,
                 check: float = 1.0, share: float = 0.1, **kw: Any):
        if not check > 0:
            raise ValueError("vacuumer: check must be a positive number of seconds")
        if not 0 < share <= 1:
            raise ValueError("vacuumer: share must be in (0, 1]")
        super().__init__(store, interval=interval, **kw)
        self.longest = self.interval  # the wait between vacuums of a table, at most
        self.check = min(float(check), self.longest)
        self.interval = self.check  # the service's rounds: one look at the statistics each
        self.share = float(share)
        self.took: dict[str, float] = {}  # table -> seconds its last vacuum here took
        known: dict[str, Callable[[], Statement]] = {"jobs": store.vacuum_jobs, "outbox": store.vacuum_outbox}
        if not tables or any(t not in known for t in tables):
            raise ValueError(f"vacuumer: tables must be among {', '.join(known)}")
        if min_dead < 1:
            raise ValueError("vacuumer: min_dead must be at least 1")
        self.tables = list(tables)
        self.min_dead = int(min_dead)
        self._vacuum = known
        self.seconds = 0.0  # spent vacuuming, all rounds together (a metric)
        self.blocked: dict[str, dict[str, Any]] = {}  # table -> the horizon's holder its last vacuum ran into
        self.futile = 0  # vacuums that could remove next to nothing (a metric)

    async def run_once(self, conn: Any) -> list[tuple[str, int]]:
        """Vacuum the tables due, outside any transaction; the (table, dead versions before) vacuumed."""
        if self.blocked:
            await self._still_blocked(conn)
        tables = [t for t in self.tables if t not in self.blocked]
        if not tables:
            self.runs += 1
            return []
        due = await store.records(conn, self.store.vacuum_due(tables, self.min_dead,
                                                              min(self.wait(t) for t in tables)))
        done = []
        for table, dead, idle in due:
            if idle < self.wait(table):
                continue
            started = time.monotonic()
            await store.run(conn, self._vacuum[table]())
            took = time.monotonic() - started
            self.took[table] = took
            self.seconds += took
            done.append((table, dead))
            await self._check_removed(conn, table, dead)
        self.runs += 1
        self.total += len(done)
        return done

    async def _check_removed(self, conn: Any, table: str, before: int) -> None:
        """After a vacuum: when it left most dead versions behind, find what holds the horizon and stop."""
        left = await store.value(conn, self.store.dead_rows(table))
        if left is None or left < self.min_dead or left < before / 2:
            return
        self.futile += 1
        holder = await self.holder(conn)
        if holder is None or (holder["seconds"] is not None and holder["seconds"] < HELD_SECONDS):
            return  # the versions were just deleted and a short transaction still sees them: not a held horizon
        self.blocked[table] = holder
        self.log.warning("%s: vacuum of %s could remove %s of %s dead row versions: %s holds back the horizon; "
                         "%s is not vacuumed again until it ends", self.name, table, f"{max(before - left, 0):,}",
                         f"{before:,}", holder_text(holder), table,
                         extra={"joblane": {"table": table, "dead": left, "horizon": holder}})

    async def _still_blocked(self, conn: Any) -> None:
        """Unblock the tables whose horizon holder has ended, or begun a newer snapshot."""
        now = await self.holder(conn)
        for table, holder in list(self.blocked.items()):
            same = (now is not None and (now["kind"], now["who"]) == (holder["kind"], holder["who"])
                    and (now["xid_age"] or 0) >= (holder["xid_age"] or 0))
            if not same:
                del self.blocked[table]
                self.log.info("%s: the horizon moved on (%s no longer holds it): vacuuming %s again", self.name,
                              holder_name(holder), table)

    def wait(self, table: str) -> float:
        """Seconds a table must go unvacuumed before it is due: its last vacuum here over ``share``, at least
        ``check``, at most ``interval`` (also before this process has vacuumed it: its cost is unknown)."""
        took = self.took.get(table)
        if took is None:
            return self.longest
        return min(self.longest, max(self.check, took / self.share))

    def report(self, done: list) -> None:
        for table, dead in done:
            self.log.debug("%s: vacuumed %s (%d dead row versions)", self.name, table, dead)
