"""The attempt audit trail: what tasks record lands in attempts; list, export (streamed), and index use."""

from __future__ import annotations

import csv
import io
import json

import joblane
from joblane.testing import drain

from .helpers import cli_json, rows, run_cli
from ..helpers import run_sql, seq_scanned, uses_index


async def _two_models(app, conn) -> list[int]:
    @app.task("classify", max_attempts=2, backoff=lambda attempt: 0.0)
    async def classify(job: joblane.Job):
        model = "small-1" if job.payload["n"] % 2 else "large-2"
        job.record(model=model, prompt_version="v3", tokens_in=100 + job.payload["n"], tokens_out=7, cost=0.0002)
        if job.payload["n"] == 3 and job.attempt == 1:
            raise TimeoutError("model timed out")
        return {"label": "hot"}

    ids = [app.enqueue(conn, "classify", {"n": n}) for n in range(5)]
    app.declare("other")  # enqueued here, run elsewhere
    app.enqueue(conn, "other", {"n": 99}, held=True)
    await drain(app)
    return ids


async def test_recorded_metadata_lands_in_attempts_and_filters_find_it(app, conn):
    ids = await _two_models(app, conn)
    audit = rows(conn, app, "SELECT job_id, attempt, outcome, meta FROM {attempts} ORDER BY id")
    assert len(audit) == 6  # five jobs, one of them tried twice
    by_job = {(a["job_id"], a["attempt"]): a for a in audit}
    first = by_job[(ids[1], 1)]
    assert first["outcome"] == "done"
    assert first["meta"] == {"model": "small-1", "prompt_version": "v3", "tokens_in": 101, "tokens_out": 7,
                             "cost": 0.0002}
    assert by_job[(ids[3], 1)]["outcome"] == "retry" and by_job[(ids[3], 2)]["outcome"] == "done"

    small = app.list_attempts(model="small-1")
    assert sorted((a["job_id"], a["attempt"]) for a in small) == [(ids[1], 1), (ids[3], 1), (ids[3], 2)]
    assert all(a["kind"] == "classify" and a["job_state"] == "done" for a in small)
    [retry] = app.list_attempts(outcome="retry", since="1h")
    assert retry["job_id"] == ids[3] and "traceback" not in retry["meta"]
    assert app.list_attempts(kind="classify", since="2h", limit=2)[0]["id"] > app.list_attempts(kind="classify")[-1]["id"]
    page = app.list_attempts(kind="classify", limit=4)
    rest = app.list_attempts(kind="classify", before_id=page[-1]["id"])
    assert len(page) + len(rest) == 6 and page[-1]["id"] > rest[0]["id"]
    assert cli_json(app, "attempts", "--job", str(ids[3]))[0]["attempt"] == 2
    table = run_cli(app, "attempts", "--model", "large-2")
    assert table.exit_code == 0 and "large-2" in table.stdout
    bad = run_cli(app, "attempts", "--since", "last tuesday")
    assert bad.exit_code == 1 and "since must be a duration ago" in bad.stderr


