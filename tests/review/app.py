"""A worker app for the rate-limit tests: queues limited in code, written to the database at worker start."""

from __future__ import annotations

import asyncio
import time

import joblane
from joblane import RetryAfter

app = joblane.App(lease_seconds=10)

# at most 5 starts in any 1-second window, across every worker
app.limit("rated", per_second=5)
# at most 3 running at once in all, and at most 2 per tenant
app.limit("capped", concurrency=3, key="tenant", per_key=2)
# 100 units per 2 seconds; each job reserves its estimate and settles what it really used
app.limit("weighted", cost="100/2s", estimate="estimated_tokens")
# a model API: a 429 pauses the queue for every worker (limited, so the pause is checked in the claim)
app.limit("models", concurrency=8)


@app.task("tick", queue="rated")
async def tick(job: joblane.Job) -> None:
    await asyncio.sleep(0.01)


@app.task("slot", queue="capped")
async def slot(job: joblane.Job) -> None:
    await asyncio.sleep(job.payload.get("seconds", 0.2))


@app.task("call_model", queue="weighted")
async def call_model(job: joblane.Job) -> dict:
    await asyncio.sleep(0.01)
    job.settle(job.payload.get("real_tokens", 10))
    return {"ok": True}


@app.task("model_call", queue="models")
async def model_call(job: joblane.Job) -> None:
    # the provider answers 429 until trip_until: the whole queue should wait
    if time.time() < job.payload.get("trip_until", 0):
        raise RetryAfter(job.payload.get("pause", 1.5), "429 from the provider", pause_queue=True)
    await asyncio.sleep(0.01)
