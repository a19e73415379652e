"""`joblane bench`: joblane's side of the benchmark workloads (benchmarks/ in the repository compares with peers).

Workloads (a-d as in the peers' figures):
  a  enqueue N jobs, one transaction each, one client
  b  bulk enqueue N jobs, 1,000 per call: App.enqueue_many of JobSpecs, the
     task's typed bulk form (task.enqueue_many of payloads), and the first
     with notifications off
  c  process N pre-filled no-op jobs with one worker, timed from worker start
     until a separate connection sees no unfinished job
  d  latency: an idle worker; jobs enqueued one at a time 10 ms apart;
     enqueue-to-handler-start p50/p99
  e  the outbox relay to a local HTTP receiver (one request per message, and
     batch POSTs) and to NATS JetStream, beside the bare nats-py client's
     pipelined publish rate measured in the same run
  f  c with many jobs waiting (not yet due) in the same table
  g  8 concurrent enqueuers, with and without NOTIFY
Each run uses a fresh schema, dropped afterwards. ``commit_cost`` measures
what a durable commit costs on the machine, printed beside the results.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psycopg
from psycopg import sql

from ..app import App
from ..queries import quote_ident
from ..testing import isolated_schema, new_schema_name
from ..types import JobSpec
from . import free_port


@dataclass
class Result:
    workload: str
    settings: str
    value: float
    unit: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"system": "joblane", "workload": self.workload, "settings": self.settings,
                "value": round(self.value, 2), "unit": self.unit, **self.extra}


def commit_cost(dsn: str, commits: int = 300) -> dict[str, Any]:
    """What one durable commit costs here: ``commits`` one-row INSERTs in autocommit, and as many bare round trips.

    The scratch table is a logged one (a temporary table writes no WAL, so
    its commit flushes nothing); ``synchronous_commit`` is reported as the
    server has it.
    """
    import os

    table = sql.Identifier(f"joblane_commit_cost_{os.getpid()}_{threading.get_ident() % 100_000}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert = sql.SQL("INSERT INTO {} VALUES (1)").format(table).as_string(conn)  # composed once, outside the timing
        setting = conn.execute("SHOW synchronous_commit").fetchone()[0]
        conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(table))
        try:
            for _ in range(20):  # warm up
                conn.execute(insert)
            started = time.perf_counter()
            for _ in range(commits):
                conn.execute(insert)
            commit = (time.perf_counter() - started) / commits
            started = time.perf_counter()
            for _ in range(commits):
                conn.execute("SELECT 1")
            trip = (time.perf_counter() - started) / commits
        finally:
            conn.execute(sql.SQL("DROP TABLE {}").format(table))
    return {"commit_ms": round(commit * 1000, 3), "commits_per_s": round(1 / commit), "round_trip_ms":
            round(trip * 1000, 3), "synchronous_commit": setting}


def describe_commit_cost(cost: dict[str, Any]) -> str:
    return (f"commit {cost['commit_ms']:.2f} ms ({cost['commits_per_s']:,} commits/s; a one-row INSERT in autocommit, "
            f"synchronous_commit {cost['synchronous_commit']}), round trip {cost['round_trip_ms']:.2f} ms")


class ServerCost:
    """What the server wrote and spent over a stretch of a benchmark: WAL bytes and CPU time, per job.

    WAL from ``pg_current_wal_lsn()`` before and after: the whole cluster's, so
    a quiet server is assumed (the benchmarks run alone). CPU from /proc: the
    postmaster's own and reaped children's time plus that of its live
    children (backends, WAL writer, checkpointer), when the server runs on
    this machine and /proc can be read; None otherwise.
    """

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.start: tuple[int, float | None] | None = None
        self.end: tuple[int, float | None] | None = None

    def __enter__(self) -> "ServerCost":
        self.start = self._read()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = self._read()

    def _read(self) -> tuple[int, float | None]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            lsn, pid = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_backend_pid()").fetchone()
            # while the backend lives: its /proc entry names the postmaster (closed, it may be gone already)
            return int(lsn), _cluster_cpu_seconds(pid)

    def per_job(self, jobs: int) -> dict[str, Any]:
        if self.start is None or self.end is None or jobs <= 0:
            return {}
        out: dict[str, Any] = {"wal_bytes_per_job": round((self.end[0] - self.start[0]) / jobs, 1)}
        if self.start[1] is not None and self.end[1] is not None:
            out["server_cpu_us_per_job"] = round((self.end[1] - self.start[1]) / jobs * 1e6, 2)
        return out


def _cluster_cpu_seconds(backend_pid: int) -> float | None:
    """CPU seconds of the cluster a backend belongs to, from /proc (None where it cannot be read)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    try:
        postmaster = int(stat(backend_pid)[1])  # the backend's parent
        total = sum(int(v) for v in stat(postmaster)[11:15])  # utime, stime, cutime, cstime (reaped children)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = stat(int(entry))
                except OSError:
                    continue
                if int(fields[1]) == postmaster:
                    total += int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None
    return total / tick


