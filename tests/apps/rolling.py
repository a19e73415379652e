"""The next version of tests.apps.runs: the same tasks plus one the old workers do not know (rolling deploys)."""

from __future__ import annotations

import os

import joblane

from .runs import record_run

app = joblane.App(lease_seconds=float(os.environ.get("TEST_LEASE", "30")))


@app.task("record")
async def record(job: joblane.Job) -> None:
    await record_run(job)


@app.task("added_later")
async def added_later(job: joblane.Job) -> None:
    await record_run(job)
