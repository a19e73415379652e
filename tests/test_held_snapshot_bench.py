"""benchmarks/held_snapshot.py runs end to end on joblane for a few seconds and reports sane rows and a summary."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_held_snapshot_benchmark_runs(joblane_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "held.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "held_snapshot.py"), "--dsn", joblane_dsn, "--systems", "joblane",
         "--rate", "100", "--relay-rate", "10", "--warmup", "3", "--hold", "3", "--after", "3", "--every", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "summary at 100 jobs/s offered" in done.stdout
    assert "idle in a REPEATABLE READ transaction" in done.stdout

    report = json.loads(out.read_text())
    assert report["settings"]["hold"] == 3
    (result,) = report["results"]
    assert result["system"] == "joblane" and "error" not in result, result.get("error")
    assert result["hold"]["backend_xmin"]  # the holding session pinned a horizon
    rows = result["rows"]
    assert {r["phase"] for r in rows} == {"warmup", "hold", "after"}
    assert len(rows) >= 6
    for r in rows:
        assert r["offered_per_s"] >= 0 and r["finished_per_s"] >= 0 and r["backlog"] >= 0
        assert r["heap_bytes"] > 0 and r["index_bytes"] > 0 and r["dead_tuples"] >= 0
        assert "jobs" in r["tables"] and "outbox" in r["tables"]
    assert sum(r["finished_per_s"] for r in rows) > 0
    assert any(r["wal_bytes_per_job"] and r["wal_bytes_per_job"] > 0 for r in rows)
    assert sum(r["relay_per_s"] for r in rows) > 0  # the relay delivered messages too

    summary = result["summary"]
    for phase in ("before", "hold", "after"):
        s = summary[phase]
        assert 0 < s["finished_per_s"] < 1000, s
        assert 0 < s["offered_per_s"] < 1000, s
        assert s["p50_ms"] is not None and 0 <= s["p50_ms"] <= s["p99_ms"] < 60_000, s
        assert s["heap_mb"] > 0
    assert summary["hold_peak_backlog"] is not None
    assert set(result["explain"]) == {"before the hold", "mid-hold", "end of the hold"}
    end = result["explain"]["end of the hold"]
    assert "claim_jobs" in end and "Buffers" in end, end  # the claim, with what it read

    # report.py turns the file into docs/benchmarks.md's section "Held snapshot"
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.held_section([report])
    assert lines[0] == "## Held snapshot"
    assert sum(line.startswith("| joblane | ") for line in lines) == 3  # before, end of the hold, after
