"""Replays are inserts: new jobs copied from matched ones, patched, replay_of set; old rows untouched."""

from __future__ import annotations

import pytest

import joblane
from joblane.testing import drain

from .helpers import cli_json, rows, run_cli


async def _failed_classifications(app, conn) -> tuple[list[int], list[int]]:
    @app.task("classify", max_attempts=1)
    async def classify(job: joblane.Job):
        job.record(prompt_version=job.payload["prompt_version"])
        if job.payload["prompt_version"] == "v1" and job.payload["n"] % 2:
            raise ValueError("label not in the allowed set")
        return {"label": "ok", "prompt_version": job.payload["prompt_version"]}

    ids = [app.enqueue(conn, "classify", {"n": n, "prompt_version": "v1", "text": f"lead {n}"}) for n in range(6)]
    await drain(app)
    failed = [r["id"] for r in rows(conn, app, "SELECT id FROM {jobs} WHERE state = 'failed' ORDER BY id")]
    assert len(failed) == 3
    return ids, failed


async def test_replay_failed_jobs_with_a_patch_leaves_the_originals_untouched(app, conn):
    ids, failed = await _failed_classifications(app, conn)
    app.declare("summarise")  # a kind this process enqueues but does not run
    other = app.enqueue(conn, "summarise", {"n": 1})
    conn.execute(f'UPDATE "{app.schema}".jobs SET state = \'failed\', finished_at = now() WHERE id = %s', (other,))
    before = rows(conn, app, "SELECT * FROM {jobs} ORDER BY id")

    result = run_cli(app, "replay", "--kind", "classify", "--state", "failed", "--since", "24h",
                     "--set", "prompt_version=v2", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would insert 3 jobs" in result.stdout and "nothing was inserted" in result.stdout
    assert "v2" in result.stdout
    assert rows(conn, app, "SELECT * FROM {jobs} ORDER BY id") == before

    replayed = cli_json(app, "replay", "--kind", "classify", "--state", "failed", "--since", "24h",
                        "--set", "prompt_version=v2")
    assert [r["replay_of"] for r in replayed["jobs"]] == failed
    assert rows(conn, app, "SELECT * FROM {jobs} WHERE id <= %s ORDER BY id", (before[-1]["id"],)) == before
    copies = rows(conn, app, "SELECT id, replay_of, kind, queue, state, payload, attempts, max_attempts, unique_key"
                  " FROM {jobs} WHERE replay_of IS NOT NULL ORDER BY replay_of")
    originals = {r["id"]: r for r in before}
    for copy in copies:
        old = originals[copy["replay_of"]]
        assert copy["payload"] == {**old["payload"], "prompt_version": "v2"}
        assert (copy["kind"], copy["queue"], copy["state"], copy["attempts"], copy["max_attempts"]) == \
            (old["kind"], old["queue"], "pending", 0, old["max_attempts"])

    await drain(app)
    done = rows(conn, app, "SELECT replay_of, state, result FROM {jobs} WHERE replay_of IS NOT NULL ORDER BY replay_of")
    assert [(d["replay_of"], d["state"], d["result"]["prompt_version"]) for d in done] == [(i, "done", "v2") for i in failed]
    # the attempts of old and new tries sit side by side for comparison
    versions = rows(conn, app, "SELECT a.meta->>'prompt_version' AS v, a.outcome, count(*) AS n FROM {attempts} a"
                    " GROUP BY 1, 2 ORDER BY 1, 2")
    assert versions == [{"v": "v1", "outcome": "done", "n": 3}, {"v": "v1", "outcome": "failed", "n": 3},
                        {"v": "v2", "outcome": "done", "n": 3}]


async def test_replay_filters_limit_and_skip_replayed(app, conn):
    ids, failed = await _failed_classifications(app, conn)
    with pytest.raises(joblane.JoblaneError, match="replay needs a filter"):
        app.replay(conn)
    # no state: finished jobs only (done and failed here)
    everything = app.replay(conn, kind="classify", dry_run=True)
    assert [r["replay_of"] for r in everything] == ids and all(r["id"] is None for r in everything)
    first = app.replay(conn, ids=failed, limit=2)
    assert [r["replay_of"] for r in first] == failed[:2]
    rest = app.replay(conn, kind="classify", state="failed", skip_replayed=True)
    assert [r["replay_of"] for r in rest] == failed[2:]
    assert app.replay(conn, kind="classify", state="failed", skip_replayed=True) == []
    assert app.replay(conn, kind="classify", state="failed", until="2000-01-01T00:00:00+00:00") == []
    with pytest.raises(joblane.JoblaneError, match="since must be a duration ago"):
        app.replay(conn, kind="classify", since="yesterday-ish")
    result = run_cli(app, "replay", "--kind", "nothing-like-this")
    assert result.exit_code == 0 and "nothing to replay" in result.stdout


def test_a_patch_on_a_non_object_payload_inserts_nothing(app, conn):
    good = app.enqueue(conn, "k", {"a": 1})
    bad = app.enqueue(conn, "k", ["not", "an", "object"])
    conn.execute(f'UPDATE "{app.schema}".jobs SET state = \'failed\', finished_at = now()')
    with pytest.raises(joblane.JoblaneError, match=f"job {bad}'s payload is a JSON array, not an object"):
        app.replay(conn, kind="k", payload_patch={"b": 2})
    assert rows(conn, app, "SELECT count(*) AS n FROM {jobs}") == [{"n": 2}]
    # without a patch a non-object payload is copied as it is
    copies = app.replay(conn, kind="k")
    assert [(c["replay_of"], c["payload"]) for c in copies] == [(good, {"a": 1}), (bad, ["not", "an", "object"])]
