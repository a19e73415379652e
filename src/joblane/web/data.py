"""What the dashboard reads, as plain dicts: every query is a named query of sql/dashboard.sql or an App call."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Any, Iterator

from psycopg_pool import ConnectionPool

from .. import admin, store
from ..app import App
from ..budgets import describe_window
from ..flows import waits_on
from ..rules import hold_reason
from ..types import JOB_STATES

# Below this size the whole jobs table is counted exactly; above it, done and
# cancelled jobs are shown as the planner's estimate (about 100k rows).
EXACT_COUNT_BYTES = 16 * 1024 * 1024
THROUGHPUT_MINUTES = 60
PAGE_SIZE = 50
BATCH_PAGE = 500  # a batch page lists its jobs by id, this many at a time
# The jobs search reads the primary key newest first in slices of this many ids,
# at most SEARCH_SLICES slices a page: a search no index serves stays bounded.
SEARCH_SLICE = 20_000
IN_FLIGHT_STATES = {"pending", "running", "held", "failed"}  # each has its partial index
SEARCH_SLICES = 10
HISTORY_WINDOWS = {"1h": 1, "24h": 24, "7d": 7 * 24}  # hours
HISTORY_KINDS = 12  # the history page charts this many kinds, the busiest


class Data:
    """The dashboard's reads and writes over a small connection pool of the app's database."""

    def __init__(self, app: App, *, pool_size: int = 4, statement_timeout_ms: int = 10_000):
        self.app = app
        self.pool = ConnectionPool(
            app.dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=5.0,  # a page waits this long for a connection, then says the database is unreachable
            # Autocommit: every read is one statement, and App's admin calls
            # commit on their own. Unprepared, so each filter gets its own plan
            # (a generic plan could not use the partial indexes).
            kwargs={"autocommit": True, "prepare_threshold": None,
                    # no JIT: every page is a few short statements, and compiling one (chosen on
                    # estimates, not real sizes) costs far more than running it
                    "options": f"-c statement_timeout={int(statement_timeout_ms)} -c jit=off",
                    "application_name": "joblane dashboard"},
            name="joblane-dashboard",
        )
        self._opened = False

    def open(self) -> None:
        if not self._opened:
            self.pool.open(wait=False)
            self._opened = True

    def close(self) -> None:
        if self._opened:
            self.pool.close()
            self._opened = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        self.open()
        with self.pool.connection() as conn:
            yield conn

    def _rows(self, stmt: store.Statement) -> list[tuple]:
        with self.connection() as conn:
            return store.fetch(conn, stmt)

    # -- overview ---------------------------------------------------------

    def queue_counts(self) -> dict[str, Any]:
        """Per queue: a count per state and the oldest ready job's age; plus totals, and whether they are exact."""
        queues: dict[str, dict[str, Any]] = {}

        def row(queue: str) -> dict[str, Any]:
            return queues.setdefault(queue, {"queue": queue, **{s: 0 for s in JOB_STATES}, "oldest_ready": None})

        for queue, state, jobs, oldest in self._rows(self.app.store.dashboard_queue_counts()):
            r = row(queue)
            r[state] = jobs
            if oldest is not None:
                r["oldest_ready"] = max(0.0, float(oldest))
        bytes_, estimated_rows, states, freqs = self._rows(self.app.store.dashboard_table_estimate(self.app.schema))[0]
        exact = bytes_ < EXACT_COUNT_BYTES
        totals = {s: sum(r[s] for r in queues.values()) for s in JOB_STATES}
        if exact:
            for queue, state, jobs in self._rows(self.app.store.dashboard_finished_counts()):
                row(queue)[state] = jobs
                totals[state] += jobs
        else:
            share = dict(zip(states or [], freqs or []))
            for state in ("done", "cancelled"):
                totals[state] = int(max(0.0, estimated_rows) * share.get(state, 0.0))
                for r in queues.values():
                    r[state] = None  # unknown per queue at this size
        oldest = [r["oldest_ready"] for r in queues.values() if r["oldest_ready"] is not None]
        return {
            "queues": [queues[q] for q in sorted(queues)],
            "totals": totals,
            "exact": exact,
            "oldest_ready": max(oldest) if oldest else None,
            "table_bytes": bytes_,
        }

    def throughput(self, minutes: int = THROUGHPUT_MINUTES) -> list[dict[str, int]]:
        """Finished and failed jobs per minute, oldest minute first."""
        return [{"ago": ago, "finished": finished, "failed": failed}
                for ago, finished, failed in self._rows(self.app.store.dashboard_throughput(minutes))]

    def workers(self, job_sample: int = 8) -> list[dict[str, Any]]:
        """Every live worker and relay (the registry, idle ones too) and every worker holding running jobs.

        A worker holding leases but no longer registered (it died) shows from
        its leases alone, flagged when they have expired.
        """
        now = dt.datetime.now(dt.timezone.utc)
        by_name: dict[str, dict[str, Any]] = {}
        for p in self.processes():
            by_name[p["name"]] = {"worker": p["name"], "role": p["role"], "host": p["host"], "pid": p["pid"],
                                  "version": p["version"], "queues": p["queues"], "concurrency": p["concurrency"],
                                  "jobs": 0, "running": [], "first_lease_left": None, "last_lease_left": None,
                                  "expired": False, "registered": True, "reported_running": p["running"],
                                  "started_at": p["started_at"], "last_seen": p["last_seen"],
                                  "seen_ago": (now - p["last_seen"]).total_seconds(),
                                  "stopping": _stopping(p.get("stopping"), now)}
        for w, n, queues, first, last, ids, kinds in self._rows(self.app.store.dashboard_workers(job_sample)):
            row = by_name.setdefault(w, {"worker": w, "role": "worker", "queues": queues, "registered": False,
                                         "concurrency": None, "seen_ago": None, "host": None, "pid": None,
                                         "version": None, "reported_running": None, "started_at": None,
                                         "last_seen": None, "stopping": None})
            row.update({"jobs": n, "first_lease_left": first, "last_lease_left": last,
                        "running": list(zip(ids, kinds)), "expired": first is not None and first < 0})
        return list(by_name.values())

    def processes(self) -> list[dict[str, Any]]:
        """The live workers and relays, from their registrations."""
        with self.connection() as conn:
            return admin.processes(self.app, conn)

    def paused_queues(self) -> list[dict[str, Any]]:
        return [{"queue": q, "seconds_left": left, "reason": reason}
                for q, left, reason in self._rows(self.app.store.dashboard_paused_queues())]

    def queues(self, failed_window: float = 3600.0) -> list[dict[str, Any]]:
        """Every queue with jobs, limits or a pause: depth, oldest ready, running, failed lately, limits, pause."""
        counts = self.queue_counts()
        rows: dict[str, dict[str, Any]] = {q["queue"]: dict(q) for q in counts["queues"]}
        blank = {**{s: 0 for s in JOB_STATES}, "oldest_ready": None}
        for queue, n in self.failed_recent(failed_window).items():
            rows.setdefault(queue, {"queue": queue, **blank})["failed_recent"] = n
        with self.connection() as conn:
            limits = admin.limits(self.app, conn)
            budgets = self.app.budget_status(conn)
        for lim in limits:
            rows.setdefault(lim["queue"], {"queue": lim["queue"], **blank})["limit"] = lim
        for b in budgets:  # one line per budget (its rows are one per key)
            mine = rows.setdefault(b["queue"], {"queue": b["queue"], **blank}).setdefault("budgets", [])
            if not any(m["budget"] == b["budget"] for m in mine):
                mine.append({**b, "source": admin.describe_cap_source(b),
                             "per": describe_window(b["window_seconds"])})
        for r in rows.values():
            r.setdefault("failed_recent", 0)
            r.setdefault("limit", None)
            r.setdefault("budgets", [])
        return [rows[q] for q in sorted(rows)]

    def failed_recent(self, seconds: float) -> dict[str, int]:
        return dict(self._rows(self.app.store.dashboard_failed_recent(float(seconds))))

    def limits(self) -> list[dict[str, Any]]:
        """Every limited or paused queue with its limits, pause and current usage (admin.limits)."""
        with self.connection() as conn:
            return admin.limits(self.app, conn)

    def budgets(self) -> list[dict[str, Any]]:
        """Every budget with each key's spend in its current window (App.budget_status)."""
        with self.connection() as conn:
            return self.app.budget_status(conn)

    def health(self) -> dict[str, Any]:
        """Sizes, dead rows and vacuum of joblane's tables, with warnings (admin.health)."""
        with self.connection() as conn:
            return admin.health(self.app, conn)

    def replay_tags(self) -> list[dict[str, Any]]:
        with self.connection() as conn:
            return admin.replay_tags(self.app, conn)

    def compare_replay(self, tag: str) -> dict[str, Any]:
        with self.connection() as conn:
            return self.app.compare_replay(tag, conn)

    def attempt_outcomes(self, seconds: float) -> dict[str, int]:
        return dict(self._rows(self.app.store.dashboard_attempt_outcomes(float(seconds))))

    # -- jobs ---------------------------------------------------------------

    def search_jobs(self, search: dict[str, Any], *, before_id: int | None = None,
                    limit: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], int | None]:
        """Jobs newest first matching a search (see ``search_args``), read in slices of ids; and, when the
        slices of one page ran out before ``limit`` rows matched, the id the search stopped at (older ids
        not searched yet), else None."""
        keys = ("id", "queue", "kind", "state", "priority", "attempts", "max_attempts", "run_after", "last_error",
                "created_at", "finished_at", "worker", "replay_of", "payload_preview", "wait_key", "parents_left",
                "batch_id")
        args = search_args(search)
        states = search.get("states") or []
        narrowed = any(search.get(k) for k in ("kind", "queue", "since", "until", "payload", "error"))
        if (states and set(states) <= IN_FLIGHT_STATES) or not narrowed:
            # a partial index holds just these states (work in flight, failures), or nothing filters: newest
            # first down the primary key stops at the first rows; either way one statement is bounded
            rows = self._rows(self.app.store.dashboard_search_jobs(*args, before_id, limit, None))
            return _with_waits([dict(zip(keys, r)) for r in rows]), None
        low, high = self._rows(self.app.store.dashboard_job_id_range())[0]
        if low is None:
            return [], None
        top = min(before_id, high + 1) if before_id is not None else high + 1
        rows: list[tuple] = []
        for _ in range(SEARCH_SLICES):
            if top <= low or len(rows) >= limit:
                break
            bottom = max(low, top - SEARCH_SLICE)
            rows += self._rows(self.app.store.dashboard_search_jobs(*args, top, limit - len(rows), bottom))
            top = bottom
        stopped = top if len(rows) < limit and top > low else None
        return _with_waits([dict(zip(keys, r)) for r in rows]), stopped

    def search_ids(self, search: dict[str, Any], limit: int) -> tuple[int, list[int]]:
        """How many jobs match a search in all, and the ids of the first ``limit`` of them (oldest first)."""
        total, ids = self._rows(self.app.store.dashboard_search_ids(*search_args(search), limit))[0]
        return total, list(ids)

    def job(self, job_id: int) -> dict[str, Any] | None:
        with self.connection() as conn:
            job = self.app.get_job(job_id, conn)
            if job is None:
                return None
            job.setdefault("replays", [])
            job["flow"] = self.app.job_flow(job_id, conn)
            flow = job["flow"] or {}
            job["waits_on"] = waits_on(job["state"], flow.get("wait_key"), flow.get("parents_left"))
            job["steps"] = [
                {"name": name, "attempt": attempt, "finished_at": finished,
                 "result": json.loads(result) if result is not None else None}
                for name, attempt, finished, result in store.fetch(conn, self.app.store.dashboard_job_steps(job_id))
            ]
        return job

    def held(self, *, after: tuple[dt.datetime, int] | None = None, queue: str | None = None,
             limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        """Held jobs, longest held first; ``after`` is the (held_since, id) of the last row of the page before."""
        after_time, after_id = after if after else (None, None)
        out = []
        rows = self._rows(self.app.store.dashboard_held_jobs(after_time, after_id, queue, limit))
        for i, q, kind, payload, reason, attempts, created, held_since, meta, result in rows:
            out.append({"id": i, "queue": q, "kind": kind, "payload": json.loads(payload),
                        "reason": hold_reason(reason), "attempts": attempts, "created_at": created,
                        "held_since": held_since, "meta": json.loads(meta) if meta else None,
                        "result": json.loads(result) if result else None})
        return out

    # -- history ------------------------------------------------------------

    def history(self, window: str) -> dict[str, Any]:
        """Attempts by outcome per queue and kind, and latency percentiles per queue, over ``window``.

        1h is the last hour to five minutes; 24h and 7d are whole UTC hours (the
        current one and those before it). Each reads the roll-ups the workers'
        history service made of its slices, and the attempts of the minutes no
        slice covers (the last few, or all of them when no worker has run).
        """
        hours = HISTORY_WINDOWS[window]
        now = dt.datetime.now(dt.timezone.utc)
        if hours == 1:
            since = now.replace(minute=now.minute - now.minute % 5, second=0, microsecond=0) - dt.timedelta(minutes=55)
        else:
            since = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=hours - 1)
        slices = self._rows(self.app.store.history_slices_since(since))
        starts, gaps_from, gaps_to = [], [], []
        cursor = since
        for start, seconds in slices:
            if start > cursor:
                gaps_from.append(cursor)
                gaps_to.append(start)
            starts.append(start)
            cursor = max(cursor, start + dt.timedelta(seconds=seconds))
        gaps_from.append(cursor)
        gaps_to.append(now + dt.timedelta(days=1))  # to the end: whatever finishes while we read
        by_kind: dict[tuple[str, str], dict[str, Any]] = {}
        for queue, kind, outcome, n in self._rows(self.app.store.history_counts(starts, gaps_from, gaps_to)):
            row = by_kind.setdefault((queue, kind), {"queue": queue, "kind": kind, "done": 0, "failed": 0,
                                                     "retry": 0, "other": 0, "attempts": 0})
            row[outcome if outcome in ("done", "failed", "retry") else "other"] += n
            row["attempts"] += n
        buckets: dict[tuple[str, str], dict[int, int]] = {}
        for queue, measure, bucket, n in self._rows(self.app.store.history_latency_buckets(starts, gaps_from,
                                                                                           gaps_to)):
            buckets.setdefault((queue, measure), {})[bucket] = n
        latency = []
        for queue in sorted({q for q, _ in buckets}):
            entry: dict[str, Any] = {"queue": queue}
            for measure in ("start", "finish"):
                hist = buckets.get((queue, measure), {})
                entry[measure] = {"jobs": sum(hist.values()), "p50": percentile(hist, 0.50),
                                  "p95": percentile(hist, 0.95)}
            latency.append(entry)
        rows = [by_kind[k] for k in sorted(by_kind)]
        totals = {k: sum(r[k] for r in rows) for k in ("done", "failed", "retry", "other", "attempts")}
        # What the page read from the attempts: the minutes since the last slice ("the last ..."), and any
        # other stretch no slice covers, counted from when the history begins (the first slice, or the first
        # attempt finished in the window): the empty time before it is not a span read from anywhere.
        [(first_attempt,)] = self._rows(self.app.store.history_first_attempt(since))
        begins = min([t for t in (starts[0] if starts else None, first_attempt) if t is not None], default=None)
        trailing = max(0.0, (now - max(gaps_from[-1], begins or now)).total_seconds())
        earlier = sum(max(0.0, (t - max(f, begins)).total_seconds())
                      for f, t in zip(gaps_from[:-1], gaps_to[:-1])) if begins else 0.0
        return {"window": window, "since": since, "rows": rows, "totals": totals, "latency": latency,
                "slices": len(starts), "unrolled_seconds": trailing, "gap_seconds": earlier,
                "begins": begins if begins is not None and begins > since else None, "empty": begins is None,
                **self._history_series(since, now, hours, starts, gaps_from, gaps_to)}

    def _history_series(self, since: dt.datetime, now: dt.datetime, hours: int, starts: list, gaps_from: list,
                        gaps_to: list) -> dict[str, Any]:
        """The history over time, a bucket per five minutes (1h) or per hour: done and failed for all queues,
        per queue and per kind (the most active HISTORY_KINDS kinds), and enqueue-to-start p50/p95 per queue."""
        step = 300 if hours == 1 else 3600
        n = int((now - since).total_seconds() // step) + 1
        times = [since + dt.timedelta(seconds=step * i) for i in range(n)]

        def blank() -> list[dict[str, Any]]:
            return [{"at": t, "done": 0, "failed": 0} for t in times]

        total, per_queue, per_kind = blank(), {}, {}
        for at, queue, kind, done, failed in self._rows(self.app.store.history_series(starts, gaps_from, gaps_to,
                                                                                       step)):
            i = int((at - since).total_seconds() // step)
            if not 0 <= i < n:
                continue
            for series in (total, per_queue.setdefault(queue, blank()), per_kind.setdefault((queue, kind), blank())):
                series[i]["done"] += done
                series[i]["failed"] += failed
        busiest = sorted(per_kind, key=lambda k: -sum(b["done"] + b["failed"] for b in per_kind[k]))
        hists: dict[str, list[dict[int, int]]] = {}
        for at, queue, bucket, jobs in self._rows(self.app.store.history_latency_series(starts, gaps_from, gaps_to,
                                                                                        step)):
            i = int((at - since).total_seconds() // step)
            if 0 <= i < n:
                hist = hists.setdefault(queue, [{} for _ in times])[i]
                hist[bucket] = hist.get(bucket, 0) + jobs
        waits = {queue: [{"at": t, "jobs": sum(h.values()), "p50": percentile(h, 0.50), "p95": percentile(h, 0.95)}
                         for t, h in zip(times, hs)] for queue, hs in sorted(hists.items())}
        return {"step": step, "series": total, "series_by_queue": dict(sorted(per_queue.items())),
                "series_by_kind": {k: per_kind[k] for k in sorted(busiest[:HISTORY_KINDS])},
                "kinds_left_out": max(0, len(busiest) - HISTORY_KINDS), "waits_by_queue": waits}

    # -- batches ------------------------------------------------------------

    def batches(self, *, before_id: int | None = None, limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        with self.connection() as conn:
            return self.app.list_batches(conn, before_id=before_id, limit=limit)

    def batch(self, batch_id: int, *, state: str | None = None, limit: int = 500,
              after_id: int | None = None) -> dict[str, Any] | None:
        """The batch's progress and a page of its jobs by id (``limit``, above ``after_id``); ``more`` when the
        page does not hold the last of them."""
        with self.connection() as conn:
            found = self.app.batch_progress(batch_id, conn)
            if found is not None:
                jobs = self.app.batch_jobs(batch_id, conn, state=state, limit=limit + 1, after_id=after_id)
                found["jobs"], found["more"] = jobs[:limit], len(jobs) > limit
        return found

    # -- outbox -------------------------------------------------------------

    def outbox_topics(self, sent_window: float = 3600.0) -> list[dict[str, Any]]:
        """Per topic: pending, retrying (pending after a failed try), failed, sent lately, oldest unsent age."""
        topics: dict[str, dict[str, Any]] = {}
        for topic, state, n, oldest in self._rows(self.app.store.dashboard_outbox_topics(sent_window)):
            t = topics.setdefault(topic, {"topic": topic, "pending": 0, "retrying": 0, "failed": 0, "sent": 0,
                                          "lag": None})
            t[state] = n
            if oldest is not None:
                t["lag"] = max(t["lag"] or 0.0, float(oldest), 0.0)
        return [topics[t] for t in sorted(topics)]

    def outbox_unrouted(self) -> dict[str, Any]:
        """Pending messages no route matches (the app's routes and the live relays'), per topic."""
        with self.connection() as conn:
            found = admin.unrouted_outbox(self.app, conn)
        found["by_topic"] = {t["topic"]: t["messages"] for t in found["topics"]}
        return found

    def outbox_retrying(self, *, topic: str | None = None, limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        keys = ("id", "topic", "key", "attempts", "max_attempts", "run_after", "last_error", "created_at")
        return [dict(zip(keys, r)) for r in self._rows(self.app.store.dashboard_outbox_retrying(topic, limit))]

    def outbox_message(self, message_id: int) -> dict[str, Any] | None:
        with self.connection() as conn:
            return admin.outbox_message(self.app, message_id, conn)

    def outbox_failed(self, *, before_id: int | None = None, topic: str | None = None,
                      limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        keys = ("id", "topic", "key", "idempotency_key", "attempts", "last_error", "created_at", "payload_preview")
        rows = self._rows(self.app.store.dashboard_outbox_failed(before_id, topic, limit))
        return [dict(zip(keys, r)) for r in rows]


def search_args(search: dict[str, Any]) -> tuple:
    """The filter parameters of the search queries: states, kind, queue, since, until, payload JSON, error text."""
    payload = search.get("payload")
    return (search.get("states") or None, search.get("kind") or None, search.get("queue") or None,
            search.get("since"), search.get("until"),
            json.dumps(payload) if payload else None, search.get("error") or None)


def percentile(hist: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile, in seconds, of a latency histogram (bucket b: 2^(b/2) to 2^((b+1)/2) ms): the upper
    edge of the bucket it falls in, so the figure is never below the true one."""
    total = sum(hist.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return 2 ** ((bucket + 1) / 2) / 1000.0
    return 2 ** ((max(hist) + 1) / 2) / 1000.0


def _with_waits(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job with ``waits_on``: what a waiting job waits for, in words (else None)."""
    for job in jobs:
        job["waits_on"] = waits_on(job["state"], job["wait_key"], job["parents_left"])
    return jobs


def _stopping(stopping: dict[str, Any] | None, now: dt.datetime) -> dict[str, Any] | None:
    """A stopping worker's registry entry for the page: for how long, and the jobs that keep it alive."""
    if not stopping:
        return None
    return {"seconds": max(0.0, now.timestamp() - float(stopping.get("since") or 0)),
            "jobs": list(stopping.get("jobs") or [])}
