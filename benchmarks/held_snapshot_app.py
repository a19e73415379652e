"""The held-snapshot benchmark's joblane side: a no-op task and a dropping sink that record pick-up, and the producer.

    joblane worker benchmarks.held_snapshot_app:app        # the worker, at its defaults
    joblane relay benchmarks.held_snapshot_app:app         # the relay, to a sink in its process
    python -m benchmarks.held_snapshot_app JOBS_PER_S MESSAGES_PER_S SECONDS [CONNECTIONS]   # the producer

Each job's payload and each message's payload carry the wall time just
before its INSERT (``t``); the task and the sink append ``start latency``
lines to ``$HELD_OUT/handled`` and ``$HELD_OUT/sent`` (buffered, written
every 0.2 s), the producer its running counts to ``$HELD_OUT/produced``.
benchmarks/held_snapshot.py reads the three files every 10 s.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import psycopg

import joblane
from joblane.outbox import Delivery, Sink

app = joblane.App()


class Recorder:
    """``start latency`` lines (seconds) appended to a file every 0.2 s by a thread: a handler only appends."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(os.environ.get("HELD_OUT", "."), name)
        self.buffer: list[str] = []
        self.thread: threading.Thread | None = None

    def add(self, t: float) -> None:
        now = time.time()
        self.buffer.append(f"{now:.4f} {now - t:.4f}\n")
        if self.thread is None:
            self.thread = threading.Thread(target=self.flush_forever, daemon=True)
            self.thread.start()

    def flush_forever(self) -> None:
        with open(self.path, "a") as out:
            while True:
                time.sleep(0.2)
                lines, self.buffer = self.buffer, []
                if lines:
                    out.write("".join(lines))
                    out.flush()


handled = Recorder("handled")
sent = Recorder("sent")


@app.task("noop", queue="held")
async def noop(job: joblane.Job) -> None:
    handled.add(job.payload["t"])


class DropSink(Sink):
    """Accepts every message at once and records how long after its INSERT it went out."""

    async def send(self, messages):
        for m in messages:
            sent.add(m.payload["t"])
        return [Delivery.sent() for _ in messages]


app.route("held.", DropSink())


def paced(rate: float, seconds: float, one, counter: list[int]) -> None:
    """Call ``one(n)`` ``rate`` times a second for ``seconds``; behind by more than 0.5 s, drop the debt."""
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        one(n)
        n += 1
        counter[0] = n
        ahead = started + n / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        elif -ahead > 0.5:
            started = time.monotonic() - n / rate


def produce(jobs_per_s: float, messages_per_s: float, seconds: float, connections: int = 2) -> None:
    """One job per transaction at ``jobs_per_s`` from ``connections`` connections (each a share of the rate);
    one outbox message per transaction at ``messages_per_s`` on a connection of its own.

    One connection alone would be bound by the commit's round trip: when
    other work on the machine makes a WAL flush take 1 ms, it cannot offer
    1,000 jobs a second.
    """
    job_counts = [[0] for _ in range(connections)]
    message_count = [0]

    def jobs(counter: list[int]) -> None:
        with psycopg.connect(app.dsn, autocommit=True) as conn:
            paced(jobs_per_s / connections, seconds,
                  lambda n: app.enqueue(conn, "noop", {"t": time.time(), "n": n}), counter)

    def messages() -> None:
        with psycopg.connect(app.dsn, autocommit=True) as conn:
            paced(messages_per_s, seconds, lambda n: app.publish(conn, "held.m", {"t": time.time(), "n": n}),
                  message_count)

    threads = [threading.Thread(target=jobs, args=(c,), daemon=True) for c in job_counts]
    if messages_per_s > 0:
        threads.append(threading.Thread(target=messages, daemon=True))
    for t in threads:
        t.start()
    path = os.path.join(os.environ.get("HELD_OUT", "."), "produced")
    with open(path, "a") as out:
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
            out.write(f"{time.time():.4f} {sum(c[0] for c in job_counts)} {message_count[0]}\n")
            out.flush()


if __name__ == "__main__":
    produce(float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 2)
