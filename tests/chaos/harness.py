"""Real worker processes under faults, and the invariants checked after each fault.

The invariants read only joblane's tables (jobs, attempts) and the runs log
the chaos app writes, so they hold for any way the faults interleave:

* no job is lost: every committed job is in jobs; nothing else is;
* no rolled-back job ever ran, and no run belongs to an unknown job;
* every job ends as its task dictates (chaos_app.EXPECTED), none pending past
  its time, none running once the workers are gone;
* every try is accounted for: jobs.attempts equals the attempts rows that
  spent a try (all but 'snoozed'), and each run of a try has its row;
* a job ran more than once only if an attempt shows why: lost (its worker
  died), a timeout or error (retry), or given back at shutdown (snoozed);
* at most one 'done' attempt per job.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from joblane.queries import quote_ident

from .chaos_app import EXPECTED

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.chaos.chaos_app:app"
RELAY_APP = "tests.chaos.relay_app:app"
# the claim's ring turns every second, so its slots are emptied (TRUNCATE) many times under the faults
WORKER_ARGS = ["--concurrency", "10", "--lease", "2", "--poll-interval", "0.2", "--grace", "3", "--ring-turn", "1"]
RELAY_ARGS = ["--batch-size", "100", "--concurrency", "2", "--lease", "2", "--poll-interval", "0.2", "--grace", "3"]


@dataclass
class Tally:
    """What the whole chaos folder did; printed as one line at the end of the session."""

    faults: Counter = field(default_factory=Counter)
    invariants: int = 0
    violations: list[str] = field(default_factory=list)
    jobs: int = 0
    messages: int = 0

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
        return (f"chaos: {self.jobs:,} jobs, {self.messages:,} outbox rows, faults injected {sum(self.faults.values())}"
                f"{f' ({kinds})' if kinds else ''}, "
                f"invariants checked {self.invariants:,}, violations {len(self.violations)}")


TALLY = Tally()


class Proc:
    """One `joblane worker` or `joblane relay` process; its output goes to a file (a pipe could fill and stall it)."""

    def __init__(self, command: str, schema: str, dsn: str, runs: Path, logs: Path, args: list[str],
                 env: dict | None = None):
        self.command = command
        self.log_path = logs / f"{command}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")
        full_env = {**os.environ, "DATABASE_URL": dsn, "JOBLANE_SCHEMA": schema, "CHAOS_RUNS": str(runs),
                    "PYTHONPATH": str(ROOT), **(env or {})}
        spec = APP if command == "worker" else RELAY_APP
        self.proc = subprocess.Popen([sys.executable, "-m", "joblane", command, spec, "--log-format", "json", *args],
                                     env=full_env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        # what its connections are called in pg_stat_activity
        self.application_name = f"joblane {command} {self.pid}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def close(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


class Fleet:
    """A set of worker (or relay) processes the test can kill, terminate and restart."""

    def __init__(self, schema: str, dsn: str, runs: Path, logs: Path, args: list[str], env: dict | None = None,
                 command: str = "worker"):
        self.schema, self.dsn, self.runs, self.logs, self.args, self.env = schema, dsn, runs, logs, args, env
        self.command = command
        self.workers: list[Proc] = []
        self.retired: list[Proc] = []

    def start(self, n: int = 1) -> list[Proc]:
        new = [Proc(self.command, self.schema, self.dsn, self.runs, self.logs, self.args, self.env) for _ in range(n)]
        self.workers.extend(new)
        return new

    def wait_ready(self, conn, timeout: float = 60) -> None:
        """Wait until every live worker has connected (it handles signals from then on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = {r[0] for r in conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'joblane %%'")}
            if all(w.application_name in names for w in self.workers if w.alive):
                return
            time.sleep(0.05)
        raise AssertionError("workers did not connect: " + " | ".join(w.output()[-500:] for w in self.workers))

    def pick(self) -> Proc:
        return random.choice([w for w in self.workers if w.alive])

    def sigkill(self, victim: Proc | None = None, *, restart: bool = True) -> Proc:
        victim = victim or self.pick()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        self._retire(victim)
        if restart:
            self.start()
        TALLY.faults[f"sigkill_{self.command}"] += 1
        return victim

    def sigterm(self, conn, victim: Proc | None = None, *, restart: bool = True, timeout: float = 30) -> int:
        """The graceful path mid-flow: SIGTERM one process, wait for it, start another; its exit code."""
        self.wait_ready(conn)
        victim = victim or self.pick()
        victim.proc.send_signal(signal.SIGTERM)
        try:
            code = victim.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = -999
        self._retire(victim)
        if restart:
            self.start()
        TALLY.faults[f"sigterm_{self.command}"] += 1
        return code

    def replace_dead(self) -> int:
        """Restart workers that exited on their own (a task called os._exit)."""
        dead = [w for w in self.workers if not w.alive]
        for w in dead:
            self._retire(w)
        self.start(len(dead))
        return len(dead)

    def terminate_connections(self, conn, victim: Proc | None = None) -> int:
        """pg_terminate_backend on every connection of one process (pool, listener), mid-batch."""
        victim = victim or self.pick()
        n = len(conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                             (victim.application_name,)).fetchall())
        TALLY.faults[f"pg_terminate_backend_{self.command}"] += 1
        return n

    def sigterm_all(self, conn=None, timeout: float = 60) -> list[int]:
        """SIGTERM every worker (after each has connected, when given a connection); their exit codes."""
        if conn is not None:
            self.wait_ready(conn)  # a worker still importing has no handler yet and would just die
        alive = [w for w in self.workers if w.alive]
        for w in alive:
            w.proc.send_signal(signal.SIGTERM)
        codes = []
        for w in alive:
            try:
                codes.append(w.proc.wait(timeout))
            except subprocess.TimeoutExpired:
                codes.append(-999)
        for w in list(self.workers):
            self._retire(w)
        return codes

    def _retire(self, w: Proc) -> None:
        if w in self.workers:
            self.workers.remove(w)
            self.retired.append(w)

    def close(self) -> None:
        for w in self.workers + self.retired:
            w.close()


def read_runs(path: Path) -> list[tuple[int, int, int, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:  # a torn last line of a killed process cannot happen with one write(2), but be strict
            out.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
    return out


def check_spans(runs_path: Path, *, label: str, killed: bool = False) -> list[str]:
    """No two tries of one job at once, from the start and end lines of the SPANNED kinds.

    Each try must have ended (an end line) before the next try of its job began. ``killed``: a worker
    was SIGKILLed during the run, so a try may have no end line (its thread died with the process,
    its child with it): such a try is only checked to be the job's last but one or last.
    """
    path = runs_path.with_name(runs_path.name + ".spans")
    tries: dict[int, list[list]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            what, job, pid, at = line.split()
            spans = tries.setdefault(int(job), [])
            if what == "start":
                spans.append([int(pid), float(at), None])
            else:
                open_ = [s for s in spans if s[0] == int(pid) and s[2] is None]
                if open_:
                    open_[-1][2] = float(at)
    bad = []
    checked = 0
    for job, spans in tries.items():
        spans.sort(key=lambda s: s[1])
        for before, after in zip(spans, spans[1:]):
            checked += 1
            if before[2] is None:
                if not killed:
                    bad.append(f"[{label}] job {job}: a try by pid {before[0]} never ended, yet another began")
            elif after[1] < before[2]:
                bad.append(f"[{label}] job {job} ran twice at once: pid {before[0]} until {before[2]:.3f}, "
                           f"pid {after[0]} from {after[1]:.3f}")
        if not killed:
            checked += 1
            if spans and spans[-1][2] is None:
                bad.append(f"[{label}] job {job}: its last try by pid {spans[-1][0]} never ended")
    TALLY.invariants += checked
    TALLY.violations.extend(bad)
    return bad


@dataclass
class Ledger:
    """What the test knows it committed and rolled back: jobs, and outbox rows with their payloads."""

    committed: dict[int, str] = field(default_factory=dict)  # job id -> kind
    rolled_back: set[int] = field(default_factory=set)
    messages: dict[int, dict] = field(default_factory=dict)  # outbox id -> payload
    rolled_back_messages: set[int] = field(default_factory=set)


def snapshot(conn, schema: str):
    s = quote_ident(schema)
    jobs = {r[0]: r[1:] for r in conn.execute(
        f"SELECT id, kind, state, attempts, max_attempts, run_after <= now(), lease_until, worker, last_error"
        f" FROM {s}.jobs").fetchall()}
    attempts = defaultdict(list)
    for job_id, attempt, outcome, error in conn.execute(
            f"SELECT job_id, attempt, outcome, coalesce(error, '') FROM {s}.attempts ORDER BY id").fetchall():
        attempts[job_id].append((attempt, outcome, error))
    return jobs, attempts


def check(conn, schema: str, ledger: Ledger, runs_path: Path, *, final: bool, label: str) -> list[str]:
    """Check the invariants; record them in TALLY; return the violations (empty when all hold)."""
    # runs first: every run read happened before the snapshot, so the snapshot accounts for it
    runs = read_runs(runs_path)
    jobs, attempts = snapshot(conn, schema)
    bad: list[str] = []
    checked = 0

    def expect(ok: bool, message: str) -> None:
        nonlocal checked
        checked += 1
        if not ok:
            bad.append(f"[{label}] {message}")

    # no job lost, and no job the test did not commit
    missing = set(ledger.committed) - set(jobs)
    expect(not missing, f"{len(missing)} committed jobs are missing, e.g. {sorted(missing)[:5]}")
    if final:
        extra = set(jobs) - set(ledger.committed)
        expect(not extra, f"{len(extra)} jobs nobody committed, e.g. {sorted(extra)[:5]}")
    # rolled back: never stored, never ran; every run belongs to a committed job
    ran_ids = {r[0] for r in runs}
    expect(not (ledger.rolled_back & set(jobs)), "a rolled-back job is in the table")
    expect(not (ledger.rolled_back & ran_ids), f"rolled-back jobs ran: {sorted(ledger.rolled_back & ran_ids)[:5]}")
    phantom = ran_ids - set(jobs)
    expect(not phantom, f"runs of jobs that do not exist: {sorted(phantom)[:5]}")

    runs_per_try: Counter = Counter((r[0], r[1]) for r in runs)
    runs_per_job: Counter = Counter(r[0] for r in runs)
    for job_id, (kind, state, n_attempts, max_attempts, due, lease, worker, last_error) in jobs.items():
        rows = attempts.get(job_id, [])
        outcomes = Counter(o for _, o, _ in rows)
        expect(outcomes["done"] <= 1, f"job {job_id} completed {outcomes['done']} times")
        expect(state != "running" or (lease is not None and worker is not None),
               f"job {job_id} is running without a lease")
        if not final:
            continue
        # ends as its task dictates; a budget spent by crashes alone may fail it, and the rows must say so
        wanted = EXPECTED.get(kind)
        spent_by_crashes = state == "failed" and rows and rows[-1][1] == "lost" and n_attempts >= max_attempts
        expect(state == wanted or spent_by_crashes,
               f"job {job_id} ({kind}) ended {state}, its task dictates {wanted}; attempts {rows}")
        expect(not (state == "pending" and due), f"job {job_id} ({kind}) is pending past its time")
        expect(state != "running", f"job {job_id} ({kind}) is still running after the workers stopped")
        # every try accounted for: each claim ends in exactly one of these rows ('snoozed' is refunded)
        spent = sum(1 for _, o, _ in rows if o in ("done", "retry", "failed", "held", "lost"))
        expect(spent == n_attempts, f"job {job_id} ({kind}): attempts={n_attempts} but {spent} rows spent a try: "
                                    f"{rows}")
        per_try_rows = Counter(a for a, _, _ in rows)
        for (j, a), n in ((k, v) for k, v in runs_per_try.items() if k[0] == job_id):
            expect(n <= per_try_rows[a], f"job {job_id} try {a} ran {n} times but has {per_try_rows[a]} rows")
        # a repeat only after a lost attempt, a timeout/error, or a give-back
        explained = sum(1 for _, o, _ in rows if o in ("lost", "retry", "snoozed"))
        expect(runs_per_job[job_id] <= 1 + explained,
               f"job {job_id} ({kind}) ran {runs_per_job[job_id]} times with {explained} lost/retry/given-back rows")
        if kind in ("ok", "slow", "exit", "plain", "child"):  # tasks that never raise: only a crash or a shutdown explains a repeat
            odd = [r for r in rows if r[1] not in ("done", "lost", "snoozed")]
            expect(not odd, f"job {job_id} ({kind}) has attempts its task cannot produce: {odd}")
        if kind in ("hang", "plain_hang") and state == "failed" and not spent_by_crashes:
            expect("timed out" in (last_error or ""), f"job {job_id} ({kind}) failed without a timeout: {last_error}")
        if kind == "exit" and state == "done":
            expect(any(o == "lost" for _, o, _ in rows), f"job {job_id} (exit) shows no lost attempt: {rows}")
    TALLY.invariants += checked
    TALLY.violations.extend(bad)
    return bad


def wait_quiet(conn, schema: str, fleet: Fleet | None = None, timeout: float = 90) -> bool:
    """Wait until no job is pending or running (restarting workers that died on their own).

    The chaos jobs back off for well under a second, so every pending job
    is due soon: waiting for none at all lets each reach its final state.
    """
    s = quote_ident(schema)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet is not None:
            fleet.replace_dead()
        left = conn.execute(f"SELECT count(*) FROM {s}.jobs WHERE state IN ('pending', 'running')").fetchone()[0]
        if left == 0:
            return True
        time.sleep(0.2)
    return False


_SEQ = [0]


def enqueue(app, dsn: str, ledger: Ledger, kinds: list[tuple[str, dict]], *, messages: int = 0,
            rollback: bool = False) -> list[int]:
    """Enqueue jobs and publish outbox rows in one transaction; record them as committed or rolled back."""
    with psycopg.connect(dsn) as c:
        ids = app.enqueue_many(c, [(k, p) for k, p in kinds]) if kinds else []
        made = {}
        for _ in range(messages):
            _SEQ[0] += 1
            payload = {"lead": _SEQ[0], "name": f"lead {_SEQ[0]}"}
            made[app.publish(c, "chaos.lead_created", payload)] = payload
        if rollback:
            c.rollback()
            ledger.rolled_back.update(ids)
            ledger.rolled_back_messages.update(made)
        else:
            c.commit()
            ledger.committed.update(zip(ids, (k for k, _ in kinds)))
            ledger.messages.update(made)
    return ids


class Destination:
    """What the relays' AppendSink (relay_app.py) wrote: (idempotency key, body) per accepted message."""

    def __init__(self, path: Path):
        self.path = path

    def received(self) -> list[tuple[str, bytes]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                key, _topic, body = json.loads(line)
            except ValueError:  # cannot happen with one write(2) per batch, but stay strict about what counts
                continue
            out.append((key, body.encode()))
        return out


def check_outbox(conn, schema: str, ledger: Ledger, destination: Destination, *, final: bool,
                 label: str) -> list[str]:
    """The outbox invariants: every committed row delivered at least once, with its payload, and marked
    sent; no rolled-back row ever arrives; a row arrives more than once only if its attempts show a re-send."""
    s = quote_ident(schema)
    # arrivals first: each was claimed (attempts + 1) before it was sent, so the snapshot after counts it
    arrivals = destination.received()
    rows = {r[0]: r[1:] for r in conn.execute(
        f"SELECT id, idempotency_key, state, attempts, lease_until, relay FROM {s}.outbox").fetchall()}
    keys = Counter(k for k, _ in arrivals)
    by_key = {rows[i][0]: i for i in rows}
    bad: list[str] = []
    checked = 0

    def expect(ok: bool, message: str) -> None:
        nonlocal checked
        checked += 1
        if not ok:
            bad.append(f"[{label}] {message}")

    missing = set(ledger.messages) - set(rows)
    expect(not missing, f"{len(missing)} committed outbox rows are missing, e.g. {sorted(missing)[:5]}")
    expect(not (ledger.rolled_back_messages & set(rows)), "a rolled-back outbox row is in the table")
    leaked = {f"outbox:{i}" for i in ledger.rolled_back_messages} & set(keys)
    expect(not leaked, f"rolled-back messages arrived: {sorted(leaked)[:5]}")
    strangers = set(keys) - set(by_key)
    expect(not strangers, f"messages arrived that no committed row sent: {sorted(strangers)[:5]}")
    for key, body in arrivals:
        if key in by_key and by_key[key] in ledger.messages:
            expect(json.loads(body) == ledger.messages[by_key[key]], f"{key} arrived with another payload")
    for row_id, (key, state, attempts, lease, relay) in rows.items():
        expect(keys[key] <= attempts, f"row {row_id} arrived {keys[key]} times in {attempts} attempts")
        if final:
            expect(state == "sent", f"row {row_id} ended {state} (attempts {attempts})")
            expect(keys[key] >= 1, f"row {row_id} is {state} but never arrived")
            expect(lease is None and relay is None, f"row {row_id} is still leased to {relay}")
    if final:
        expect(set(rows) == set(ledger.messages), "the outbox holds rows nobody committed")
    TALLY.invariants += checked
    TALLY.violations.extend(bad)
    return bad


def wait_outbox_sent(conn, schema: str, fleet: Fleet, timeout: float = 120) -> bool:
    s = quote_ident(schema)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.replace_dead()
        if not conn.execute(f"SELECT count(*) FROM {s}.outbox WHERE state <> 'sent'").fetchone()[0]:
            return True
        time.sleep(0.2)
    return False


def connect(dsn: str, attempts: int = 100) -> psycopg.Connection:
    """An autocommit connection, waiting for a restarting server."""
    for _ in range(attempts):
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=3)
        except psycopg.OperationalError:
            time.sleep(0.1)
    return psycopg.connect(dsn, autocommit=True, connect_timeout=3)