async def test_export_writes_one_line_per_attempt_with_the_jobs_state(app, conn, tmp_path):
    ids = await _two_models(app, conn)
    out = tmp_path / "eval.csv"
    result = run_cli(app, "attempts", "export", "--kind", "classify", "--since", "24h", "--format", "csv",
                     "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "wrote 6 attempts" in result.stdout
    records = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(records) == 6
    assert {(int(r["job_id"]), int(r["attempt"])) for r in records} == \
        {(i, 1) for i in ids} | {(ids[3], 2)}
    retried = [r for r in records if int(r["job_id"]) == ids[3]]
    assert [(r["outcome"], r["job_state"], r["model"]) for r in retried] == [("retry", "done", "small-1"),
                                                                              ("done", "done", "small-1")]
    assert retried[0]["error"] == "TimeoutError: model timed out" and float(retried[0]["latency_ms"]) >= 0
    assert json.loads(records[0]["meta"])["prompt_version"] == "v3" and records[0]["tokens_in"]
    assert not (tmp_path / "eval.csv.partial").exists()

    lines = run_cli(app, "attempts", "export", "--kind", "classify", "--model", "large-2", "--format", "jsonl")
    assert lines.exit_code == 0, lines.output
    docs = [json.loads(line) for line in lines.stdout.splitlines()]
    assert len(docs) == 3 and {d["meta"]["model"] for d in docs} == {"large-2"} and docs[0]["job_state"] == "done"
    assert docs == sorted(docs, key=lambda d: (d["finished_at"], d["id"]))


def test_export_streams_through_a_server_side_cursor(app, conn):
    conn.execute(
        f'INSERT INTO "{app.schema}".attempts (job_id, attempt, outcome, finished_at)'
        " SELECT i, 1, 'done', now() - i * interval '1 second' FROM generate_series(1, 5000) AS i")
    exported = app.export_attempts(conn, page_size=500)
    first = next(exported)
    # the rows come from a cursor held open on the server, a page at a time
    assert conn.execute("SELECT name FROM pg_cursors").fetchall() == [("joblane_export_attempts",)]
    assert first["job_id"] == 5000 and first["job_state"] is None
    assert 1 + sum(1 for _ in exported) == 5000
    assert conn.execute("SELECT count(*) FROM pg_cursors").fetchone()[0] == 0


def test_export_and_filters_use_the_indexes(app, conn):
    """With a few thousand attempts, the export's time range, model and outcome filters read their indexes."""
    conn.execute(
        f"""INSERT INTO "{app.schema}".jobs (kind, state, payload, finished_at)
            SELECT (ARRAY['classify', 'extract', 'summarise'])[1 + i % 3], 'done', '{{}}',
                   now() - (i % 720) * interval '1 hour'
              FROM generate_series(1, 3000) AS i""")
    conn.execute(
        f"""INSERT INTO "{app.schema}".attempts (job_id, attempt, started_at, finished_at, outcome, meta)
            SELECT j.id, a, j.finished_at - interval '2 seconds', j.finished_at - (2 - a) * interval '1 second',
                   CASE WHEN a = 1 AND j.id % 5 = 0 THEN 'retry' ELSE 'done' END,
                   CASE WHEN j.id % 2 = 0 THEN jsonb_build_object('model', 'm' || (j.id % 7), 'tokens_in', 100)
                        ELSE '{{}}'::jsonb END
              FROM "{app.schema}".jobs AS j, generate_series(1, 2) AS a""")
    conn.execute(f'ANALYZE "{app.schema}".jobs')
    conn.execute(f'ANALYZE "{app.schema}".attempts')

    def plan(kind=None, outcome=None, model=None, since=None):
        # the export runs as a cursor, planned to return its first rows early: explain exactly that
        args = [kind, None, outcome, model, since, None]
        sql = "EXPLAIN DECLARE export CURSOR FOR " + app.queries.export_attempts
        return "\n".join(r[0] for r in run_sql(conn, sql, args))

    since = conn.execute("SELECT now() - interval '24 hours'").fetchone()[0]
    def whole(text, *tables):  # attempts is partitioned: what of it holds rows
        return [name for t in tables for name in seq_scanned(text, conn, app.schema, t)]

    text = plan(kind="classify", since=since)
    assert uses_index(text, conn, app.schema, "attempts_finished") and "jobs_pkey" in text, text
    assert not whole(text, "attempts", "jobs"), text
    text = plan(model="m3")
    assert uses_index(text, conn, app.schema, "attempts_model") and not whole(text, "attempts"), text
    text = plan(outcome="retry", since=since)
    assert uses_index(text, conn, app.schema, "attempts_outcome") and not whole(text, "attempts"), text
    listed = "\n".join(r[0] for r in run_sql(conn, "EXPLAIN " + app.queries.list_attempts,
                                                 [None, None, None, "m3", None, None, None, None, 50]))
    assert not whole(listed, "attempts"), listed
