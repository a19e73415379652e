"""The tasks a spawned worker runs in the browser tests (its schema comes from JOBLANE_SCHEMA)."""

from __future__ import annotations

import joblane


def register(app: joblane.App) -> joblane.App:
    """Register the test tasks on ``app``; the tests' own App gets them too, so enqueue picks their queue."""

    @app.task("classify", queue="leads", max_attempts=1)
    async def classify(job: joblane.Job) -> dict:
        job.record(model="small-1", prompt_version=job.payload.get("prompt_version", "v1"), tokens_in=42)
        if job.payload.get("fail_first") and job.attempt == 1:
            raise joblane.PermanentError("model answered with malformed JSON")
        return {"label": "hot"}

    return app


app = register(joblane.App(lease_seconds=5))
