"""Three worker processes on one model queue with a start rate, concurrency, per-key fairness and a per-tenant
daily cap, one of them SIGKILLed mid-run: checked against the record the tasks keep outside the database."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict

from joblane import JobSpec

from ..conftest import wait_until
from ..review.helpers import run_cli
from ..review.test_limits import _most_in_window, _most_overlapping
from .helpers import rows

APP = "tests.ai.app:app"
CAP, ESTIMATE = 0.3, 0.1  # tests/ai/app.py: openai-daily, and each job's estimated_cost
PER_MINUTE, CONCURRENCY, PER_KEY = 12, 4, 2
COSTS = {"a": 0.1, "b": 0.1, "c": 0.12}  # tenant c's calls cost a fifth more than estimated


def test_three_workers_keep_every_window_and_cap_through_a_sigkill_and_finish_every_job_once_the_cap_rises(
        app, conn, spawn_worker, tmp_path):
    runs = tmp_path / "runs.log"
    args = ("--concurrency", "3", "--lease", "2", "--poll-interval", "0.2")
    env = {"AI_RUNS": str(runs)}
    ids = app.enqueue_many(conn, [JobSpec("chat", {"tenant": t, "estimated_cost": ESTIMATE, "real_cost": cost},
                                          queue="openai")
                                  for _ in range(5) for t, cost in COSTS.items()])
    workers = [spawn_worker(APP, app.schema, *args, env=env) for _ in range(3)]

    # SIGKILL a worker while it runs a job; a fresh one takes its place
    def a_run() -> list[dict]:
        return [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []

    first = wait_until(a_run, timeout=60, message="a task started")[0]  # its call takes a second
    victim = next(w for w in workers if w.proc.pid == first["pid"])
    victim.kill()
    killed_at = time.time()
    workers = [w for w in workers if w is not victim] + [spawn_worker(APP, app.schema, *args, env=env)]

    # every tenant reaches its cap: nothing runs, and the rest wait with the cap as their reason
    def all_at_cap() -> bool:
        capped = {b["key"] for b in app.budget_status() if b["at_cap"]}
        running = rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'running'")[0]["n"]
        return capped == set(COSTS) and running == 0

    wait_until(all_at_cap, timeout=60, message="every tenant at its cap, nothing running")
    time.sleep(1.0)  # three workers polling: none starts another job
    assert rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'running'")[0]["n"] == 0
    waiting = [i for i in ids if app.get_job(i)["state"] == "pending"]
    assert len(waiting) >= 15 - 3 * 3
    for job_id in waiting:
        assert "budget" in {w["kind"] for w in app.get_job(job_id)["waiting_on"]}, app.get_job(job_id)

    raised_at = time.time()
    result = run_cli(app, "budgets", "set", "openai-daily", "--cap", "10")
    assert result.exit_code == 0, result.output
    wait_until(lambda: rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state = 'done'")[0]["n"] == 15,
               timeout=150, message="every job done after the cap was raised")
    for w in workers:
        w.stop()
        assert w.wait(30) == 0, w.output()[-3000:]

    events = [json.loads(line) for line in runs.read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    ends = {(e["job"], e["attempt"], e["pid"]): e for e in events if e["event"] == "end"}

    # exactly once: one done try per job in the database, one finished run per job outside it
    # (a run of the killed worker may have ended without its outcome written: its job ran again)
    assert rows(conn, app, "SELECT count(*) AS n FROM {jobs} WHERE state <> 'done'") == [{"n": 0}]
    done = Counter(r["job_id"] for r in rows(conn, app, "SELECT job_id FROM {attempts} WHERE outcome = 'done'"))
    assert sorted(done) == sorted(ids) and set(done.values()) == {1}
    finished = Counter(job for (job, _, p) in ends if p != victim.proc.pid)
    assert sorted(finished) == sorted(ids) and set(finished.values()) == {1}, finished
    cut = [s for s in starts if (s["job"], s["attempt"], s["pid"]) not in ends]
    assert cut and {s["pid"] for s in cut} == {victim.proc.pid}  # only the killed worker's runs were cut short
    outcomes = {(r["job_id"], r["attempt"]): r["outcome"]
                for r in rows(conn, app, "SELECT job_id, attempt, outcome FROM {attempts}")}
    assert all(outcomes.get((s["job"], s["attempt"])) == "lost" for s in cut)  # each cut run is a lost try
    assert {(s["job"], s["attempt"]) for s in starts} <= set(outcomes)  # every run has its try

    # the start rate: no window of a minute holds more than 12 starts (a second off the window for the time
    # between the claim, counted in the database, and the task's own start, on a busy machine); there were
    # more starts than one minute allows, so the rate did hold some back
    times = [s["t"] for s in starts]
    assert len(times) > PER_MINUTE
    assert _most_in_window(times, 59.0) <= PER_MINUTE, sorted(t - min(times) for t in times)
    assert max(times) - min(times) >= 59.0

    # concurrency and per-key fairness: a run spans its start to its end (or the kill)
    def span(s: dict) -> tuple[float, float]:
        end = ends.get((s["job"], s["attempt"], s["pid"]))
        return s["t"], end["t"] if end else killed_at

    assert _most_overlapping([span(s) for s in starts]) <= CONCURRENCY
    for tenant in COSTS:
        assert _most_overlapping([span(s) for s in starts if s["tenant"] == tenant]) <= PER_KEY

    # the cap: before it was raised, a tenant's tries reserved at most the cap plus one estimate (a job
    # starts while spend and the estimates in flight are below the cap), and spent that plus what its
    # tries cost beyond their estimates; a cut try counts its estimate
    before = defaultdict(list)
    for s in starts:
        if s["t"] < raised_at:
            end = ends.get((s["job"], s["attempt"], s["pid"]))
            before[s["tenant"]].append(end["cost"] if end else ESTIMATE)
    for tenant, cost in COSTS.items():
        tries = before[tenant]
        assert len(tries) * ESTIMATE < CAP + ESTIMATE + 1e-9, (tenant, tries)
        assert sum(tries) <= CAP + ESTIMATE + len(tries) * (cost - ESTIMATE) + 1e-9, (tenant, tries)

    # the ledger agrees with the tries: every try counted once, at what it recorded, a lost one at its
    # estimate (the holds of the last tries are folded by
    # the next claim; fold them here)
    from joblane import store

    store.fetch(conn, app.store.fold_budget_holds("openai"))
    assert rows(conn, app, "SELECT count(*) AS n FROM {budget_holds}") == [{"n": 0}]
    ledger = {r["key"]: r for r in rows(conn, app, "SELECT key, sum(spent) AS spent, sum(tries) AS tries"
                                                   " FROM {budget_usage} GROUP BY key")}
    tries = rows(conn, app, "SELECT j.payload->>'tenant' AS tenant, count(*) AS n,"
                            " sum(coalesce((a.meta->>'cost')::float8, %s)) AS cost"
                            " FROM {attempts} a JOIN {jobs} j ON j.id = a.job_id GROUP BY 1", (ESTIMATE,))
    for t in tries:
        assert ledger[t["tenant"]]["tries"] == t["n"]
        assert abs(ledger[t["tenant"]]["spent"] - t["cost"]) < 1e-9, (t, ledger[t["tenant"]])
