"""Held for review: Hold(reason, data) or enqueue(held=True), then release (with a patch) or reject, audited."""

from __future__ import annotations

import pytest

import joblane
from joblane.testing import drain

from .helpers import cli_json, rows, run_cli


def _review_app(app, seen: list):
    @app.task("draft_reply")
    async def draft_reply(job: joblane.Job):
        seen.append(dict(job.payload))
        if not job.payload.get("approved"):
            job.record(model="small-1", prompt_version="v1")
            raise joblane.Hold("low confidence", {"draft": "Dear customer...", "confidence": 0.41})
        return {"sent": job.payload["draft_version"]}


async def test_hold_then_release_with_patch_runs_the_patched_payload(app, conn):
    seen: list = []
    _review_app(app, seen)
    job_id = app.enqueue(conn, "draft_reply", {"ticket": 7, "draft_version": 1})
    await drain(app)

    [job] = rows(conn, app, "SELECT state, result, last_error, attempts FROM {jobs} WHERE id = %s", (job_id,))
    assert job == {"state": "held", "result": {"draft": "Dear customer...", "confidence": 0.41},
                   "last_error": "Hold: low confidence", "attempts": 1}

    [queued] = app.held_jobs()
    assert (queued["id"], queued["reason"], queued["data"]["confidence"]) == (job_id, "low confidence", 0.41)
    table = run_cli(app, "held")
    assert table.exit_code == 0 and "low confidence" in table.stdout and "confidence" in table.stdout

    assert app.release(conn, job_id, {"approved": True, "draft_version": 2}, actor="ana", note="edited the draft") == job_id
    [job] = rows(conn, app, "SELECT state, payload, result, max_attempts >= attempts + 1 AS budget FROM {jobs}"
                 " WHERE id = %s", (job_id,))
    assert job == {"state": "pending", "payload": {"ticket": 7, "draft_version": 2, "approved": True},
                   "result": None, "budget": True}
    assert app.held_jobs() == []

    await drain(app)
    assert seen[-1] == {"ticket": 7, "draft_version": 2, "approved": True}
    audit = rows(conn, app, "SELECT attempt, outcome, worker, error, meta FROM {attempts} WHERE job_id = %s ORDER BY id",
                 (job_id,))
    assert [(a["attempt"], a["outcome"]) for a in audit] == [(1, "held"), (1, "released"), (2, "done")]
    assert audit[0]["meta"]["hold_data"]["confidence"] == 0.41 and audit[0]["meta"]["model"] == "small-1"
    assert audit[1]["worker"] == "ana" and audit[1]["error"] == "edited the draft"
    # the review label: approved with an edit, the values it replaced kept beside it
    assert audit[1]["meta"] == {"label": "approve_edited", "payload_patch": {"approved": True, "draft_version": 2},
                                "payload_before": {"draft_version": 1}}
    [job] = rows(conn, app, "SELECT state, result FROM {jobs} WHERE id = %s", (job_id,))
    assert job == {"state": "done", "result": {"sent": 2}}


async def test_reject_cancels_with_reason_and_actor(app, conn):
    _review_app(app, [])
    job_id = app.enqueue(conn, "draft_reply", {"ticket": 8})
    await drain(app)
    assert app.reject(conn, job_id, "off-topic answer", actor="ben") == job_id
    [job] = rows(conn, app, "SELECT state, last_error, finished_at IS NOT NULL AS finished FROM {jobs} WHERE id = %s",
                 (job_id,))
    assert job == {"state": "cancelled", "last_error": "off-topic answer", "finished": True}
    [last] = rows(conn, app, "SELECT outcome, worker, error FROM {attempts} WHERE job_id = %s ORDER BY id DESC LIMIT 1",
                  (job_id,))
    assert last == {"outcome": "rejected", "worker": "ben", "error": "off-topic answer"}


