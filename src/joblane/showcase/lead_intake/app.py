"""The lead-intake App: three tasks, the nightly re-classification, and one outbox route.

    joblane worker joblane.showcase.lead_intake.app:app    # enrich, classify, deliver; reclassify, nightly_digest
    joblane relay joblane.showcase.lead_intake.app:app     # crm.* -> the CRM, with read-back

Each step writes its result, enqueues the next step and marks its own job
done in ONE transaction (``complete_job_async``): commit, and all three
happened; crash before, and none did, so the step simply runs again.

At night the decided leads are asked about again (``start_nightly``): one
``reclassify`` job per lead in a batch, whose callback ``nightly_digest``
summarises the answers and then waits, holding no worker, for a manager's
sign-off (``joblane signal digest-approved:BATCH``) before it writes the digest.
"""

from __future__ import annotations

import asyncio

import joblane

from . import db, enrichment, model
from .crm import CrmSink, contact_payload
from .settings import load

settings = load()
app = joblane.App()
app.route("crm.", CrmSink(settings.crm_url))


def _schema() -> str:
    return app.schema


@app.task("enrich", queue="leads", max_attempts=5)
async def enrich(job: joblane.Job) -> None:
    lead_id = job.payload["lead_id"]
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn, conn.transaction():
        lead = await db.one(conn, "get", _schema(), lead_id)
        if lead is None:
            raise joblane.PermanentError(f"lead {lead_id} does not exist")
        try:
            data = enrichment.enrich(lead["email"], lead["company"])
        except enrichment.NotALead as exc:
            raise joblane.PermanentError(str(exc)) from None
        next_id = await app.enqueue_async(conn, "classify", {"lead_id": lead_id})
        await db.one(conn, "enriched", _schema(), db.as_json(data), next_id, lead_id)
        await app.complete_job_async(conn, job, data)


@app.task("classify", queue="model", max_attempts=8, backoff=0.5)
async def classify(job: joblane.Job) -> None:
    lead_id = job.payload["lead_id"]
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn:
        lead = await db.one(conn, "get", _schema(), lead_id)
    decision = job.payload.get("decision")  # set by a reviewer: joblane release ID --set decision=qualified
    if decision is not None:
        if decision not in ("qualified", "not_qualified"):
            raise joblane.PermanentError(f"decision must be qualified or not_qualified, got {decision!r}")
        classification = {**(lead["classification"] or {}), "label": decision, "decided_by": "reviewer"}
    elif lead["status"] == "review" and await _released(job):
        # released without a decision: the reviewer accepts the model's answer, no second call
        classification = {**lead["classification"], "decided_by": "reviewer"}
    else:
        classification = await _ask_model(job, lead)
        if classification["confidence"] < settings.min_confidence:
            async with pool.connection() as conn:
                await db.one(conn, "review", _schema(), db.as_json(classification), lead_id)
            raise joblane.Hold(
                f"confidence {classification['confidence']:.2f} is below {settings.min_confidence:g}",
                # what the reviewer sees: `joblane release ID` accepts the suggestion,
                # `joblane release ID --set decision=qualified` (or not_qualified) overrides it
                {"suggestion": classification["label"], "intent": classification["intent"],
                 "fit": classification["fit"], "lead": lead["email"], "message": lead["message"][:200]},
            )
    async with pool.connection() as conn, conn.transaction():
        next_id = await app.enqueue_async(conn, "deliver", {"lead_id": lead_id})
        await db.one(conn, "classified", _schema(), db.as_json(classification), next_id, lead_id)
        await app.complete_job_async(conn, job, classification)


async def _ask_model(job: joblane.Job, lead: dict) -> dict:
    job.record(model=settings.model, prompt_version=settings.prompt_version)
    try:
        answer = await model.classify(model.client(), settings, lead, lead["enrichment"])
    except model.RateLimited as exc:
        job.record(status=429)
        raise joblane.RetryAfter(exc.retry_after, str(exc)) from None  # not an attempt spent
    except model.ModelUnavailable:
        job.record(status=503)
        raise  # retried with backoff, spending an attempt
    except model.BadAnswer as exc:
        job.record(status=200)
        raise joblane.PermanentError(str(exc)) from None
    job.record(model=answer.model, status=200, tokens_in=answer.tokens_in, tokens_out=answer.tokens_out,
               latency_ms=answer.latency_ms)
    qualified = answer.intent == "buying" and answer.fit in ("high", "medium")
    return {"label": "qualified" if qualified else "not_qualified", "intent": answer.intent, "fit": answer.fit,
            "confidence": answer.confidence, "reason": answer.reason, "model": answer.model,
            "prompt_version": settings.prompt_version, "decided_by": "model"}


async def _released(job: joblane.Job) -> bool:
    """Whether a person released this job from review (the audit trail says so)."""
    found = await asyncio.to_thread(app.get_job, job.id)
    return any(a["outcome"] == "released" for a in (found or {}).get("attempt_rows", []))


