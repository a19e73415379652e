"""The soak's application: a no-op task, a sink that drops messages, and (as __main__) the producer."""

from __future__ import annotations

import sys
import time

import psycopg

import joblane
from joblane import JobSpec
from joblane.outbox import Delivery, Sink

app = joblane.App()


@app.task("noop", queue="soak")
async def noop(job: joblane.Job) -> None:
    return None


class DropSink(Sink):
    """Accepts every message at once: the soak measures joblane, not a broker."""

    async def send(self, messages):
        return [Delivery.sent() for _ in messages]


app.route("soak.", DropSink())


def produce(rate: float, batch: int, seconds: float) -> None:
    """Commit ``batch`` jobs (and one message per 10 jobs) per transaction, ``rate`` jobs a second, for ``seconds``."""
    interval = batch / rate
    with psycopg.connect(app.dsn) as conn:
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < seconds:
            with conn.transaction():
                app.enqueue_many(conn, [JobSpec("noop", {"n": sent + i}) for i in range(batch)])
                for i in range(batch // 10):
                    app.publish(conn, "soak.done", {"n": sent + i})
            sent += batch
            ahead = started + sent / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            elif -ahead > 5 * interval:
                started = time.monotonic() - sent / rate  # cannot keep the rate: do not burst to catch up


if __name__ == "__main__":
    produce(float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
