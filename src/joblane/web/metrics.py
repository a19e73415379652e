"""``/metrics``: the dashboard's numbers in Prometheus' text format, read from the database at each scrape."""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .data import Data

ATTEMPT_WINDOW_SECONDS = 60.0
INDEXED_STATES = ("pending", "running", "held", "failed")


class JoblaneCollector(Collector):
    """Gauges over the same index-backed queries as the overview, so a scrape stays cheap on big tables."""

    def __init__(self, data: Data):
        self.data = data

    def collect(self) -> Iterator[Metric]:
        counts = self.data.queue_counts()
        jobs = GaugeMetricFamily("joblane_jobs", "Jobs per queue and state (pending, running, held, failed; exact).",
                                 labels=["queue", "state"])
        oldest = GaugeMetricFamily("joblane_oldest_ready_seconds",
                                   "Age of the oldest job ready to run, per queue.", labels=["queue"])
        for q in counts["queues"]:
            for state in INDEXED_STATES:
                jobs.add_metric([q["queue"], state], q[state])
            oldest.add_metric([q["queue"]], q["oldest_ready"] or 0.0)
        depth = GaugeMetricFamily("joblane_queue_depth", "Pending jobs per queue (ready now or scheduled).",
                                  labels=["queue"])
        for q in counts["queues"]:
            depth.add_metric([q["queue"]], q["pending"])
        yield jobs
        yield oldest
        yield depth
        failed_recent = GaugeMetricFamily("joblane_jobs_failed_last_hour",
                                          "Jobs that failed for good in the last hour, per queue.", labels=["queue"])
        for queue, n in self.data.failed_recent(3600.0).items():
            failed_recent.add_metric([queue], n)
        yield failed_recent
        finished = GaugeMetricFamily(
            "joblane_jobs_finished", "Done and cancelled jobs kept in the table (the planner's estimate on big tables).",
            labels=["state", "exact"])
        for state in ("done", "cancelled"):
            finished.add_metric([state, "true" if counts["exact"] else "false"], counts["totals"][state])
        yield finished

        attempts = GaugeMetricFamily(
            "joblane_attempts_last_minute", "Attempts that finished in the last 60 seconds, by outcome.",
            labels=["outcome"])
        for outcome, n in sorted(self.data.attempt_outcomes(ATTEMPT_WINDOW_SECONDS).items()):
            attempts.add_metric([outcome], n)
        yield attempts

        workers = self.data.workers(job_sample=1)
        alive = GaugeMetricFamily("joblane_processes_alive",
                                  "Workers and relays registered and heartbeating (dead ones drop off after a lease).",
                                  labels=["role"])
        for role in ("worker", "relay"):
            alive.add_metric([role], sum(1 for w in workers if w["registered"] and w["role"] == role))
        yield alive
        live = GaugeMetricFamily("joblane_workers_with_leases", "Workers holding at least one running job.")
        live.add_metric([], sum(1 for w in workers if not w["expired"]))
        yield live
        expired = GaugeMetricFamily("joblane_expired_leases_workers",
                                    "Workers whose oldest lease has expired (lost; the rescuer will take their jobs back).")
        expired.add_metric([], sum(1 for w in workers if w["expired"]))
        yield expired

        spend = GaugeMetricFamily("joblane_budget_spend",
                                  "Spend per budget and key in the current window (settled plus estimates in flight).",
                                  labels=["budget", "key"])
        cap = GaugeMetricFamily("joblane_budget_cap", "The cap of each budget per window.", labels=["budget"])
        waiting = GaugeMetricFamily("joblane_budget_waiting_jobs",
                                    "Pending jobs held back because their key has reached its budget's cap.",
                                    labels=["budget", "key"])
        operator = GaugeMetricFamily(
            "joblane_budget_cap_set_by_operator",
            "1 when an operator set the budget's cap (joblane budgets set), standing over the one declared in code"
            " until `joblane budgets reset`; 0 when the cap in force is the declared one.", labels=["budget"])
        capped: set[str] = set()
        for b in self.data.budgets():
            if b["budget"] not in capped:
                capped.add(b["budget"])
                cap.add_metric([b["budget"]], b["cap"])
                operator.add_metric([b["budget"]], 1.0 if b["cap_source"] == "operator" else 0.0)
            if b["key"] is not None:
                spend.add_metric([b["budget"], b["key"]], b["spent"] + b["in_flight"])
                waiting.add_metric([b["budget"], b["key"]], b["waiting"])
        yield spend
        yield cap
        yield operator
        yield waiting

        paused = GaugeMetricFamily(
            "joblane_queue_paused_seconds",
            "Seconds a paused queue stays paused (RetryAfter(pause_queue=True), `joblane limits pause`), with why.",
            labels=["queue", "reason"])
        limit = GaugeMetricFamily("joblane_queue_limit", "Each limit of a limited queue: starts per window"
                                  " (rate), running jobs (concurrency), weighted cost per window (tokens).",
                                  labels=["queue", "limit"])
        used = GaugeMetricFamily("joblane_queue_limit_used", "What a limited queue uses of each limit now.",
                                 labels=["queue", "limit"])
        now = time.time()
        for q in self.data.limits():
            if q["paused_until"] is not None:
                paused.add_metric([q["queue"], q["pause_reason"] or ""],
                                  max(0.0, q["paused_until"].timestamp() - now))
            for name, most, current in (("rate", q["max_starts"], q["starts"]),
                                        ("concurrency", q["concurrency"], q["running"]),
                                        ("tokens", q["max_cost"], q["cost"])):
                if most is not None:
                    limit.add_metric([q["queue"], name], most)
                    used.add_metric([q["queue"], name], current or 0)
        yield paused
        yield limit
        yield used

        messages = GaugeMetricFamily("joblane_outbox_messages",
                                     "Outbox rows per topic: pending and failed (exact), sent in the last hour.",
                                     labels=["topic", "state"])
        lag = GaugeMetricFamily("joblane_outbox_lag_seconds",
                                "Age of the oldest unsent (pending or failed) outbox row, per topic.", labels=["topic"])
        unsent = GaugeMetricFamily("joblane_outbox_unsent", "Outbox rows not sent yet (pending and failed), per topic.",
                                   labels=["topic"])
        retrying = GaugeMetricFamily("joblane_outbox_retrying",
                                     "Pending outbox rows whose last try failed, per topic.", labels=["topic"])
        for t in self.data.outbox_topics():
            for state in ("pending", "failed", "sent"):
                messages.add_metric([t["topic"], state], t[state])
            lag.add_metric([t["topic"]], t["lag"] or 0.0)
            unsent.add_metric([t["topic"]], t["pending"] + t["failed"])
            retrying.add_metric([t["topic"]], t["retrying"])
        yield messages
        yield lag
        yield unsent
        yield retrying

        health = self.data.health()
        size = GaugeMetricFamily("joblane_table_bytes", "Size on disk of each joblane table (indexes included).",
                                 labels=["table"])
        dead = GaugeMetricFamily("joblane_table_dead_rows", "Dead row versions of each joblane table, for vacuum.",
                                 labels=["table"])
        vacuumed = GaugeMetricFamily("joblane_table_last_vacuum_age_seconds",
                                     "Seconds since (auto)vacuum last finished on each joblane table.", labels=["table"])
        for t in health["tables"]:
            size.add_metric([t["table"]], t["bytes"])
            dead.add_metric([t["table"]], t["dead"])
            if t["last_vacuum"] is not None:
                vacuumed.add_metric([t["table"]], max(0.0, time.time() - t["last_vacuum"].timestamp()))
        yield size
        yield dead
        yield vacuumed
        yield GaugeMetricFamily("joblane_oldest_transaction_seconds",
                                "Age of the database's oldest open transaction (it holds back every vacuum).",
                                value=health["oldest_transaction_seconds"] or 0.0)
        ai = GaugeMetricFamily(
            "joblane_ai_rows", "Rows of step_cache and budget_usage: live, and due for the worker's pruner (expired"
            " results, claims that ran out an hour ago, budget windows that ended longer ago than the longest window).", labels=["table", "state"])
        ai.add_metric(["step_cache", "live"], health["ai"]["cache_results"] - health["ai"]["cache_expired"])
        ai.add_metric(["step_cache", "due"], health["ai"]["cache_expired"] + health["ai"]["cache_lost_claims"])
        ai.add_metric(["budget_usage", "live"], health["ai"]["budget_windows"] - health["ai"]["budget_windows_due"])
        ai.add_metric(["budget_usage", "due"], health["ai"]["budget_windows_due"])
        yield ai
        yield GaugeMetricFamily("joblane_health_warnings",
                                "Warnings of `joblane status --health` (autovacuum off or behind, old transactions).",
                                value=len(health["warnings"]))


def registry_for(data: Data) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JoblaneCollector(data))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
