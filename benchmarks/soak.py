#!/usr/bin/env python3
"""Sustained load: a producer at a fixed rate, one worker and one relay, for a given time; a table every 30 s.

    .venv/bin/python benchmarks/soak.py --rate 1500 --minutes 10 --retention 120
    .venv/bin/python benchmarks/soak.py --rate 20000 --minutes 3 --workers 2   # what two workers sustain

It starts a PostgreSQL cluster of its own (``initdb``, PostgreSQL's default
settings: autovacuum on) so that vacuum and table growth are measured as a
production database would see them, prints the autovacuum settings it ran
with, then every 30 s: the size of joblane's tables, live rows and dead row
versions of ``jobs``, what finished per second, and the backlog. The
producer commits ``--batch`` jobs per transaction and one outbox message per
10 jobs; the relay delivers them to a sink that drops them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from joblane.showcase import free_port

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.soak_app:app"


def pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for version in sorted(os.listdir("/usr/lib/postgresql"), reverse=True) if os.path.isdir("/usr/lib/postgresql") else []:
        candidate = f"/usr/lib/postgresql/{version}/bin/{name}"
        if os.path.exists(candidate):
            return candidate
    sys.exit(f"error: {name} not found (install PostgreSQL's server package)")


class Cluster:
    """A throwaway PostgreSQL with default settings, run as the postgres user when we are root."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="joblane-soak-"))
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.dir, "postgres")

    def run(self, *args: str) -> None:
        command = list(args)
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    def start(self, settings: tuple[str, ...] = ()) -> str:
        data = self.dir / "data"
        self.run(pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        extra = "".join(f" -c {s}" for s in settings)
        self.run(pg_bin("pg_ctl"), "-D", str(data), "-l", str(self.dir / "server.log"), "-w", "start",
                 "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1{extra}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self.run(pg_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


# a partition's figures go to its partitioned table (attempts)
SIZES = """
SELECT coalesce(r.relname, c.relname), sum(pg_total_relation_size(c.oid))::bigint, sum(s.n_live_tup)::bigint,
       sum(s.n_dead_tup)::bigint, max(s.last_autovacuum)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_class r ON r.oid = pg_partition_root(c.oid)
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE n.nspname = 'joblane' AND c.relkind = 'r'
 GROUP BY 1
"""


def sample(conn) -> dict:
    tables = {name: (size, live, dead, vacuumed) for name, size, live, dead, vacuumed in conn.execute(SIZES)}
    # every try inserts one attempts row; the counter is monotonic though the pruner deletes the rows
    # (summed over the partitions of attempts; a generation dropped after the retention takes its count along)
    done = conn.execute("SELECT coalesce(sum(s.n_tup_ins), 0)::bigint FROM pg_stat_user_tables s"
                        " JOIN pg_inherits i ON i.inhrelid = s.relid"
                        " WHERE i.inhparent = 'joblane.attempts'::regclass").fetchone()[0]
    backlog = conn.execute("SELECT count(*) FROM joblane.jobs WHERE state = 'pending'").fetchone()[0]
    unsent = conn.execute("SELECT count(*) FROM joblane.outbox WHERE state = 'pending'").fetchone()[0]
    return {"tables": tables, "done": done, "backlog": backlog, "unsent": unsent, "at": time.monotonic()}


def retention_seconds(text: str) -> float:
    from joblane.rules import parse_duration

    return parse_duration(text)


def summarise(rows: list[tuple[float, float, int, int]], retention: float) -> None:
    """Throughput of the first and last tenth-of-an-hour windows; table size once retention applies; the backlog."""
    total = rows[-1][0]
    window = min(600.0, total / 3)
    first = [r[1] for r in rows if r[0] <= window]
    last = [r[1] for r in rows if r[0] > total - window]
    if first and last:
        a, b = sum(first) / len(first), sum(last) / len(last)
        print(f"throughput: first {window:.0f} s {a:,.0f} tries/s, last {window:.0f} s {b:,.0f} tries/s "
              f"({(b / a - 1) * 100:+.1f} %)")
    # retention applies once the first finished jobs are older than it and a pruning round has run
    settled = [r[2] for r in rows if r[0] >= retention + 180]
    if len(settled) >= 2:
        low, high = min(settled), max(settled)
        print(f"joblane's tables once retention applies (t >= {retention + 180:.0f} s): "
              f"{low / 2**20:.0f}-{high / 2**20:.0f} MB, end {settled[-1] / 2**20:.0f} MB "
              f"(max/min {high / low:.2f})")
    print(f"total size of joblane's tables at the end: {rows[-1][2] / 2**20:.0f} MB; backlog {rows[-1][3]:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1500.0, help="jobs per second the producer commits")
    parser.add_argument("--batch", type=int, default=50, help="jobs per producer transaction")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--retention", default="120", help="worker and relay --retention (seconds or 7d)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between table rows")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (each at its defaults)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a PostgreSQL setting other than its default, e.g. autovacuum_naptime=10s")
    parser.add_argument("--worker-args", default="", help="more options for each worker, e.g. '--claimers 2'")
    args = parser.parse_args()
    # SIGTERM (or SIGINT from a background job) stops the run through the finally below: processes, then cluster
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    for setting in args.setting:
        if not re.fullmatch(r"[a-z_]+=[A-Za-z0-9_.]+", setting):
            parser.error(f"--setting {setting!r}: expected name=value")
    cluster = Cluster()
    dsn = cluster.start(tuple(args.setting))
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "DATABASE_URL": dsn, "JOBLANE_SCHEMA": "joblane", "PYTHONPATH": str(ROOT)}
    logs = cluster.dir / "logs"
    logs.mkdir()
    try:
        subprocess.run([sys.executable, "-m", "joblane", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        with psycopg.connect(dsn, autocommit=True) as conn:
            settings = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'autovacuum_naptime',"
                " 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_cost_limit', 'autovacuum_vacuum_cost_delay',"
                " 'synchronous_commit', 'shared_buffers', 'server_version') ORDER BY name").fetchall()
            print("cluster:", ", ".join(f"{k}={v}" for k, v in settings))
            print("joblane tables: autovacuum_vacuum_scale_factor=0.01, cost_limit=2000, cost_delay=1ms "
                  "(migration 3)")
            print(f"load: {args.rate:g} jobs/s in transactions of {args.batch}, one outbox message per 10 jobs; "
                  f"{args.workers} worker(s) {args.worker_args}, one relay, retention {args.retention}")
            worker_args = ["--retention", args.retention, *args.worker_args.split()]
            for n, (command, extra) in enumerate([("worker", worker_args)] * args.workers
                                                 + [("relay", ["--retention", args.retention])]):
                log = open(logs / f"{command}-{n}.log", "w")
                procs.append(subprocess.Popen([sys.executable, "-m", "joblane", command, APP, *extra], env=env,
                                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
            producer = subprocess.Popen([sys.executable, "-m", "benchmarks.soak_app", str(args.rate), str(args.batch),
                                         str(args.minutes * 60)], env=env, cwd=ROOT)
            procs.append(producer)
            header = ("t (s)", "jobs MB", "attempts MB", "outbox MB", "jobs rows", "jobs dead", "tries/s",
                      "backlog", "unsent")
            print(" | ".join(header))
            print(" | ".join("---" for _ in header))
            started = time.monotonic()
            last = sample(conn)
            rows = []
            while producer.poll() is None:
                time.sleep(args.every)
                if producer.poll() is not None:
                    break  # the producer stopped within this window: its rate would read low
                now = sample(conn)
                rate = (now["done"] - last["done"]) / (now["at"] - last["at"])
                t = now["at"] - started
                jobs = now["tables"].get("jobs", (0, 0, 0, None))
                mb = {k: v[0] / 2**20 for k, v in now["tables"].items()}
                row = (f"{t:.0f}", f"{mb.get('jobs', 0):.0f}", f"{mb.get('attempts', 0):.0f}",
                       f"{mb.get('outbox', 0):.1f}", f"{jobs[1]:,}", f"{jobs[2]:,}", f"{rate:,.0f}",
                       f"{now['backlog']:,}", f"{now['unsent']:,}")
                rows.append((t, rate, sum(v[0] for v in now["tables"].values()), now["backlog"]))
                print(" | ".join(row), flush=True)
                last = now
            if rows:
                summarise(rows, retention_seconds(args.retention))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.stop()


if __name__ == "__main__":
    main()
