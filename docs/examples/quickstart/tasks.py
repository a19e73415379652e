import os

import joblane
import psycopg

app = joblane.App()  # DATABASE_URL, schema "joblane"


@app.task("welcome", queue="emails", max_attempts=2, backoff=0.5)
def welcome(job: joblane.Job) -> dict:
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        (email,) = conn.execute("SELECT email FROM submissions WHERE id = %s",
                                (job.payload["submission_id"],)).fetchone()
    if "@" not in email:
        raise ValueError(f"cannot send to {email!r}: not an email address")
    return {"sent_to": email}  # stored as the job's result
