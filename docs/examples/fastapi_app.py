"""A FastAPI service: a lead and the job that enriches it are written in one transaction."""

from fastapi import FastAPI, Request
from pydantic import BaseModel

import joblane
from joblane.integrations.asgi import lifespan

jobs = joblane.App()  # DATABASE_URL; joblane's tables in schema "joblane" (`joblane migrate`)


@jobs.task("enrich_lead", queue="leads")
async def enrich_lead(job: joblane.Job) -> dict:
    # call the enrichment API here; raise joblane.RetryAfter(30) on a 429
    return {"lead_id": job.payload["lead_id"], "company": "Acme"}


# worker=True runs the worker inside this process; in production run `joblane worker app:jobs` apart
api = FastAPI(lifespan=lifespan(jobs, worker=True, poll_interval=0.2))


class Lead(BaseModel):
    email: str


@api.post("/leads", status_code=201)
async def create_lead(lead: Lead, request: Request) -> dict:
    async with request.state.joblane_pool.acquire() as conn, conn.transaction():
        lead_id = await conn.fetchval("INSERT INTO leads (email) VALUES ($1) RETURNING id", lead.email)
        job_id = await jobs.enqueue_async(conn, "enrich_lead", {"lead_id": lead_id})
    return {"lead": lead_id, "job": job_id}