def _bench_app(dsn: str, schema: str, *, lean: bool = False) -> App:
    app = App(dsn, schema=schema)

    @app.task("noop", lean=lean)
    async def noop(job):
        return None

    return app


def enqueue_single(dsn: str, jobs: int = 5000, *, autocommit: bool = True) -> Result:
    with isolated_schema(dsn, new_schema_name("bench")) as schema:
        app = _bench_app(dsn, schema)
        with psycopg.connect(dsn, autocommit=autocommit) as conn, ServerCost(dsn) as cost:
            started = time.perf_counter()
            for i in range(jobs):
                if autocommit:
                    app.enqueue(conn, "noop", {"i": i})
                else:
                    with conn.transaction():
                        app.enqueue(conn, "noop", {"i": i})
            elapsed = time.perf_counter() - started
    return Result("a", "autocommit" if autocommit else "explicit transaction", jobs / elapsed, "jobs/s",
                  cost.per_job(jobs))


def enqueue_bulk(dsn: str, jobs: int = 50_000, per_call: int = 1000, *, form: str = "jobspec",
                 notify: bool = True) -> Result:
    """b: ``jobs`` jobs in calls of ``per_call``, each call its own transaction (autocommit).

    ``form`` "jobspec": ``app.enqueue_many(conn, [JobSpec(...), ...])``;
    "typed": ``noop.enqueue_many(conn, [payload, ...])``, the task's bulk
    form, which takes a list of payloads as PGMQ's send_batch takes a list of
    messages. ``notify=False``: ``App(notify=False)``, no wake-up sent.
    """
    with isolated_schema(dsn, new_schema_name("bench")) as schema:
        app = _bench_app(dsn, schema)
        app.notify = notify
        noop = app.tasks["noop"].fn
        with psycopg.connect(dsn, autocommit=True) as conn:
            # one untimed call first, as the peers' scripts do (pgqueuer_bench, pgmq_bench): the first
            # statement of a process pays for loading code and types
            app.enqueue_many(conn, [JobSpec("noop", {"warm-up": True})])
            noop.enqueue_many(conn, [{"warm-up": True}])
            with ServerCost(dsn) as cost:
                started = time.perf_counter()
                for start in range(0, jobs, per_call):
                    stop = min(jobs, start + per_call)
                    if form == "typed":
                        noop.enqueue_many(conn, [{"i": i} for i in range(start, stop)])
                    else:
                        app.enqueue_many(conn, [JobSpec("noop", {"i": i}) for i in range(start, stop)])
                elapsed = time.perf_counter() - started
    settings = f"{per_call} per call" + (", typed" if form == "typed" else "") + ("" if notify else ", notify off")
    return Result("b", settings, jobs / elapsed, "jobs/s", cost.per_job(jobs))


def _prefill(app: App, jobs: int) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        for start in range(0, jobs, 5000):
            app.enqueue_many(conn, [JobSpec("noop", {"i": i}) for i in range(start, min(jobs, start + 5000))])
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(app.schema)))


