"""The held-snapshot benchmark's side for PgQueuer and PGMQ (run with the peers' virtualenv).

    held_snapshot_peer.py pgqueuer install DSN
    held_snapshot_peer.py pgqueuer work DSN                      # the worker at its defaults
    held_snapshot_peer.py pgqueuer produce DSN JOBS_PER_S SECONDS

The same roles for ``pgmq``. Each payload carries the wall time just before
its INSERT (``t``); the handler appends ``start latency`` lines to
``$HELD_OUT/handled``, the producer (two connections, each at half the
rate) its running count to ``$HELD_OUT/produced``, as
benchmarks/held_snapshot_app.py does for joblane.

- PgQueuer: ``Queries.install()``; a ``QueueManager`` on one asyncpg
  connection with batch_size 10 and max_concurrent_tasks 20 (the profile
  ``defaults`` of pgqueuer_bench.py); the producer calls ``Queries.enqueue``,
  one job per transaction.
- PGMQ: installed from the SQL file its client ships; one consumer ``read``s
  10 with a visibility timeout of 30 s, sleeps 10 ms when nothing came, and
  ``delete``s each message (the profile ``defaults`` of pgmq_bench.py); the
  producer calls ``send``, one message per transaction.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402

OUT = os.environ.get("HELD_OUT", ".")
CONNECTIONS = 2  # the producer's connections, each at half the rate (as benchmarks/held_snapshot_app.py)


class Recorder:
    """``start latency`` lines appended by a thread every 0.2 s (the handler only appends to a list)."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(OUT, name)
        self.buffer: list[str] = []
        threading.Thread(target=self.flush_forever, daemon=True).start()

    def add(self, t: float) -> None:
        now = time.time()
        self.buffer.append(f"{now:.4f} {now - t:.4f}\n")

    def flush_forever(self) -> None:
        with open(self.path, "a") as out:
            while True:
                time.sleep(0.2)
                lines, self.buffer = self.buffer, []
                if lines:
                    out.write("".join(lines))
                    out.flush()


async def paced(rate: float, seconds: float, one, counter: list[int]) -> None:
    """Await ``one(n)`` ``rate`` times a second for ``seconds``; behind by more than 0.5 s, drop the debt."""
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        await one(n)
        n += 1
        counter[0] = n
        ahead = started + n / rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
        elif -ahead > 0.5:
            started = time.monotonic() - n / rate


async def produce(rate: float, seconds: float, senders: list) -> None:
    """Each sender (a coroutine function of n, on a connection of its own) at an equal share of ``rate``;
    the total count goes to ``produced`` every 0.2 s."""
    counts = [[0] for _ in senders]
    tasks = [asyncio.create_task(paced(rate / len(senders), seconds, send, c)) for send, c in zip(senders, counts)]
    with open(os.path.join(OUT, "produced"), "a") as out:
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=0.2)
            out.write(f"{time.time():.4f} {sum(c[0] for c in counts)} 0\n")
            out.flush()
    for t in tasks:
        t.result()


# --------------------------------------------------------------------------
# PgQueuer


async def pgqueuer(role: str, dsn: str, args: list[str]) -> None:
    from pgqueuer_bench import ENTRYPOINT, PROFILES, Worker
    from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
    from pgqueuer.adapters.persistence.queries import Queries

    conn = await common.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    if role == "install":
        await queries.install()
    elif role == "produce":
        rate, seconds = float(args[0]), float(args[1])
        senders = []
        for _ in range(CONNECTIONS):
            q = Queries(AsyncpgDriver(await common.connect(dsn)))
            senders.append(lambda n, q=q: q.enqueue(ENTRYPOINT, json.dumps({"t": time.time(), "n": n}).encode()))
        await produce(rate, seconds, senders)
    else:
        handled = Recorder("handled")
        worker = Worker(dsn, PROFILES["defaults"], lambda job: handled.add(json.loads(job.payload)["t"]))
        await worker.start()
        while True:
            worker.check_alive()
            await asyncio.sleep(0.5)
    await conn.close()


# --------------------------------------------------------------------------
# PGMQ


async def pgmq(role: str, dsn: str, args: list[str]) -> None:
    from pgmq.async_queue import PGMQueue
    from pgmq_bench import PROFILES, QUEUE, VT, install

    if role == "install":
        await asyncio.to_thread(install, dsn)
    queue = PGMQueue(conn_string=dsn, init_extension=False, pool_size=CONNECTIONS + 1)
    await queue.init()
    async with queue.pool.acquire() as conn:
        if role == "install":
            await queue.create_queue(QUEUE, conn=conn)
        elif role == "produce":
            rate, seconds = float(args[0]), float(args[1])
            conns = [await queue.pool.acquire() for _ in range(CONNECTIONS)]
            await produce(rate, seconds, [lambda n, c=c: queue.send(QUEUE, {"t": time.time(), "n": n}, conn=c)
                                          for c in conns])
        else:
            handled = Recorder("handled")
            qty = PROFILES["defaults"]["qty"]
            while True:
                messages = await queue.read(QUEUE, vt=VT, qty=qty, conn=conn)
                if not messages:
                    await asyncio.sleep(0.01)
                    continue
                for m in messages:
                    handled.add(m.message["t"])
                    await queue.delete(QUEUE, m.msg_id, conn=conn)
    await queue.close()


def main() -> None:
    system, role, dsn, *rest = sys.argv[1:]
    if role not in ("install", "work", "produce"):
        sys.exit(f"unknown role {role!r}")
    run = {"pgqueuer": pgqueuer, "pgmq": pgmq}[system]
    try:
        asyncio.run(run(role, dsn, rest))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
