#!/usr/bin/env python3
"""A queue under a held snapshot: steady load, then a session idle in a REPEATABLE READ transaction, then its release.

    .venv/bin/python benchmarks/held_snapshot.py                          # 90 s + 600 s held + 180 s, R = 1,000
    .venv/bin/python benchmarks/held_snapshot.py --rate 2000 --systems joblane
    .venv/bin/python benchmarks/held_snapshot.py --warmup 60 --hold 240 --after 60

For each system in turn (joblane, PgQueuer, PGMQ; one at a time, each in a
fresh database of one PostgreSQL cluster): one worker at the library's
defaults, a producer committing ``--rate`` jobs a second one per
transaction (on two connections, each at half the rate, so that a slow WAL
flush on a busy machine does not cap what it offers), and for joblane the outbox relay delivering ``--relay-rate``
messages a second (one per transaction too) to a sink in its own process
that drops them. After ``--warmup`` seconds a session opens a REPEATABLE
READ transaction, runs a query (so its snapshot is taken and its xmin
pins the horizon vacuum may clean up to) and stays idle for ``--hold``
seconds; then it commits and the load runs ``--after`` seconds more.

Every ``--every`` seconds a row: what the producer committed and the worker
started per second, the backlog (committed minus started), pick-up p50/p99
(from the wall time just before the job's INSERT to its handler's start),
the mean time of the claim statement (pg_stat_statements, when loaded: it is
in the cluster this script starts) and, for joblane, the index entries of its
ready lanes and cursors each claim read (idx_tup_read), the cluster's WAL bytes per
job enqueued (everything written in the interval, the relay's and vacuum's
too), the heap and index size of the system's
tables, their dead tuples (pg_stat_get_dead_tuples) and the vacuums run on
them. The relay's messages per second and delivery p99 are on joblane's
rows. At the end of each phase the claim runs once under EXPLAIN (ANALYZE,
BUFFERS) in a transaction that is rolled back (for the peers: the scan of
their pick, written out by hand). At the end a summary per system: the last
minute before the hold, the last minute of the hold, the last minute after
the release, and how long after the release the backlog was back under one
second of work. Everything goes to ``--out`` as JSON.

Without ``--dsn`` it starts a PostgreSQL cluster of its own (initdb,
PostgreSQL's default settings, autovacuum on, plus pg_stat_statements) as
benchmarks/soak.py does; with ``--dsn`` it creates a scratch database on
that server per system. The cost of a commit on the machine is measured
before and after, as benchmarks/run.py does. The machine is shared: compare
the systems within one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from run import PEERS_PY, commit_cost, describe_cost  # noqa: E402
from soak import Cluster  # noqa: E402

SYSTEMS = "joblane,pgqueuer,pgmq"
APP = "benchmarks.held_snapshot_app:app"
PEER = HERE / "peers" / "held_snapshot_peer.py"

# the system's tables: namespace and a relname pattern; the claim statement in pg_stat_statements
TABLES = {
    "joblane": ("joblane", "%"),
    "pgqueuer": ("public", "pgqueuer%"),
    "pgmq": ("pgmq", "%"),
}
# the indexes the claim walks (index entries read per claim, from pg_stat_user_indexes.idx_tup_read):
# joblane's lanes of ready entries and their cursor rows, in every slot of the ring (migration 13)
CLAIM_INDEX = {"joblane": ("ready\\__\\_lane%", "cursors\\__\\_lane%")}
CLAIM_LIKE = {"joblane": "%claim_jobs(%", "pgqueuer": "%SKIP LOCKED%", "pgmq": "%pgmq.read(%"}

# The claim's statement (joblane: claim_jobs for queue 'held', 10 jobs)
# or, for the peers, the scan of their pick; run under EXPLAIN ANALYZE in a rolled-back transaction.
PROBES = {
    # the claim is a function (migration 13): its buffers are those of every statement inside it
    "joblane": """
SELECT id FROM joblane.claim_jobs(ARRAY['held'], 10, 'probe', 30)""",
    "pgqueuer": """