def test_enqueue_held_then_cli_release_and_reject(app, conn):
    a = app.enqueue(conn, "publish_post", {"post": 1, "tone": "formal"}, held=True)
    b = app.enqueue(conn, "publish_post", {"post": 2}, held=True)
    listed = cli_json(app, "held")
    assert [j["id"] for j in listed] == [a, b]  # oldest first
    assert listed[0]["reason"] is None and listed[0]["payload"] == {"post": 1, "tone": "formal"}

    result = run_cli(app, "release", str(a), "--set", "tone=casual", "--set", "max_words=120", "--note", "ok")
    assert result.exit_code == 0, result.output
    result = run_cli(app, "reject", str(b), "--reason", "duplicate")
    assert result.exit_code == 0, result.output
    jobs = {r["id"]: r for r in rows(conn, app, "SELECT id, state, payload FROM {jobs}")}
    assert jobs[a]["state"] == "pending" and jobs[a]["payload"] == {"post": 1, "tone": "casual", "max_words": 120}
    assert jobs[b]["state"] == "cancelled"
    outcomes = rows(conn, app, "SELECT job_id, outcome, error FROM {attempts} ORDER BY id")
    assert [(o["job_id"], o["outcome"], o["error"]) for o in outcomes] == [(a, "released", "ok"), (b, "rejected", "duplicate")]


def test_only_held_jobs_can_be_released_or_rejected(app, conn):
    pending = app.enqueue(conn, "x", {"n": 1})
    listy = app.enqueue(conn, "x", [1, 2], held=True)
    before = rows(conn, app, "SELECT * FROM {jobs} ORDER BY id")
    with pytest.raises(joblane.JoblaneError, match=f"job {pending} is pending, not held: only held jobs can be released"):
        app.release(conn, pending)
    with pytest.raises(joblane.JoblaneError, match="not held: only held jobs can be rejected"):
        app.reject(conn, pending, "no")
    with pytest.raises(joblane.JoblaneError, match="no job 987654"):
        app.release(conn, 987654)
    with pytest.raises(joblane.JoblaneError, match="not a JSON object"):
        app.release(conn, listy, {"a": 1})
    with pytest.raises(joblane.JoblaneError, match="reject reason must be a non-empty string"):
        app.reject(conn, listy, "")
    with pytest.raises(joblane.JoblaneError, match="payload_patch must be a dict"):
        app.release(conn, listy, ["a"])
    assert rows(conn, app, "SELECT * FROM {jobs} ORDER BY id") == before
    assert rows(conn, app, "SELECT * FROM {attempts}") == []

    result = run_cli(app, "release", str(pending))
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: job {pending} is pending, not held: only held jobs can be released"
    result = run_cli(app, "release", str(listy), "--set", "oops")
    assert result.exit_code == 1 and "--set takes key=value" in result.stderr
    # releasing twice: the second finds the job pending
    app.release(conn, listy)
    with pytest.raises(joblane.JoblaneError, match="is pending, not held"):
        app.release(conn, listy)


async def test_jobs_show_has_hold_data_and_replay_links(app, conn):
    _review_app(app, [])
    job_id = app.enqueue(conn, "draft_reply", {"ticket": 9})
    await drain(app)
    shown = run_cli(app, "jobs", "show", str(job_id))
    assert shown.exit_code == 0, shown.output
    assert "hold data" in shown.stdout and "Dear customer" in shown.stdout and "low confidence" in shown.stdout

    app.reject(conn, job_id, "needs a rewrite")
    [copy] = app.replay(conn, ids=[job_id], payload_patch={"approved": True, "draft_version": 3})
    original = cli_json(app, "jobs", "show", str(job_id))
    assert original["replays"] == [{"id": copy["id"], "state": "pending"}]
    assert cli_json(app, "jobs", "show", str(copy["id"]))["replay_of"] == job_id
    shown = run_cli(app, "jobs", "show", str(job_id))
    assert f"{copy['id']} (pending)" in shown.stdout
