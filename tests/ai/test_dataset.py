"""The dataset export: one record per finished try with its review label, streamed in constant memory."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import joblane
from joblane import Hold, JobSpec
from joblane.testing import drain

from ..review.helpers import run_cli
from .helpers import rows


async def test_each_finished_try_is_a_record_with_its_usage_outcome_and_review_label(app, conn, tmp_path):
    @app.task("classify", queue="ai", max_attempts=2, backoff=lambda attempt: 0.0)
    async def classify(job: joblane.Job):
        job.record(model="small-1", prompt_version="v3", input_tokens=100, output_tokens=20, cost=0.004)
        await job.step("label", lambda text: {"label": "hot" if "buy" in text else "cold"}, job.payload["text"])
        if job.payload.get("unsure") and not job.payload.get("approved"):
            raise Hold("low confidence", data={"draft": "maybe hot"})
        if job.payload.get("broken"):
            raise RuntimeError("model returned garbage")
        return {"label": "hot"}

    sure = app.enqueue(conn, "classify", {"text": "buy now"})
    edited = app.enqueue(conn, "classify", {"text": "hmm", "unsure": True, "tone": "warm"})
    rejected = app.enqueue(conn, "classify", {"text": "spam", "unsure": True})
    broken = app.enqueue(conn, "classify", {"text": "x", "broken": True})
    @app.task("other", queue="ai")
    async def other(job: joblane.Job):
        return None

    app.enqueue(conn, "other", {"text": "not this kind"})
    await drain(app, timeout=20)
    app.release(conn, edited, {"approved": True, "tone": "formal"}, actor="ana", note="fixed the tone")
    app.reject(conn, rejected, "spam, not a lead", actor="bo")
    await drain(app, timeout=20)

    records = list(app.dataset(kind="classify"))
    assert {r["kind"] for r in records} == {"classify"}
    by_try = {(r["job_id"], r["attempt"]): r for r in records}
    # sure: done; edited: held then done; rejected: held; broken: two failed tries (retry, failed)
    assert sorted(by_try) == sorted([(sure, 1), (edited, 1), (edited, 2), (rejected, 1), (broken, 1), (broken, 2)])
    first = by_try[(sure, 1)]
    assert (first["outcome"], first["model"], first["prompt_version"], first["tokens"], first["cost"]) == \
        ("done", "small-1", "v3", 120.0, 0.004)
    assert first["input"] == {"text": "buy now"} and first["output"] == {"label": "hot"}
    assert first["steps"] == {"label": {"label": "hot"}} and first["latency_ms"] >= 0 and first["label"] is None
    held = by_try[(edited, 1)]
    assert held["outcome"] == "held" and held["output"] == {"draft": "maybe hot"}
    assert (held["label"], held["reviewer"], held["review_note"], held["review_edit"]) == \
        ("approve_edited", "ana", "fixed the tone", {"approved": True, "tone": "formal"})
    assert by_try[(edited, 2)]["outcome"] == "done" and by_try[(edited, 2)]["label"] is None
    assert (by_try[(rejected, 1)]["label"], by_try[(rejected, 1)]["reviewer"],
            by_try[(rejected, 1)]["review_note"]) == ("reject", "bo", "spam, not a lead")
    assert [by_try[(broken, i)]["outcome"] for i in (1, 2)] == ["retry", "failed"]
    assert by_try[(broken, 2)]["error"].startswith("gave up after 2 attempts")

    result = run_cli(app, "dataset", "export", "--kind", "classify", "--since", "1h")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.exit_code == 0 and len(lines) == 6 and {r["job_id"] for r in lines} == {sure, edited, rejected, broken}
    result = run_cli(app, "dataset", "export", "--kind", "classify", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    [row] = [r for r in table if r["job_id"] == str(sure)]  # tries come in the order they finished
    assert len(table) == 6 and json.loads(row["input"]) == {"text": "buy now"} and row["cost"] == "0.004"
    for args, message in [
        (["--since", "soon"], "since"),
        (["--format", "parquet"], "--format parquet writes a file: give --output"),
    ]:
        result = run_cli(app, "dataset", "export", *args)
        assert result.exit_code == 1 and message in result.stderr, result.output
        assert "\n" not in result.stderr.strip()
    try:
        import pyarrow.parquet as pq
    except ImportError:
        result = run_cli(app, "dataset", "export", "--format", "parquet", "-o", os.devnull + ".parquet")
        assert result.exit_code == 1 and "needs the parquet extra: pip install " in result.stderr
        assert "[parquet]'" in result.stderr
    else:
        path = str(tmp_path / "tries.parquet")
        result = run_cli(app, "dataset", "export", "--kind", "classify", "--format", "parquet", "-o", path)
        assert result.exit_code == 0 and "wrote 6 records" in result.stdout, result.output
        table = pq.read_table(path).to_pylist()
        assert [(r["job_id"], r["attempt"]) for r in table] == [(r["job_id"], r["attempt"]) for r in records]
        assert json.loads(table[0]["input"]) == {"text": "buy now"} and table[0]["cost"] == 0.004
        assert {r["label"] for r in table} == {None, "approve_edited", "reject"}


async def test_each_try_of_an_edited_job_is_exported_with_the_input_it_ran_on(app, conn):
    """A reviewer's edit changes the job's payload in place; the record of each try holds what that try saw."""
    @app.task("draft", queue="ai", max_attempts=5)
    async def draft(job: joblane.Job):
        if not job.payload.get("approved"):
            raise Hold("check the name", data={"draft": f"Dear {job.payload['text']}"})
        return {"sent": job.payload["text"]}

    job_id = app.enqueue(conn, "draft", {"text": "prestige?", "lang": "en"})
    await drain(app, timeout=20)
    app.release(conn, job_id, {"text": "Prestige", "tone": "warm"}, actor="ana")
    await drain(app, timeout=20)
    app.release(conn, job_id, {"text": "Prestige Worldwide", "approved": True}, actor="bo")
    await drain(app, timeout=20)

    records = {r["attempt"]: r for r in app.dataset(kind="draft")}
    assert sorted(records) == [1, 2, 3]
    assert records[1]["input"] == {"text": "prestige?", "lang": "en"}
    assert records[1]["output"] == {"draft": "Dear prestige?"}
    assert (records[1]["label"], records[1]["review_edit"]) == ("approve_edited", {"text": "Prestige", "tone": "warm"})
    assert records[2]["input"] == {"text": "Prestige", "lang": "en", "tone": "warm"}
    assert records[2]["output"] == {"draft": "Dear Prestige"}
    assert (records[2]["label"], records[2]["review_edit"]) == \
        ("approve_edited", {"text": "Prestige Worldwide", "approved": True})
    assert records[3]["input"] == {"text": "Prestige Worldwide", "lang": "en", "tone": "warm", "approved": True}
    assert (records[3]["output"], records[3]["label"]) == ({"sent": "Prestige Worldwide"}, None)
    result = run_cli(app, "dataset", "export", "--kind", "draft", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [json.loads(r["input"])["text"] for r in table] == ["prestige?", "Prestige", "Prestige Worldwide"]
    assert "edits" not in table[0]


def _fabricate_tries(conn, app, kind: str, n: int) -> None:
    """``n`` finished jobs of ``kind`` with one done try each, ~1 kB of payload and meta apiece, in two statements."""
    jobs = f'"{app.schema}".jobs'
    attempts = f'"{app.schema}".attempts'
    conn.execute(
        f"INSERT INTO {jobs} (queue, kind, payload, state, attempts, result, finished_at)"
        f" SELECT 'ai', %s, jsonb_build_object('text', repeat(md5(i::text), 16), 'i', i), 'done', 1,"
        f"        jsonb_build_object('label', 'hot'), now() FROM generate_series(1, %s) AS i", (kind, n))
    conn.execute(
        f"INSERT INTO {attempts} (job_id, attempt, worker, started_at, finished_at, outcome, meta)"
        f" SELECT id, 1, 'w', now() - interval '1 second', now(), 'done',"
        f"        jsonb_build_object('model', 'small-1', 'cost', 0.001, 'note', repeat('x', 400))"
        f"   FROM {jobs} WHERE kind = %s", (kind,))


def _export_peak_rss_kb(app, kind: str, path: str) -> int:
    """Run `joblane dataset export --kind KIND -o PATH` as a process; its peak resident memory in kB."""
    env = {**os.environ, "DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema}
    proc = subprocess.Popen([sys.executable, "-m", "joblane", "dataset", "export", "--kind", kind, "-o", path],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.stderr.read()
    return usage.ru_maxrss


def test_an_export_of_100000_tries_streams_in_constant_memory(app, conn, tmp_path):
    _fabricate_tries(conn, app, "small", 5_000)
    _fabricate_tries(conn, app, "big", 100_000)
    small = _export_peak_rss_kb(app, "small", str(tmp_path / "small.jsonl"))
    big = _export_peak_rss_kb(app, "big", str(tmp_path / "big.jsonl"))
    with open(tmp_path / "big.jsonl") as f:
        assert sum(1 for _ in f) == 100_000
    # 95,000 more records of ~1 kB each: held in memory they would add ~100 MB; streamed, a few pages at most
    assert big - small < 25_000, (small, big)
