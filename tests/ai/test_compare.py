"""Replays tagged and compared with their originals: the counts against the database, the CLI and the dashboard."""

from __future__ import annotations

import json

import joblane
from joblane import Hold, JobSpec
from joblane.testing import drain

from ..review.helpers import cli_json, run_cli
from .helpers import dashboard, rows


async def test_compare_counts_match_the_database(app, conn):
    @app.task("classify", queue="ai", max_attempts=1)
    async def classify(job: joblane.Job):
        version = job.payload.get("prompt_version", "v1")
        job.record(model="m", prompt_version=version, cost=0.002 if version == "v1" else 0.003)
        n = job.payload["n"]
        if version == "v1" and n % 3 == 0:
            raise RuntimeError("unparseable answer")  # v1 fails on a third of the inputs
        if version == "v2" and n == 4:
            raise Hold("unsure")  # v2 asks for review once
        return {"label": "hot" if n % 2 else "cold", "why": version if n == 1 else None}

    originals = app.enqueue_many(conn, [JobSpec("classify", {"n": n}) for n in range(9)])
    await drain(app, timeout=20)
    result = run_cli(app, "replay", "--kind", "classify", "--set", "prompt_version=v2", "--tag", "v2-prompt", "-y")
    assert result.exit_code == 0 and "joblane compare v2-prompt" in result.stdout, result.output
    await drain(app, timeout=20)

    report = cli_json(app, "compare", "v2-prompt")
    db = rows(conn, app, "SELECT r.id, r.replay_of, r.state AS replay_state, o.state AS original_state,"
                         " r.result AS replay_result, o.result AS original_result"
                         " FROM {jobs} r JOIN {jobs} o ON o.id = r.replay_of WHERE r.replay_tag = 'v2-prompt'")
    assert sorted(r["replay_of"] for r in db) == sorted(originals)
    assert len(report["pairs"]) == 9 and {p["replay_id"] for p in report["pairs"]} == {r["id"] for r in db}
    for side in ("original", "replay"):
        states = [r[f"{side}_state"] for r in db]
        summary = report[side]
        assert (summary["jobs"], summary["done"], summary["failed"], summary["held"]) == \
            (9, states.count("done"), states.count("failed"), states.count("held"))
        finished = states.count("done") + states.count("failed") + states.count("cancelled")
        assert summary["success_rate"] == states.count("done") / finished
        [spent] = rows(conn, app, "SELECT sum((a.meta->>'cost')::float8) AS c, count(*) AS tries FROM {attempts} a"
                                  " JOIN {jobs} r ON r.replay_tag = 'v2-prompt'"
                                  f" AND a.job_id = r.{'id' if side == 'replay' else 'replay_of'}")
        assert abs(summary["cost"] - spent["c"]) < 1e-9 and summary["tries"] == spent["tries"]
    assert report["original"]["failed"] == 3 and report["original"]["hold_rate"] == 0
    assert report["replay"]["failed"] == 0 and report["replay"]["hold_rate"] == 1 / 9
    both_done = [r for r in db if r["replay_state"] == r["original_state"] == "done"]
    assert report["changed"] == sum(1 for r in both_done if r["replay_result"] != r["original_result"]) == 1
    assert report["fixed"] == 3 and report["regressed"] == 0

    table = run_cli(app, "compare", "v2-prompt")
    assert table.exit_code == 0 and "success rate" in table.stdout and "66.7%" in table.stdout
    assert "100.0%" in table.stdout and "outputs changed: 1" in table.stdout, table.stdout
    changed = next(p for p in report["pairs"] if p["changed"])
    [pair] = cli_json(app, "compare", "v2-prompt", "--job", str(changed["original_id"]))
    assert pair["original_result"]["why"] == "v1" and pair["replay_result"]["why"] == "v2"
    for args, message in [(["compare", "nothing"], "no replays tagged 'nothing'"),
                          (["compare", "bad tag!"], "a replay tag is"),
                          (["compare", "v2-prompt", "--job", "999999"], "in no pair"),
                          (["replay", "--kind", "classify", "--tag", "no spaces"], "a replay tag is")]:
        result = run_cli(app, *args)
        assert result.exit_code == 1 and message in result.stderr, (args, result.output)

    with dashboard(app) as web:
        index = web.get("/compare")
        assert index.status_code == 200 and "/compare/v2-prompt" in index.text
        page = web.get("/compare/v2-prompt")
        assert page.status_code == 200 and "66.7%" in page.text and "100.0%" in page.text
        assert "Outputs changed: <strong>1</strong>" in page.text
        side = web.get(f"/compare/v2-prompt?job={changed['replay_id']}")
        assert 'id="compare-pair"' in side.text and "&#34;v2&#34;" in side.text
        assert web.get("/compare/nothing").status_code == 404
    from starlette.testclient import TestClient

    from joblane.web import create_app

    guarded = create_app(app, token="a-token-for-tests", loopback_only=False, refresh_seconds=0)
    with TestClient(guarded, base_url="http://dash.internal", follow_redirects=False) as c:
        assert c.get("/compare/v2-prompt").status_code == 303  # to the login page, like every page
    assert json.loads(run_cli(app, "compare", "v2-prompt", "--json").stdout)["tag"] == "v2-prompt"
