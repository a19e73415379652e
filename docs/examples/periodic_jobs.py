"""Periodic jobs: every worker runs the scheduler, and each tick is enqueued once."""

import joblane

app = joblane.App()


@app.periodic(cron="*/5 * * * *", kind="sync_crm")
async def sync_crm(job: joblane.Job) -> None:
    since = job.payload["tick"]  # the tick this run is for, ISO 8601 in UTC
    ...


@app.periodic(cron="0 9 * * mon-fri", kind="daily_digest", timezone="Europe/Paris",
              payload={"team": "sales"}, queue="reports", max_attempts=3)
def daily_digest(job: joblane.Job) -> None:
    ...


@app.periodic(cron="* * * * * */10", kind="heartbeat")  # six fields: the last one is seconds
async def heartbeat(job: joblane.Job) -> None:
    ...
