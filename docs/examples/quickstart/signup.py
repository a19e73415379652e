import os

import psycopg

from tasks import app

with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS submissions (id bigint PRIMARY KEY, email text NOT NULL)")
    conn.commit()
    for submission_id, email in [(1, "ada@acme.test"), (2, "grace at acme.test")]:
        with conn.transaction():  # the row and its job commit together, or neither exists
            conn.execute("INSERT INTO submissions (id, email) VALUES (%s, %s)", (submission_id, email))
            job_id = app.enqueue(conn, "welcome", {"submission_id": submission_id})
        print(f"submission {submission_id}: job {job_id}")
