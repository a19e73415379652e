"""Property-based: random sequences of job operations never reach an illegal state or lose a job.

Each step runs joblane's own code against the real database: App.enqueue,
the named queries (claim_jobs, complete_jobs, extend_leases, rescue_expired,
cancel_jobs, retry_jobs, release_jobs, reject_jobs) and the worker's executor,
which turns what a task did into the outcome complete_jobs writes. The model
below only says which state each job should be in; after every step the
database must agree with it and hold the structural invariants.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import joblane
from joblane import store
from joblane.queries import quote_ident
from joblane.testing import isolated_schema
from joblane.types import Job
from joblane.store import outcome_rows
from joblane.worker.executor import execute, give_back, now

from .harness import TALLY

WORKERS = ("w1", "w2")
QUEUES = ("q1", "q2")
UNIQUE_KEYS = (None, "k1", "k2")
UNFINISHED = ("pending", "running", "held")
# what a task does on a try, and the state it leads to (transient errors depend on the budget)
BEHAVIOURS = ("succeed", "raise", "raise_later", "rate_limited", "permanent", "hold", "shutdown")


@dataclass
class Model:
    id: int
    queue: str
    unique_key: str | None
    state: str
    attempts: int = 0
    max_attempts: int = 3
    ready: bool = True  # pending and due now
    owner: str | None = None
    expired: bool = False
    rows: int = 0  # attempts rows this job should have


def make_app(dsn: str, schema: str) -> joblane.App:
    app = joblane.App(dsn, schema=schema)

    @app.task("succeed", queue="q1")
    async def succeed(job):
        return {"ok": job.attempt}

    @app.task("raise", queue="q1", backoff=0)
    async def raise_now(job):
        raise RuntimeError("transient")

    @app.task("raise_later", queue="q1", backoff=3600)
    async def raise_later(job):
        raise RuntimeError("transient, back off an hour")

    @app.task("rate_limited", queue="q1")
    async def rate_limited(job):
        raise joblane.RetryAfter(0)

    @app.task("permanent", queue="q1")
    async def permanent(job):
        raise joblane.PermanentError("no")

    @app.task("hold", queue="q1")
    async def hold(job):
        raise joblane.Hold("a person decides", {"score": 0.4})

    return app


class JobStateMachine(RuleBasedStateMachine):
    dsn: str
    schema: str

    def __init__(self):
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        s = quote_ident(self.schema)
        self.conn.execute(f"TRUNCATE {s}.jobs, {s}.attempts")
        self.app = make_app(self.dsn, self.schema)
        self.q = self.app.queries
        self.loop = asyncio.new_event_loop()
        self.jobs: dict[int, Model] = {}
        self.claimed: dict[int, Job] = {}  # running jobs as their worker sees them

    def teardown(self):
        self.loop.close()
        self.conn.close()

    def sql(self, name: str, args: list) -> list[tuple]:
        """The named query through its Store method, so a changed signature fails here too."""
        return store.fetch(self.conn, getattr(self.app.store, name)(*args))

    def ids(self, *states: str) -> list[int]:
        return sorted(i for i, m in self.jobs.items() if not states or m.state in states)

    def unfinished_key_holder(self, key: str | None) -> int | None:
        if key is None:
            return None
        return next((i for i, m in self.jobs.items() if m.unique_key == key and m.state in UNFINISHED), None)

    # -- operations --------------------------------------------------------

    @rule(queue=st.sampled_from(QUEUES), key=st.sampled_from(UNIQUE_KEYS), held=st.booleans(),
          delayed=st.booleans(), max_attempts=st.integers(1, 3))
    def enqueue(self, queue, key, held, delayed, max_attempts):
        holder = self.unfinished_key_holder(key)
        job_id = self.app.enqueue(self.conn, "succeed", {"n": len(self.jobs)}, queue=queue, unique_key=key,
                                  held=held, delay=3600 if delayed else None, max_attempts=max_attempts)
        if holder is not None:
            assert job_id == holder, "a duplicate unique_key returns the unfinished job"
            return
        assert job_id not in self.jobs
        self.jobs[job_id] = Model(job_id, queue, key, "held" if held else "pending", max_attempts=max_attempts,
                                  ready=not held and not delayed)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4), queues=st.sampled_from([["q1"], ["q2"], QUEUES]))
    def claim(self, worker, limit, queues):
        ready = [i for i in self.ids("pending") if self.jobs[i].ready and self.jobs[i].queue in queues]
        rows = self.sql("claim_jobs", [list(queues), limit, worker, 30.0])
        got = [r[0] for r in rows]
        assert len(got) == len(set(got)) == min(limit, len(ready)), (got, ready)
        assert set(got) <= set(ready), f"claimed jobs that were not ready: {set(got) - set(ready)}"
        for r in rows:
            m = self.jobs[r[0]]
            m.state, m.owner, m.expired = "running", worker, False
            m.attempts += 1
            assert r[4] == m.attempts and r[5] == m.max_attempts
            self.claimed[m.id] = Job(id=r[0], queue=r[1], kind=r[2], payload=json.loads(r[3]), attempt=r[4],
                                     max_attempts=r[5])

    @precondition(lambda self: self.claimed)
    @rule(data=st.data(), behaviour=st.sampled_from(BEHAVIOURS), stale=st.sampled_from([None, None, None,
                                                                                       "attempt", "worker"]))
    def finish(self, data, behaviour, stale):
        """A worker writes the outcome of a try it ran, through the executor and complete_jobs."""
        job = self.claimed[data.draw(st.sampled_from(sorted(self.claimed)))]
        m = self.jobs[job.id]
        if behaviour == "shutdown":
            outcome = give_back(job, now(), "worker shutting down")
        else:
            outcome = self.loop.run_until_complete(execute(self.app.tasks[behaviour], job, None))
        writer = m.owner if m.owner else "w1"
        if stale == "attempt":
            outcome = outcome._replace(attempt=outcome.attempt - 1)  # an outcome of an older try
        elif stale == "worker":
            writer = "someone-else"
        applied = [r[0] for r in self.sql("complete_jobs", [outcome_rows([outcome]), writer])]
        should = (m.state == "running" and m.owner == writer and m.attempts == outcome.attempt)
        assert applied == ([job.id] if should else []), (behaviour, stale, m, outcome)
        if stale is None:
            del self.claimed[job.id]  # the worker is done with it, applied or not
        if not should:
            return
        expected_state = {
            "succeed": "done", "permanent": "failed", "hold": "held", "rate_limited": "pending",
            "shutdown": "pending",
            "raise": "failed" if m.attempts >= m.max_attempts else "pending",
            "raise_later": "failed" if m.attempts >= m.max_attempts else "pending",
        }[behaviour]
        assert outcome.state == expected_state, (behaviour, outcome)
        m.state, m.owner = outcome.state, None
        m.attempts -= outcome.refund
        m.ready = m.state == "pending" and behaviour != "raise_later"
        m.rows += 1

    @precondition(lambda self: any(m.state == "running" for m in self.jobs.values()))
    @rule(data=st.data())
    def lease_runs_out(self, data):
        """Time passes for one running job without a heartbeat (its worker hangs or died)."""
        job_id = data.draw(st.sampled_from(self.ids("running")))
        self.conn.execute(f"UPDATE {quote_ident(self.schema)}.jobs SET lease_until = now() - interval '1 second'"
                          " WHERE id = %s", (job_id,))
        self.jobs[job_id].expired = True

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def heartbeat(self, worker, data):
        asked = data.draw(st.lists(st.sampled_from(self.ids() or [0]), max_size=4, unique=True))
        owned = {r[0] for r in self.sql("extend_leases", [asked, worker, 30.0])}
        assert owned == {i for i in asked if i in self.jobs and self.jobs[i].state == "running"
                         and self.jobs[i].owner == worker}
        for i in owned:
            self.jobs[i].expired = False

    @rule()
    def rescue(self):
        rescued = dict(self.sql("rescue_expired", [100]))
        expected = {i for i, m in self.jobs.items() if m.state == "running" and m.expired}
        assert set(rescued) == expected
        for i, state in rescued.items():
            m = self.jobs[i]
            assert state == ("failed" if m.attempts >= m.max_attempts else "pending")
            m.state, m.owner, m.ready, m.expired = state, None, True, False
            m.rows += 1

    @rule(data=st.data())
    def cancel(self, data):
        # mostly unfinished jobs, sometimes any (a finished one must be left alone)
        pool = self.ids(*UNFINISHED) if data.draw(st.booleans()) else self.ids()
        asked = data.draw(st.lists(st.sampled_from(pool or [0]), max_size=3, unique=True))
        done = {r[0] for r in self.sql("cancel_jobs", [asked, "not needed", "tester"])}
        assert done == {i for i in asked if i in self.jobs and self.jobs[i].state in UNFINISHED}
        for i in done:
            m = self.jobs[i]
            m.state, m.owner = "cancelled", None
            m.rows += 1

    @rule(data=st.data())
    def retry(self, data):
        pool = self.ids("failed", "cancelled") if data.draw(st.booleans()) else self.ids()
        asked = data.draw(st.lists(st.sampled_from(pool or [0]), max_size=3, unique=True))
        done = {r[0] for r in self.sql("retry_jobs", [asked, None, None, ["failed"]])}
        candidates = [i for i in asked if i in self.jobs and self.jobs[i].state in ("failed", "cancelled")]
        allowed, keys = set(), set()
        for i in sorted(candidates, reverse=True):  # one per unique_key, the newest
            key = self.jobs[i].unique_key
            if key is not None and (self.unfinished_key_holder(key) is not None or key in keys):
                continue
            allowed.add(i)
            if key is not None:
                keys.add(key)
        assert done == allowed, (asked, done, allowed)
        for i in done:
            m = self.jobs[i]
            m.state, m.ready = "pending", True
            m.max_attempts = max(m.max_attempts, m.attempts + 1)

    @precondition(lambda self: hasattr(self.q, "release_jobs"))
    @rule(data=st.data(), release=st.booleans())
    def decide_held(self, data, release):
        """A person releases (back to pending) or rejects (cancelled) a held job; others are left alone."""
        job_id = data.draw(st.sampled_from(self.ids("held") or self.ids() or [0]))
        m = self.jobs.get(job_id)
        if release:
            rows = self.sql("release_jobs", [[job_id], None, None, None, None, "{}", "tester", None, False,
                                             self.app.channel])
        else:
            rows = self.sql("reject_jobs", [[job_id], None, None, None, None, "rejected", "tester"])
        applies = m is not None and m.state == "held"
        assert [r[0] for r in rows] == ([job_id] if applies else [])
        if applies:
            m.state = "pending" if release else "cancelled"
            m.ready = release
            if release:
                m.max_attempts = max(m.max_attempts, m.attempts + 1)
            m.rows += 1

    # -- what must always hold --------------------------------------------------

    @invariant()
    def database_agrees_with_the_model(self):
        s = quote_ident(self.schema)
        rows = self.conn.execute(
            f"SELECT id, state, attempts, max_attempts, worker, lease_until IS NOT NULL, finished_at IS NOT NULL,"
            f" state = 'pending' AND run_after <= now(), unique_key FROM {s}.jobs").fetchall()
        assert {r[0] for r in rows} == set(self.jobs), "a job was lost or appeared from nowhere"
        audit = dict(self.conn.execute(f"SELECT job_id, count(*) FROM {s}.attempts GROUP BY job_id").fetchall())
        held_keys: dict[str, int] = {}
        for job_id, state, attempts, max_attempts, worker, leased, finished, due, key in rows:
            m = self.jobs[job_id]
            assert state in joblane.types.JOB_STATES
            assert (state, attempts, max_attempts, worker) == (m.state, m.attempts, m.max_attempts, m.owner), (
                job_id, (state, attempts, max_attempts, worker), m)
            assert leased == (state == "running") == (worker is not None), "a lease belongs to running jobs only"
            assert finished == (state in ("done", "failed", "cancelled")), "finished_at marks the final states"
            assert state != "pending" or attempts < max_attempts, "a pending job always has a try left"
            assert attempts >= 0
            if state == "pending":
                assert due == m.ready, (job_id, due, m)
            assert audit.get(job_id, 0) == m.rows, "one attempts row per try and per decision"
            if key is not None and state in UNFINISHED:
                assert key not in held_keys, f"two unfinished jobs hold {key!r}"
                held_keys[key] = job_id
        TALLY.invariants += 6 * len(rows) + 1


@pytest.fixture(scope="module")
def machine_schema(joblane_dsn):
    with isolated_schema(joblane_dsn) as schema:
        yield schema


def test_random_operation_sequences_keep_every_job_legal(joblane_dsn, machine_schema):
    JobStateMachine.dsn = joblane_dsn
    JobStateMachine.schema = machine_schema
    run_state_machine_as_test(JobStateMachine, settings=settings(
        max_examples=40, stateful_step_count=30, deadline=None, derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