def _history(app: App, jobs: int) -> None:
    """``jobs`` finished jobs with their attempts rows, spread over the last 6 days (none old enough to prune),
    and the dashboard's roll-ups of them made, as a worker running all along would have made them."""
    from ..maintenance import History

    names = {"jobs": sql.Identifier(app.schema, "jobs"), "attempts": sql.Identifier(app.schema, "attempts")}
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        for start in range(0, jobs, 1_000_000):
            count = min(jobs, start + 1_000_000) - start
            # the partitions of attempts for these million job ids (the generation of the highest id so far
            # and the next one), as the workers' pruner makes them ahead of the ids
            conn.execute(sql.SQL("SELECT {}.ensure_attempt_generations()").format(sql.Identifier(app.schema)))
            conn.execute(sql.SQL(
                "WITH made AS (INSERT INTO {jobs} (kind, payload, state, attempts, created_at, run_after, started_at,"
                " finished_at) SELECT 'noop', jsonb_build_object('i', g), 'done', 1, t, t, t, t"
                " FROM generate_series(1, %s) g, LATERAL (SELECT now() - interval '6 days'"
                " + (%s + g) * (interval '6 days' / %s::float8) AS t) s RETURNING id, finished_at)"
                " INSERT INTO {attempts} (job_id, attempt, outcome, started_at, finished_at, worker)"
                " SELECT id, 1, 'done', finished_at, finished_at, 'history' FROM made").format(**names),
                (count, start, jobs + 1))
        for table in names.values():
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))

    async def roll_up() -> None:
        import asyncpg

        history = History(app.store)
        conn = await asyncpg.connect(app.dsn)
        try:
            while await history.run_once(conn) is not None and history.behind:
                pass
        finally:
            await conn.close()

    asyncio.run(roll_up())


def process(dsn: str, jobs: int = 20_000, *, concurrency: int = 10, claim_batch: int | None = None,
            waiting: int = 0, history: int = 0, label: str | None = None, lean: bool = False,
            **worker_options: Any) -> Result:
    """Workload c; f with ``waiting`` more jobs scheduled for tomorrow in the same queue, or ``history`` finished jobs."""
    from ..worker import Worker

    with isolated_schema(dsn, new_schema_name("bench")) as schema:
        app = _bench_app(dsn, schema, lean=lean)
        if history:
            _history(app, history)
        _prefill(app, jobs + waiting)
        if waiting:
            # f: the extra jobs wait in the same queue but later (run_after in the future),
            # so the claim walks past nothing and the table and index are big.
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    f"UPDATE {quote_ident(schema)}.jobs SET run_after = now() + interval '1 day'"
                    f" WHERE id IN (SELECT id FROM {quote_ident(schema)}.jobs ORDER BY id DESC LIMIT %s)", (waiting,))
                conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))

        async def run() -> tuple[float, float]:
            worker = Worker(app, concurrency=concurrency, claim_batch=claim_batch, **worker_options)
            done = threading.Event()
            finished: list[float] = []
            started = time.perf_counter()
            # one EXISTS per state, so each reads its partial index whatever else the table holds
            jobs_table = f"{quote_ident(schema)}.jobs"
            ready = " AND run_after <= now()" if waiting else ""
            watch_sql = (f"SELECT EXISTS (SELECT 1 FROM {jobs_table} WHERE state = 'running')"
                         f" OR EXISTS (SELECT 1 FROM {jobs_table} WHERE state = 'pending'{ready})")
            watcher = threading.Thread(target=_watch_sql, args=(app.dsn, watch_sql, done, finished), daemon=True)
            runner = asyncio.create_task(worker.run(install_signals=False))
            watcher.start()
            while not finished and not runner.done():
                await asyncio.sleep(0.01)
            worker.request_stop()
            done.set()
            await runner
            return started, finished[0]

        with ServerCost(dsn) as cost:  # the worker's start and stop too: a few statements among thousands
            started, ended = asyncio.run(run())
    name = "f" if waiting or history else "c"
    settings = label or f"concurrency {concurrency}, claim {claim_batch or concurrency}"
    if waiting:
        settings += f", {waiting:,} waiting"
    if history:
        settings += f", {history:,} finished in history"
    return Result(name, settings, jobs / (ended - started), "jobs/s", cost.per_job(jobs))


