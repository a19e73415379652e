"""benchmarks/cursor_probe.py's correctness part, so that the probe of issue 39's cursor claim cannot rot.

The probe builds the claim in a scratch schema of its own (dropped at the end) and checks it with real
concurrent sessions: a job whose transaction commits after a later one's, and after a claim, is still
claimed; a producer idle in its transaction does not stall the cursor and an aborted one's job is never
returned; under producers and three claiming threads every committed job is taken exactly once; a claim
passes over a lane another claim holds instead of waiting; a claim inside a REPEATABLE READ transaction
is refused (it would read a stale cursor).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import cursor_probe  # noqa: E402


def test_cursor_claim_invariants(joblane_dsn):
    checks = cursor_probe.correctness(joblane_dsn, seconds=1.5, costs=False)

    a = checks["a_out_of_order"]
    assert a["claimed_while_t1_open"] == [a["t2_job"]], a
    assert a["claimed_after_t1_commit"] == [a["t1_job"]], a  # the late commit is not skipped

    b = checks["b_idle_producer"]
    assert b["not_stalled"], b["rounds"]
    assert b["idle_job_claimed_after_commit"], b
    assert b["aborted_never_claimed"], b
    assert b["ok"], b

    c = checks["c_exactly_once"]
    assert not c["errors"], c["errors"]
    assert c["committed"] > 50, c  # the run did interleave work
    assert c["duplicates"] == 0 and c["missing"] == 0 and c["aborted_taken"] == 0, c
    assert c["claimed"] == c["committed"] and c["unmarked"] == 0, c

    d = checks["d_no_wait"]
    assert d["ok"], d

    f = checks["f_isolation"]  # a claim under an older REPEATABLE READ snapshot would read a stale cursor
    assert f["refused"] and f["ok"], f