SELECT id FROM pgqueuer
 WHERE status = 'queued' AND entrypoint = ANY(ARRAY['noop']) AND execute_after < now()
 ORDER BY priority DESC, id ASC
 LIMIT 10
   FOR UPDATE SKIP LOCKED""",
    "pgmq": """
WITH cte AS (
    SELECT msg_id FROM pgmq.q_bench WHERE vt <= clock_timestamp() ORDER BY msg_id ASC LIMIT 10 FOR UPDATE SKIP LOCKED
)
UPDATE pgmq.q_bench m SET vt = clock_timestamp() + interval '30 seconds', read_ct = read_ct + 1
  FROM cte WHERE m.msg_id = cte.msg_id
RETURNING m.msg_id""",
}

SIZES = """
SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_stat_get_dead_tuples(c.oid),
       pg_stat_get_vacuum_count(c.oid) + pg_stat_get_autovacuum_count(c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname LIKE %s AND c.relkind = 'r'
"""


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class Tail:
    """New whole lines of a file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind("\n") + 1
        self.offset += len(data[:end].encode())
        return [line.split() for line in data[:end].splitlines() if line]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Run:
    """One system through warm-up, hold and after, sampled every ``every`` seconds."""

    def __init__(self, system: str, dsn: str, args: argparse.Namespace, out: Path) -> None:
        self.system, self.dsn, self.args, self.out = system, dsn, args, out
        self.procs: list[subprocess.Popen] = []
        self.rows: list[dict] = []
        self.latencies: list[list[float]] = []  # per row, for the summary's percentiles
        self.relay_latencies: list[list[float]] = []
        self.explains: dict[str, str] = {}

    # -- processes -------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, "DATABASE_URL": self.dsn, "JOBLANE_SCHEMA": "joblane", "HELD_OUT": str(self.out),
                "PYTHONPATH": str(ROOT)}

    def spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.out / f"{name}.log", "w")
        p = subprocess.Popen(command, env=self.env(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def install(self) -> None:
        if self.system == "joblane":
            command = [sys.executable, "-m", "joblane", "migrate"]
        else:
            command = [str(PEERS_PY), str(PEER), self.system, "install", self.dsn]
        subprocess.run(command, env=self.env(), cwd=ROOT, check=True, stdout=subprocess.DEVNULL)

    def start(self, seconds: float) -> subprocess.Popen:
        a = self.args
        if self.system == "joblane":
            self.spawn("worker", [sys.executable, "-m", "joblane", "worker", APP])
            if a.relay_rate > 0:
                self.spawn("relay", [sys.executable, "-m", "joblane", "relay", APP])
            time.sleep(1.0)
            return self.spawn("producer", [sys.executable, "-m", "benchmarks.held_snapshot_app", str(a.rate),
                                           str(a.relay_rate), str(seconds)])
        self.spawn("worker", [str(PEERS_PY), str(PEER), self.system, "work", self.dsn])
        time.sleep(1.0)
        return self.spawn("producer", [str(PEERS_PY), str(PEER), self.system, "produce", self.dsn, str(a.rate),
                                       str(seconds)])

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def dead_process(self) -> str | None:
        for p in self.procs:
            if p.poll() is not None and p.returncode not in (0, -signal.SIGTERM):
                log = Path(p.args[0]).name
                for f in self.out.glob("*.log"):
                    text = f.read_text().strip().splitlines()
                    if text and any("Error" in line or "Traceback" in line for line in text):
                        log = f"{f.name}: {' | '.join(text[-3:])}"
                        break
                return f"a process of {self.system} exited with {p.returncode} ({log})"
        return None

    # -- measurements ----------------------------------------------------
    def claim_stats(self, conn) -> tuple[int, float] | None:
        try:
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND query LIKE %s AND query NOT LIKE '%%EXPLAIN%%'", (CLAIM_LIKE[self.system],)).fetchone()
            return int(row[0]), float(row[1])
        except psycopg.Error:
            return None

    def index_reads(self, conn) -> int | None:
        name = CLAIM_INDEX.get(self.system)
        if name is None:
            return None
        row = conn.execute("SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE indexrelname LIKE ANY(%s)",
                           (list(name),)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def wal(self, conn) -> int:
        """The cluster's WAL position in bytes (one system runs at a time: its load writes nearly all of it)."""
        return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()[0])

    def sizes(self, conn) -> dict[str, tuple[int, int, int, int]]:
        nspname, like = TABLES[self.system]
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in conn.execute(SIZES, (nspname, like))}

    def explain(self, conn, label: str) -> None:
        try:
            with conn.transaction(force_rollback=True):
                lines = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + PROBES[self.system])]
            self.explains[label] = "\n".join(lines)
        except psycopg.Error as e:
            self.explains[label] = f"not measured: {e}".strip()

    # -- the run ---------------------------------------------------------
    def go(self) -> dict:
        a = self.args
        total = a.warmup + a.hold + a.after
        self.install()
        conn = psycopg.connect(self.dsn, autocommit=True)
        holder = psycopg.connect(self.dsn, autocommit=True)
        has_pgss = False
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
            has_pgss = True
        except psycopg.Error:
            pass
        produced_tail, handled_tail, sent_tail = (Tail(self.out / n) for n in ("produced", "handled", "sent"))
        producer = self.start(total + 2 * a.every)
        started = time.monotonic()
        phase_at = {"warmup": 0.0, "hold": a.warmup, "after": a.warmup + a.hold}
        hold_info: dict = {}
        produced = [0, 0]
        handled_total = sent_total = 0
        last = {"at": started, "produced": [0, 0], "claim": self.claim_stats(conn) if has_pgss else None,
                "index_reads": self.index_reads(conn), "wal": self.wal(conn)}
        print(f"\n{self.system}: {a.rate:g} jobs/s" + (f", relay {a.relay_rate:g} messages/s" if
              self.system == "joblane" and a.relay_rate > 0 else "") +
              f"; warm-up {a.warmup:g} s, hold {a.hold:g} s, after {a.after:g} s; rows every {a.every:g} s")
        header = ["t s", "phase", "offered/s", "finished/s", "backlog", "p50 ms", "p99 ms", "claim ms",
                  "entries/claim", "WAL B/job", "heap MB",
                  "index MB", "dead", "vacuums"]
        if self.system == "joblane" and a.relay_rate > 0:
            header += ["relay/s", "relay p99 ms", "unsent"]
        print(" | ".join(header), flush=True)
        next_at = started + a.every
        holding = False
        try:
            while True:
                now = time.monotonic()
                t = now - started
                if not holding and a.hold > 0 and t >= phase_at["hold"] and not hold_info:
                    self.explain(conn, "before the hold")
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute("SELECT count(*) FROM pg_class")  # the snapshot is taken here
                    pid = holder.info.backend_pid
                    xmin = conn.execute("SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s",
                                        (pid,)).fetchone()[0]
                    hold_info = {"pid": pid, "backend_xmin": xmin, "began_at_s": round(t, 1)}
                    print(f"-- t={t:.0f} s: session {pid} idle in a REPEATABLE READ transaction, xmin {xmin}",
                          flush=True)
                    holding = True
                if holding and t >= phase_at["hold"] + a.hold / 2 and "mid-hold" not in self.explains:
                    self.explain(conn, "mid-hold")
                if holding and t >= phase_at["after"]:
                    self.explain(conn, "end of the hold")
                    holder.execute("COMMIT")
                    hold_info["released_at_s"] = round(t, 1)
                    print(f"-- t={t:.0f} s: the session committed", flush=True)
                    holding = False
                if t >= total:
                    break
                problem = self.dead_process()
                if problem:
                    raise RuntimeError(problem)
                if now < next_at:
                    time.sleep(min(0.2, next_at - now))
                    continue
                next_at += a.every
                # what was started, then what was produced: the producer's count is the newer, the backlog >= 0
                lat = [float(x[1]) for x in handled_tail.lines()]
                relay_lat = [float(x[1]) for x in sent_tail.lines()] if self.system == "joblane" else []
                for line in produced_tail.lines():
                    produced = [int(line[1]), int(line[2])]
                handled_total += len(lat)
                sent_total += len(relay_lat)
                span = now - last["at"]
                claim = self.claim_stats(conn) if has_pgss else None
                claim_ms = None
                if claim and last["claim"] and claim[0] > last["claim"][0]:
                    claim_ms = (claim[1] - last["claim"][1]) / (claim[0] - last["claim"][0])
                sizes = self.sizes(conn)
                reads = self.index_reads(conn)
                wal = self.wal(conn)
                jobs = produced[0] - last["produced"][0]
                per_claim = None
                if reads is not None and last["index_reads"] is not None and claim and last["claim"] \
                        and claim[0] > last["claim"][0]:
                    per_claim = (reads - last["index_reads"]) / (claim[0] - last["claim"][0])
                phase = "after" if t >= phase_at["after"] else "hold" if t >= phase_at["hold"] and a.hold > 0 \
                    else "warmup"
                row = {
                    "t": round(t, 1), "phase": phase,
                    "offered_per_s": round((produced[0] - last["produced"][0]) / span, 1),
                    "finished_per_s": round(len(lat) / span, 1),
                    "backlog": max(0, produced[0] - handled_total),
                    "p50_ms": None if not lat else round(percentile(lat, 0.5) * 1000, 1),
                    "p99_ms": None if not lat else round(percentile(lat, 0.99) * 1000, 1),
                    "claim_ms": None if claim_ms is None else round(claim_ms, 3),
                    "index_entries_per_claim": None if per_claim is None else round(per_claim),
                    "claims_per_s": None if not (claim and last["claim"]) else
                    round((claim[0] - last["claim"][0]) / span, 1),
                    # WAL of the interval per job enqueued in it (with the relay's, vacuum's and all else's)
                    "wal_bytes_per_job": round((wal - last["wal"]) / jobs) if jobs > 0 else None,
                    "heap_bytes": sum(v[0] for v in sizes.values()),
                    "index_bytes": sum(v[1] for v in sizes.values()),
                    "dead_tuples": sum(v[2] for v in sizes.values()),
                    "vacuums": sum(v[3] for v in sizes.values()),
                    "tables": {k: {"heap": v[0], "indexes": v[1], "dead": v[2], "vacuums": v[3]}
                               for k, v in sizes.items()},
                }
                if self.system == "joblane" and a.relay_rate > 0:
                    row.update({"relay_offered_per_s": round((produced[1] - last["produced"][1]) / span, 1),
                                "relay_per_s": round(len(relay_lat) / span, 1),
                                "relay_p50_ms": None if not relay_lat else round(percentile(relay_lat, 0.5) * 1000, 1),
                                "relay_p99_ms": None if not relay_lat else round(percentile(relay_lat, 0.99) * 1000, 1),
                                "unsent": max(0, produced[1] - sent_total)})
                self.rows.append(row)
                self.latencies.append(lat)
                self.relay_latencies.append(relay_lat)
                last = {"at": now, "produced": produced, "claim": claim, "index_reads": reads, "wal": wal}
                print(" | ".join(fmt(v) for v in self.row_cells(row)), flush=True)
        finally:
            if holding:
                holder.execute("ROLLBACK")
            self.stop()
            holder.close()
            conn.close()
        if producer.returncode not in (0, -signal.SIGTERM, None):
            raise RuntimeError(f"the producer of {self.system} exited with {producer.returncode}")
        return {"system": self.system, "hold": hold_info, "rows": self.rows, "summary": self.summary(),
                "explain": self.explains}

    def row_cells(self, row: dict) -> list:
        cells = [row["t"], row["phase"], row["offered_per_s"], row["finished_per_s"], row["backlog"], row["p50_ms"],
                 row["p99_ms"], row["claim_ms"], row["index_entries_per_claim"], row["wal_bytes_per_job"],
                 row["heap_bytes"] / 2**20,
                 row["index_bytes"] / 2**20,
                 row["dead_tuples"], row["vacuums"]]
        if "relay_per_s" in row:
            cells += [row["relay_per_s"], row["relay_p99_ms"], row["unsent"]]
        return cells

    def summary(self) -> dict:
        """The last minute (or the whole phase when shorter) of each phase; the time to recover after the release."""
        a = self.args
        ends = {"before": a.warmup, "hold": a.warmup + a.hold, "after": a.warmup + a.hold + a.after}
        lengths = {"before": a.warmup, "hold": a.hold, "after": a.after}
        out: dict = {}
        for name, end in ends.items():
            window = min(60.0, lengths[name])
            picked = [i for i, r in enumerate(self.rows) if end - window < r["t"] <= end + a.every / 2]
            if not picked or lengths[name] <= 0:
                continue
            rows = [self.rows[i] for i in picked]
            lat = [x for i in picked for x in self.latencies[i]]
            claims = [r["claim_ms"] for r in rows if r["claim_ms"] is not None]
            entries = [r["index_entries_per_claim"] for r in rows if r["index_entries_per_claim"] is not None]
            wals = [r["wal_bytes_per_job"] for r in rows if r["wal_bytes_per_job"] is not None]
            s = {
                "window_s": window,
                "offered_per_s": round(statistics.fmean(r["offered_per_s"] for r in rows), 1),
                "finished_per_s": round(statistics.fmean(r["finished_per_s"] for r in rows), 1),
                "p50_ms": None if not lat else round(percentile(lat, 0.5) * 1000, 1),
                "p99_ms": None if not lat else round(percentile(lat, 0.99) * 1000, 1),
                "claim_ms": round(statistics.fmean(claims), 3) if claims else None,
                "index_entries_per_claim": round(statistics.fmean(entries)) if entries else None,
                "wal_bytes_per_job": round(statistics.fmean(wals)) if wals else None,
                "backlog": rows[-1]["backlog"],
                "dead_tuples": rows[-1]["dead_tuples"],
                "heap_mb": round(rows[-1]["heap_bytes"] / 2**20, 1),
                "index_mb": round(rows[-1]["index_bytes"] / 2**20, 1),
                "vacuums": rows[-1]["vacuums"],
            }
            if "relay_per_s" in rows[-1]:
                relay = [x for i in picked for x in self.relay_latencies[i]]
                s["relay_per_s"] = round(statistics.fmean(r["relay_per_s"] for r in rows), 1)
                s["relay_p99_ms"] = None if not relay else round(percentile(relay, 0.99) * 1000, 1)
                s["unsent"] = rows[-1]["unsent"]
            out[name] = s
        if a.hold > 0:
            one_second = max(50.0, a.rate)
            after = [r for r in self.rows if r["phase"] == "after"]
            peak = [r["backlog"] for r in self.rows if r["phase"] == "hold"]
            out["hold_peak_backlog"] = max(peak) if peak else None
            recovered = next((r for r in after if r["backlog"] <= one_second), None)
            out["recovered_after_s"] = None if recovered is None else round(recovered["t"] - ends["hold"], 1)
        return out


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_summary(results: list[dict], rate: float) -> None:
    print(f"\nsummary at {rate:g} jobs/s offered (last minute of each phase, or the whole phase when shorter)")
    head = ["system", "phase", "offered/s", "finished/s", "p50 ms", "p99 ms", "claim ms", "entries/claim",
            "WAL B/job", "backlog",
            "dead",
            "heap MB", "index MB", "vacuums"]
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in results:
        if "error" in r:
            print(f"{r['system']} | {r['error']}")
            continue
        s = r["summary"]
        for phase in ("before", "hold", "after"):
            if phase not in s:
                continue
            p = s[phase]
            cells = [r["system"], phase, p["offered_per_s"], p["finished_per_s"], p["p50_ms"], p["p99_ms"],
                     p["claim_ms"], p["index_entries_per_claim"], p["wal_bytes_per_job"], p["backlog"],
                     p["dead_tuples"], p["heap_mb"],
                     p["index_mb"], p["vacuums"]]
            print(" | ".join(fmt(c) for c in cells))
        extra = []
        if s.get("hold_peak_backlog") is not None:
            extra.append(f"peak backlog in the hold {s['hold_peak_backlog']:,}")
        if "hold_peak_backlog" in s:
            rec = s.get("recovered_after_s")
            extra.append("backlog under one second of work " +
                         (f"{rec:g} s after the release" if rec is not None else "not reached after the release"))
        for phase in ("before", "hold", "after"):
            p = s.get(phase, {})
            if "relay_per_s" in p:
                extra.append(f"relay {phase}: {p['relay_per_s']:,.0f} messages/s, p99 {fmt(p['relay_p99_ms'])} ms, "
                             f"unsent {p['unsent']:,}")
        if extra:
            print(f"  {r['system']}: " + "; ".join(extra))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a server where databases may be created (default: start a cluster)")
    parser.add_argument("--systems", default=SYSTEMS)
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs per second, one per transaction")
    parser.add_argument("--relay-rate", type=float, default=200.0,
                        help="outbox messages per second for joblane's relay (0: no relay)")
    parser.add_argument("--warmup", type=float, default=90.0)
    parser.add_argument("--hold", type=float, default=600.0)
    parser.add_argument("--after", type=float, default=180.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between rows")
    parser.add_argument("--out", default=str(HERE / "held.json"))
    args = parser.parse_args()
    for name in ("rate", "warmup", "every"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in TABLES]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {SYSTEMS}")
    peers_missing = None
    if any(s != "joblane" for s in systems) and not PEERS_PY.exists():
        done = subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], capture_output=True, text=True)
        if done.returncode != 0 or not PEERS_PY.exists():
            peers_missing = "not installed: benchmarks/peers/setup.sh failed: " + \
                " ".join(done.stderr.strip().splitlines()[-1:])

    cluster = None
    admin = args.dsn
    if admin is None:
        cluster = Cluster()
        admin = cluster.start(("shared_preload_libraries=pg_stat_statements",))
    results: list[dict] = []
    costs = []
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            settings = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'autovacuum_naptime',"
                " 'autovacuum_vacuum_scale_factor', 'shared_buffers', 'synchronous_commit', 'server_version',"
                " 'shared_preload_libraries') ORDER BY name").fetchall())
        print("cluster:", ", ".join(f"{k}={v}" for k, v in settings.items()))
        costs.append(commit_cost(admin))
        if costs[0]:
            print(f"before: {describe_cost(costs[0])}", flush=True)
        for system in systems:
            if system != "joblane" and peers_missing:
                print(f"\n{system}: {peers_missing}")
                results.append({"system": system, "error": peers_missing})
                continue
            name = f"held_{system}_{secrets.token_hex(3)}"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            try:
                with tempfile.TemporaryDirectory(prefix=f"held-{system}-") as out:
                    results.append(Run(system, with_database(admin, name), args, Path(out)).go())
            except (RuntimeError, subprocess.CalledProcessError, psycopg.Error) as e:
                print(f"\n{system}: failed: {e}")
                results.append({"system": system, "error": f"failed: {e}"})
            finally:
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        costs.append(commit_cost(admin))
    finally:
        if cluster is not None:
            cluster.stop()
    print_summary(results, args.rate)
    for when, cost in zip(("before", "after"), costs):
        print(f"this machine {when} the runs: {describe_cost(cost) if cost else 'commit cost not measured'}")
    report = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/held_snapshot.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "commit_before": costs[0] if costs else None, "commit_after": costs[1] if len(costs) > 1 else None,
                    "cluster": settings},
        "settings": {k: getattr(args, k) for k in ("rate", "relay_rate", "warmup", "hold", "after", "every")},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