def _watch_sql(dsn: str, sql: str, done: threading.Event, finished_at: list[float]) -> None:
    """Poll ``sql`` (an EXISTS) on its own connection; note the time it first answers false."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not done.is_set():
            if not conn.execute(sql).fetchone()[0]:
                finished_at.append(time.perf_counter())
                return
            time.sleep(0.02)


def latency(dsn: str, jobs: int = 500, gap: float = 0.010) -> Result:
    from ..worker import Worker

    with isolated_schema(dsn, new_schema_name("bench")) as schema:
        app = App(dsn, schema=schema)
        delays: list[float] = []

        @app.task("stamp")
        async def stamp(job):
            delays.append(time.time() - job.payload["t"])

        async def run() -> None:
            worker = Worker(app, concurrency=10)
            runner = asyncio.create_task(worker.run(install_signals=False))
            await worker.started.wait()
            await asyncio.sleep(0.5)  # idle, listening

            def produce() -> None:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for _ in range(jobs):
                        app.enqueue(conn, "stamp", {"t": time.time()})
                        time.sleep(gap)

            await asyncio.to_thread(produce)
            deadline = time.monotonic() + 10
            while len(delays) < jobs and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            worker.request_stop()
            await runner

        asyncio.run(run())
    ms = sorted(d * 1000 for d in delays)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return Result("d", f"{jobs} jobs {gap * 1000:.0f} ms apart", p50, "ms p50", {"p50_ms": round(p50, 2),
                                                                                 "p99_ms": round(p99, 2)})


def concurrent_enqueue(dsn: str, writers: int = 8, jobs_each: int = 1000, *, notify: bool = True) -> Result:
    """g: ``writers`` threads, each its own connection, one job per transaction."""
    with isolated_schema(dsn, new_schema_name("bench")) as schema:
        app = _bench_app(dsn, schema)
        app.notify = notify
        barrier = threading.Barrier(writers + 1)

        def write() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                for i in range(jobs_each):
                    app.enqueue(conn, "noop", {"i": i})

        threads = [threading.Thread(target=write) for _ in range(writers)]
        for t in threads:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
    return Result("g", f"{writers} writers, notify {'on' if notify else 'off'}", writers * jobs_each / elapsed, "jobs/s")


# -- e: the outbox relay ------------------------------------------------------


def serve_receiver(port: int) -> None:
    """The HTTP receiver of workload e: answers every request ``200`` with an empty body at once (keep-alive).

    Plain asyncio streams, so that the receiver costs far less per request
    than the client being measured; run in a process of its own
    (``python -m joblane.showcase.bench receive PORT``).
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


SINKS = ("http", "http batch", "nats")


