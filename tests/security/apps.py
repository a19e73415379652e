"""A small app for the least-privilege tests: its tasks touch nothing but joblane's own tables."""

from __future__ import annotations

import os

import joblane

app = joblane.App()


@app.task("echo", max_attempts=3)
async def echo(job: joblane.Job) -> dict:
    doubled = await job.step("double", lambda n: n * 2, job.payload.get("i", 0))  # a checkpointed step
    return {"echo": job.payload, "doubled": doubled}


@app.task("refuse", max_attempts=3)
async def refuse(job: joblane.Job) -> None:
    raise joblane.PermanentError("refused on purpose")


@app.task("review")
async def review(job: joblane.Job) -> None:
    raise joblane.Hold("a person decides")


# a rate-limited queue, a queue pause and a periodic schedule: worker-side tables the worker role writes
app.limit("limited", per_second=50, concurrency=2)


@app.task("limited", queue="limited")
async def limited(job: joblane.Job) -> None:
    return None


_paused: set[int] = set()


@app.task("pauses", queue="pausable")
async def pauses(job: joblane.Job) -> None:
    if job.id not in _paused:  # the first run meets a 429 that pauses its whole queue briefly
        _paused.add(job.id)
        raise joblane.RetryAfter(0.2, "429 from the model API", pause_queue=True)


@app.periodic(cron="* * * * * *", kind="tick")
async def tick(job: joblane.Job) -> None:
    return None


# outbox rows under "t." go to a file (the relay under the worker role delivers them)
from tests.chaos.relay_app import AppendSink  # noqa: E402

app.route("t.", AppendSink(os.environ.get("SECURITY_SINK", os.devnull), refuse=0.0))