@app.task("reclassify", queue="model", max_attempts=8, backoff=0.5)
async def reclassify(job: joblane.Job) -> dict:
    """Nightly: ask the model again about a decided lead; the answer is the job's result (the lead is not changed)."""
    lead_id = job.payload["lead_id"]
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn:
        lead = await db.one(conn, "get", _schema(), lead_id)
    answer = await _ask_model(job, lead)
    was = (lead["classification"] or {}).get("label")
    return {"lead_id": lead_id, "label": answer["label"], "was": was, "changed": answer["label"] != was}


async def start_nightly(conn, lead_ids: list[int]) -> joblane.Batch:
    """The nightly batch on ``conn`` (psycopg async or asyncpg), in the caller's transaction: sealed at once."""
    batch = await app.batch_async(conn, name="nightly re-classification", on_complete=("nightly_digest", {}))
    await batch.enqueue_many_async(conn, [("reclassify", {"lead_id": i}) for i in lead_ids])
    await batch.seal_async(conn)
    return batch


@app.task("nightly_digest", queue="leads", max_attempts=5)
async def nightly_digest(job: joblane.Job) -> None:
    """The batch's callback: summarise its answers once, wait for a manager's sign-off, write the digest."""
    batch = job.payload["batch"]
    summary = await job.step("summarise", _summarise, batch)
    approval = await job.wait_for(f"digest-approved:{batch['id']}", timeout=7 * 86400, on_timeout="fail")
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn, conn.transaction():
        await db.one(conn, "digest", _schema(), batch["id"], db.as_json(summary), approval.get("by", "?"))
        await app.complete_job_async(conn, job, {**summary, "approved_by": approval.get("by", "?")})


async def _summarise(batch: dict) -> dict:
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn:
        answers = [r["result"] for r in await db.rows(conn, "batch_results", _schema(), batch["id"])]
    return {"leads": batch["total"], "answered": batch["done"], "failed": batch["failed"],
            "failed_jobs": batch["failed_ids"], "changed": sorted(a["lead_id"] for a in answers if a["changed"])}


@app.task("deliver", queue="leads", max_attempts=5)
async def deliver(job: joblane.Job) -> None:
    lead_id = job.payload["lead_id"]
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn, conn.transaction():
        lead = await db.one(conn, "get", _schema(), lead_id)
        label = lead["classification"]["label"]
        # guarded on status = 'classified': a re-run never publishes the lead twice
        if await db.one(conn, "decided", _schema(), label, lead_id) and label == "qualified":
            key = f"lead-{lead_id}"
            await app.publish_async(conn, "crm.lead_qualified",
                                    contact_payload(lead, lead["enrichment"], lead["classification"], key),
                                    key=key, idempotency_key=key)
        await app.complete_job_async(conn, job, {"status": label})


# -- what `joblane demo` shows after the leads settle: a spend cap, a cached call, a replay compared --------

SCORE_PRICE = 0.001  # what the demo counts for one model call
# at most 0.004 per tenant per day, for every worker: the demo's tenant reaches it, then the cap is raised
app.budget("ai-spend", queue="ai", per_day=0.004, key="tenant", estimate="estimated_cost")


@app.task("score", queue="ai", max_attempts=5, backoff=0.5)
async def score(job: joblane.Job) -> dict:
    """Score a lead for a sales dashboard; the model call is cached, so scoring a lead twice pays once."""
    version = job.payload.get("prompt_version", "score-v1")
    pool = await db.pool(app.dsn)
    async with pool.connection() as conn:
        lead = await db.one(conn, "get", _schema(), job.payload["lead_id"])
    if lead is None or lead["enrichment"] is None:
        raise joblane.PermanentError(f"lead {job.payload['lead_id']} has no enrichment to score")
    job.record(model=settings.model, prompt_version=version)

    async def call(message: str) -> dict:
        try:
            answer = await model.classify(model.client(), settings, lead, lead["enrichment"])
        except model.RateLimited as exc:
            job.record(cost=0.0)  # a 429 is not billed: the spend cap counts nothing for this try
            raise joblane.RetryAfter(exc.retry_after, str(exc)) from None
        except model.BadAnswer as exc:
            raise joblane.PermanentError(str(exc)) from None
        job.record(tokens_in=answer.tokens_in, tokens_out=answer.tokens_out, cost=SCORE_PRICE)
        return {"intent": answer.intent, "fit": answer.fit, "confidence": answer.confidence}

    scored = await job.step("score", call, model.user_message(lead, lead["enrichment"]), cache=True, ttl="1d")
    job.record(cost=job.meta.get("cost", 0.0))  # a cache hit made no call: it cost nothing
    if version == "score-v1" and scored["confidence"] < 0.8:
        raise joblane.PermanentError(f"score-v1 trusts only sure answers (confidence {scored['confidence']})")
    return {**scored, "prompt_version": version}
