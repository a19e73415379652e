"""What the dashboard reads, as plain dicts: every query is a named query of sql/dashboard.sql or an App call."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Any, Iterator

from psycopg_pool import ConnectionPool

from .. import admin, store
from ..app import App
from ..flows import waits_on
from ..rules import hold_reason
from ..types import JOB_STATES

# Below this size the whole jobs table is counted exactly; above it, done and
# cancelled jobs are shown as the planner's estimate (about 100k rows).
EXACT_COUNT_BYTES = 16 * 1024 * 1024
THROUGHPUT_MINUTES = 60
PAGE_SIZE = 50


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
                    "options": f"-c statement_timeout={int(statement_timeout_ms)}",
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
                                  "expired": False, "registered": True,
                                  "seen_ago": (now - p["last_seen"]).total_seconds()}
        for w, n, queues, first, last, ids, kinds in self._rows(self.app.store.dashboard_workers(job_sample)):
            row = by_name.setdefault(w, {"worker": w, "role": "worker", "queues": queues, "registered": False,
                                         "concurrency": None, "seen_ago": None})
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

    def attempt_outcomes(self, seconds: float) -> dict[str, int]:
        return dict(self._rows(self.app.store.dashboard_attempt_outcomes(float(seconds))))

    # -- jobs ---------------------------------------------------------------

    def list_jobs(self, *, state=None, kind=None, queue=None, since=None, until=None, before_id=None,
                  limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        keys = ("id", "queue", "kind", "state", "priority", "attempts", "max_attempts", "run_after", "last_error",
                "created_at", "finished_at", "worker", "replay_of", "payload_preview", "wait_key", "parents_left",
                "batch_id")
        rows = self._rows(self.app.store.dashboard_list_jobs(state, kind, queue, since, until, before_id, limit))
        out = [dict(zip(keys, r)) for r in rows]
        for job in out:
            job["waits_on"] = waits_on(job["state"], job["wait_key"], job["parents_left"])
        return out

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

    # -- batches ------------------------------------------------------------

    def batches(self, *, before_id: int | None = None, limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        with self.connection() as conn:
            return self.app.list_batches(conn, before_id=before_id, limit=limit)

    def batch(self, batch_id: int, *, state: str | None = None, limit: int = 500) -> dict[str, Any] | None:
        with self.connection() as conn:
            found = self.app.batch_progress(batch_id, conn)
            if found is not None:
                found["jobs"] = self.app.batch_jobs(batch_id, conn, state=state, limit=limit)
        return found

    # -- outbox -------------------------------------------------------------

    def outbox_topics(self, sent_window: float = 3600.0) -> list[dict[str, Any]]:
        topics: dict[str, dict[str, Any]] = {}
        for topic, state, n, lag in self._rows(self.app.store.dashboard_outbox_topics(sent_window)):
            t = topics.setdefault(topic, {"topic": topic, "pending": 0, "failed": 0, "sent": 0, "lag": None})
            t[state] = n
            if lag is not None:
                t["lag"] = max(0.0, float(lag))
        return [topics[t] for t in sorted(topics)]

    def outbox_failed(self, *, before_id: int | None = None, topic: str | None = None,
                      limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        keys = ("id", "topic", "key", "idempotency_key", "attempts", "last_error", "created_at", "payload_preview")
        rows = self._rows(self.app.store.dashboard_outbox_failed(before_id, topic, limit))
        return [dict(zip(keys, r)) for r in rows]
