"""A worker app for the AI-workflow tests: a spend cap declared in code, a cached model step."""

from __future__ import annotations

import asyncio
import json
import os
import time

import joblane

app = joblane.App(lease_seconds=10)

# at most 0.5 per tenant per 2-second window, all workers together (the daily budget below keeps the pruner
# from removing ended 2-second windows for a day: test_budgets reads them all)
app.budget("spend", queue="metered", cap=0.5, window="2s", key="tenant", estimate="estimated_cost")


# a model provider's queue, limits and spend caps together (docs/ai-workflows.md, smaller): at most 12 starts
# a minute, 4 running, 2 per tenant, and 0.3 per tenant per day, all workers together
app.limit("openai", per_minute=12, concurrency=4, key="tenant", per_key=2)
app.budget("openai-daily", queue="openai", per_day=0.3, key="tenant")


def _note(event: dict) -> None:
    """One line of the outside record ($AI_RUNS): what a task did, written by the task itself."""
    fd = os.open(os.environ["AI_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


@app.task("chat", queue="openai", max_attempts=20)
async def chat(job: joblane.Job) -> None:
    run = {"job": job.id, "attempt": job.attempt, "pid": os.getpid(), "tenant": job.payload["tenant"]}
    _note({"event": "start", "t": time.time(), **run})
    await asyncio.sleep(job.payload.get("seconds", 1.0))
    job.record(model="stand-in", cost=job.payload["real_cost"])
    _note({"event": "end", "t": time.time(), "cost": job.payload["real_cost"], **run})


@app.task("metered_call", queue="metered")
async def metered_call(job: joblane.Job) -> dict:
    await asyncio.sleep(0.05)
    job.record(model="stand-in", cost=job.payload["real_cost"])  # what the call really cost
    return {"ok": True}


def _count_call(text: str) -> dict:
    """A stand-in model call that counts itself: one line per call in $MODEL_CALLS."""
    with open(os.environ["MODEL_CALLS"], "a") as f:
        f.write(text + "\n")
    return {"label": "hot" if "buy" in text else "cold"}


@app.task("classify", queue="cached")
async def classify(job: joblane.Job) -> dict:
    job.record(model="stand-in", prompt_version="v1")

    async def call(text: str) -> dict:
        await asyncio.sleep(job.payload.get("seconds", 0.5))  # long enough for the jobs to race
        label = _count_call(text)
        job.record(tokens=120, cost=0.002)
        return label

    return await job.step("classify", call, job.payload["text"], cache=True, ttl="7d")
