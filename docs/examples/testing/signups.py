"""The project under test: a signup job that enqueues the welcome email."""

import joblane

app = joblane.App()  # DATABASE_URL, JOBLANE_SCHEMA


@app.task("signup")
def signup(job: joblane.Job) -> None:
    with app.connect() as conn:  # the module-level app: in tests it points at the test's schema
        app.enqueue(conn, "send_welcome", {"email": job.payload["email"]})


@app.task("send_welcome")
def send_welcome(job: joblane.Job) -> dict:
    return {"sent_to": job.payload["email"]}
