"""A worker app with one periodic task, for the multi-process scheduler test."""

from __future__ import annotations

import os

import joblane

app = joblane.App()


@app.periodic(cron=os.environ.get("TEST_CRON", "* * * * * *"), kind="tick")
async def tick(job: joblane.Job) -> dict:
    return {"tick": job.payload["tick"]}
