"""What people read: log lines in words, tables that keep words whole in a pipe, one-line errors, --json everywhere."""

from __future__ import annotations

import asyncio
import logging

from joblane.rules import plural, tally
from joblane.worker import Worker

from .conftest import count


async def test_a_stopping_worker_counts_in_words(app, conn, caplog):
    @app.task("quick")
    async def quick(job):
        return None

    @app.task("slow")
    async def slow(job):
        await asyncio.sleep(30)

    app.enqueue(conn, "quick", {})
    app.enqueue(conn, "slow", {})
    worker = Worker(app, poll_interval=0.05, grace_seconds=0.2, listen=False)
    with caplog.at_level(logging.INFO, logger="joblane.worker"):
        runner = asyncio.create_task(worker.run(install_signals=False))
        for _ in range(200):
            if count(conn, app, "state = 'done'") == 1 and count(conn, app, "state = 'running'") == 1:
                break
            await asyncio.sleep(0.05)
        worker.request_stop()
        await runner
    said = [r.getMessage() for r in caplog.records if r.name == "joblane.worker"]
    assert "giving back 1 job that did not finish within the grace period" in said
    [stopped] = [line for line in said if " stopped: " in line]
    assert stopped.split(" stopped: ")[1].startswith("1 done"), stopped
    assert "{" not in stopped


def test_plural_and_tally():
    assert plural(1, "job") == "1 job" and plural(2, "batch") == "2 batches"
    assert tally({"done": 7, "retry": 1, "stale": 0, "loop_stalled_seconds": 2.25}) == \
        "7 done, 1 retry, 2.2 loop stalled seconds"
    assert tally({}, "no jobs run") == "no jobs run"