def relay(dsn: str, rows: int = 20_000, *, sink: str = "http", batch_size: int = 500, concurrency: int = 4) -> Result:
    """e: ``rows`` outbox messages delivered by one relay to a local HTTP receiver or NATS JetStream.

    ``sink`` "http": one request per message (HttpSink's default); "http
    batch": ``HttpSink(batch=100)``, a JSON array per request; "nats":
    JetStream, after the bare nats-py client's pipelined publish of as many
    messages of the same size and headers to the same stream (``bare_rate``,
    and the relay's ``ratio`` to it).
    """
    import os
    import subprocess
    import sys
    import uuid

    from ..outbox.relay import Relay

    extra: dict[str, Any] = {}
    with isolated_schema(dsn, new_schema_name("bench")) as schema:
        app = App(dsn, schema=schema)
        cleanup: list[Callable[[], Any]] = []
        try:
            if sink in ("http", "http batch"):
                from ..outbox.sinks import HttpSink

                port = free_port()
                server = subprocess.Popen([sys.executable, "-m", "joblane.showcase.bench", "receive", str(port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
                cleanup.append(lambda: (server.terminate(), server.wait(10)))
                _wait_for_port(port)
                batch = 100 if sink == "http batch" else None
                app.route("bench.", HttpSink(f"http://127.0.0.1:{port}/hook", batch=batch))
            elif sink == "nats":
                from ..outbox.sinks import NatsSink

                stream = f"JLBENCH_{uuid.uuid4().hex[:8].upper()}"
                asyncio.run(_nats_stream(stream, create=True))
                cleanup.append(lambda: asyncio.run(_nats_stream(stream, create=False)))
                app.route("bench.", NatsSink(subject=lambda m: f"{stream.lower()}.{m.id % 16}", stream=stream))
                bare = asyncio.run(_bare_nats(stream, rows))
                extra["bare_rate"] = round(bare, 2)
            else:
                raise ValueError(f"unknown sink {sink!r}")
            q = quote_ident(schema)
            with psycopg.connect(dsn, autocommit=True) as conn:
                subject_prefix = "bench.e"
                conn.execute(
                    f"INSERT INTO {q}.outbox (topic, payload, idempotency_key)"
                    " SELECT %s, jsonb_build_object('i', i), 'bench:' || i FROM generate_series(1, %s) AS i",
                    (subject_prefix, rows))
                conn.execute(sql.SQL("ANALYZE {}.outbox").format(sql.Identifier(schema)))

            async def run() -> tuple[float, float]:
                r = Relay(app, batch_size=batch_size, concurrency=concurrency)
                done = threading.Event()
                finished: list[float] = []
                sql = f"SELECT EXISTS (SELECT 1 FROM {q}.outbox WHERE state = 'pending')"
                watcher = threading.Thread(target=_watch_sql, args=(dsn, sql, done, finished), daemon=True)
                started = time.perf_counter()
                runner = asyncio.create_task(r.run(install_signals=False))
                watcher.start()
                while not finished and not runner.done():
                    await asyncio.sleep(0.01)
                r.request_stop()
                done.set()
                await runner
                if not finished:
                    raise RuntimeError("the relay stopped before delivering every row")
                return started, finished[0]

            started, ended = asyncio.run(run())
        finally:
            for step in cleanup:
                step()
    rate = rows / (ended - started)
    if "bare_rate" in extra:
        extra["ratio"] = round(rate / extra["bare_rate"], 3)
    settings = f"{sink}, batch {batch_size}, {concurrency} batches in flight"
    if sink == "http batch":
        settings = f"http, 100 messages per request, batch {batch_size}, {concurrency} batches in flight"
    return Result("e", settings, rate, "messages/s", extra)


async def _bare_nats(stream: str, rows: int) -> float:
    """nats-py alone: ``rows`` JetStream publishes, pipelined (acks awaited together), messages like the relay's."""
    import nats

    nc = await nats.connect("nats://127.0.0.1:4222")
    try:
        js = nc.jetstream(publish_async_max_pending=4000)
        subject = stream.lower()
        messages = [(f"{subject}.{i % 16}", f'{{"i": {i}}}'.encode(),
                     {"Joblane-Topic": "bench.e", "Nats-Msg-Id": f"bare:{i}"}) for i in range(1, rows + 1)]
        started = time.perf_counter()
        acks = [await js.publish_async(s, body, stream=stream, headers=headers) for s, body, headers in messages]
        await asyncio.gather(*acks)
        return rows / (time.perf_counter() - started)
    finally:
        await nc.close()


def _wait_for_port(port: int, timeout: float = 15.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the benchmark's HTTP receiver did not start on port {port}")


async def _nats_stream(stream: str, *, create: bool) -> None:
    import nats

    nc = await nats.connect("nats://127.0.0.1:4222")
    try:
        js = nc.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        else:
            await js.delete_stream(stream)
    finally:
        await nc.close()


# -- what `joblane bench` runs ------------------------------------------------

PROFILES = {
    "defaults": {"concurrency": 10},
    "best": {"concurrency": 400, "claim_batch": 200},
    # best, with the task lean (App.task(lean=True)): done jobs deleted, no attempts row for a success
    "lean": {"concurrency": 400, "claim_batch": 200, "lean": True},
}


def plan(workloads: tuple[str, ...], profile: str, scale: float,
         jobs: int | None) -> list[tuple[str, str, Callable[[str], Result]]]:
    """The runs of ``workloads`` as (workload, label, run(dsn)); ``jobs`` overrides each one's size."""
    steps: list[tuple[str, str, Callable[[str], Result]]] = []
    for w in workloads:
        if w == "a":
            steps.append(("a", "one transaction each", lambda dsn: enqueue_single(dsn, jobs or int(5000 * scale))))
        elif w == "b":
            # App.enqueue_many of JobSpecs; the task's typed bulk form; the first without the wake-up
            steps.append(("b", "1,000 per call", lambda dsn: enqueue_bulk(dsn, jobs or int(50_000 * scale))))
            steps.append(("b", "1,000 per call, typed", lambda dsn: enqueue_bulk(
                dsn, jobs or int(50_000 * scale), form="typed")))
            steps.append(("b", "1,000 per call, notify off", lambda dsn: enqueue_bulk(
                dsn, jobs or int(50_000 * scale), notify=False)))
        elif w == "c":
            for name in (list(PROFILES) if profile == "all" else [profile]):
                opts = PROFILES[name]
                steps.append(("c", name, lambda dsn, o=opts, n=name: process(
                    dsn, jobs or int(20_000 * scale), label=n, **o)))
        elif w == "d":
            steps.append(("d", "idle worker", lambda dsn: latency(dsn, jobs or max(50, int(500 * scale)))))
        elif w == "e":
            for sink in SINKS:
                # NATS: claims of 1,000 (the relay's batch_size), so the claim and the finish weigh less per message
                size = 1000 if sink == "nats" else 500
                steps.append(("e", sink, lambda dsn, k=sink, n=size: relay(
                    dsn, jobs or int(20_000 * scale), sink=k, batch_size=n)))
        elif w == "f":
            # the claim against a big table: scheduled jobs beside the ready ones, a week of finished history;
            # "no history" is the same run on an empty table, to compare with
            for waiting, history in ((10_000, 0), (1_000_000, 0), (0, 0), (0, 10_000_000)):
                what = (f"{waiting:,} waiting" if waiting else f"{history:,} in history" if history
                        else "no history")
                steps.append(("f", what, lambda dsn, k=waiting, h=history: process(
                    dsn, jobs or int(20_000 * scale), waiting=int(k * scale), history=int(h * scale),
                    label="best", **PROFILES["best"])))
        elif w == "g":
            for notify in (True, False):
                steps.append(("g", f"notify {'on' if notify else 'off'}", lambda dsn, n=notify: concurrent_enqueue(
                    dsn, 8, jobs or int(1000 * scale), notify=n)))
    return steps


# -- one b measurement in a process of its own (benchmarks/run.py) -------------------

B_VARIANTS = {"-": {}, "typed": {"form": "typed"}, "notify off": {"notify": False}}


def main(argv: list[str] | None = None) -> int:
    """``python -m joblane.showcase.bench DSN VARIANT JOBS``: one variant of b, one JSON line.

    benchmarks/run.py measures each of b's variants in a fresh process, as it
    measures the peers: the first measurement of a process runs colder than
    the ones after it, which would favour the variants ``joblane bench -w b``
    runs second and third.

    ``... commit-cost DSN``: the commit cost as one JSON line (benchmarks/run.py);
    ``... receive PORT``: workload e's HTTP receiver.
    """
    import json
    import sys

    argv = list(argv if argv is not None else sys.argv[1:])
    if argv[:1] == ["receive"]:
        serve_receiver(int(argv[1]))
        return 0
    if argv[:1] == ["commit-cost"]:
        print(json.dumps(commit_cost(argv[1])), flush=True)
        return 0
    dsn, variant, jobs = argv
    print(json.dumps(enqueue_bulk(dsn, int(jobs), **B_VARIANTS[variant]).as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
