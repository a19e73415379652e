"""The overview, jobs search and history at scale: 200,000 jobs and 1,000,000 attempts, read through indexes.

A test-sized version of the measured one (docs/operating.md: 1M jobs, 10M
attempts): it asserts the plans, not the time, so it holds on a busy machine.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re

from ..conftest import table
from ..helpers import run_sql, seq_scanned, uses_index
from joblane.web.data import SEARCH_SLICE

from .test_operate import roll_up

JOBS = 200_000
ATTEMPTS_PER_JOB = 5


def fill(conn, app, jobs: int = JOBS, per_job: int = ATTEMPTS_PER_JOB) -> None:
    """A week of history: finished jobs spread over 7 days in 8 queues and 40 kinds, ``per_job`` tries each,
    a few hundred pending, held and failed ones."""
    j, a = table(app, "jobs"), table(app, "attempts")
    conn.execute(
        f"INSERT INTO {j} (queue, kind, state, attempts, payload, last_error, created_at, finished_at)"
        " SELECT 'q' || (i %% 8), 'k' || (i %% 40), CASE WHEN i %% 100 = 0 THEN 'failed' ELSE 'done' END, %s,"
        "        jsonb_build_object('tenant', 't' || (i %% 500), 'n', i),"
        "        CASE WHEN i %% 100 = 0 THEN 'TimeoutError: model API' END,"
        "        now() - (i::bigint * 604000 / %s) * interval '1 second' - interval '3 seconds',"
        "        now() - (i::bigint * 604000 / %s) * interval '1 second'"
        "   FROM generate_series(1, %s) AS i", (per_job, jobs, jobs, jobs))
    conn.execute(
        f"INSERT INTO {a} (job_id, attempt, outcome, started_at, finished_at)"
        f" SELECT j.id, t, CASE WHEN t < %s THEN 'retry' WHEN j.state = 'failed' THEN 'failed' ELSE 'done' END,"
        "        j.finished_at - interval '2 seconds', j.finished_at"
        f"   FROM {j} AS j CROSS JOIN generate_series(1, %s) AS t", (per_job, per_job))
    conn.execute(f"INSERT INTO {j} (queue, kind, state) SELECT 'q' || (i % 8), 'k1', 'pending'"
                 " FROM generate_series(1, 500) AS i")
    conn.execute(f"INSERT INTO {j} (queue, kind, state) SELECT 'q1', 'k2', 'held' FROM generate_series(1, 50) AS i")
    conn.execute(f"VACUUM ANALYZE {j}")
    conn.execute(f"VACUUM ANALYZE {a}")


def plan(conn, app, name: str, args: list) -> str:
    return "\n".join(r[0] for r in run_sql(conn, "EXPLAIN " + getattr(app.queries, name), args))


def test_pages_read_indexes_at_scale(app, conn, client):
    fill(conn, app)
    asyncio.run(roll_up(app))
    conn.execute(f"ANALYZE {table(app, 'history_attempts')}")
    slices = conn.execute(f"SELECT start, seconds FROM {table(app, 'history_slices')} ORDER BY start").fetchall()
    assert len(slices) >= 166
    rolled = [start for start, _ in slices]
    # as the page reads the week: every slice, and the attempts of the minutes after the last one
    live = [[slices[-1][0] + dt.timedelta(seconds=slices[-1][1])], [dt.datetime.now(dt.timezone.utc)]]
    checks = {
        # the overview
        "dashboard_queue_counts": [], "dashboard_throughput": [60], "dashboard_workers": [8],
        "dashboard_failed_recent": [3600.0], "dashboard_attempt_outcomes": [60.0],
        # the jobs search: newest first, by state, queue, kind, error text, time
        "dashboard_job_id_range": [],
    }
    top = conn.execute(f"SELECT max(id) + 1 FROM {table(app, 'jobs')}").fetchone()[0]
    bottom = top - SEARCH_SLICE  # one slice of the primary key, as the dashboard reads it
    # as Data.search_jobs runs them: an in-flight state (its partial index) in one statement, else a slice
    searches = [[*s, None, 51, None] if s[0] else [*s, top, 51, bottom] for s in (
        [None, None, None, None, None, None, None],
        [["failed"], None, None, None, None, None, None],
        [["held"], None, "q1", None, None, None, None],
        [None, "k7", "q7", None, None, None, None],
        [["failed"], None, None, None, None, None, "timeout"],
        [["failed"], None, None, None, None, '{"tenant": "t7"}', None],
        [None, None, None, None, None, '{"tenant": "t7"}', None],
    )]
    for name, args in [*checks.items(), *(("dashboard_search_jobs", s) for s in searches),
                       ("history_counts", [rolled, *live]),
                       ("history_latency_buckets", [rolled, *live]),
                       ("history_series", [rolled, *live, 3600]),
                       ("history_latency_series", [rolled, *live, 3600]),
                       ("history_first_attempt", [rolled[0]])]:
        text = plan(conn, app, name, args)
        scans = "\n".join(line for line in text.splitlines() if "Scan" in line)
        whole = seq_scanned(text, conn, app.schema, "jobs") + seq_scanned(text, conn, app.schema, "attempts")
        assert not whole, f"{name} scans a big table:\n{scans}"
    # history reads the week from the roll-ups and only the minutes not rolled up from the attempts
    text = plan(conn, app, "history_counts", [rolled, *live])
    assert uses_index(text, conn, app.schema, "attempts_finished"), text
    # and the pages answer with these numbers
    assert client.get("/").status_code == 200
    assert client.get("/jobs?payload=tenant%3Dt7&state=failed").status_code == 200
    html = client.get("/history?window=7d").text
    done = int(re.search(r'id="total-done">([\d,]+)<', html).group(1).replace(",", ""))
    assert done >= JOBS * 0.97
    # the chart of every queue: a bar an hour, the same done in its bars as in the table
    chart = html[html.index('id="history-chart"'):html.index("</svg>", html.index('id="history-chart"'))]
    bars = [int(n.replace(",", "")) for n in re.findall(r": ([\d,]+) done, [\d,]+ failed</title>", chart)]
    assert len(bars) == 168 and sum(bars) == done
