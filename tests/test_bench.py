"""`joblane bench` measures what the server writes and spends per job beside the rate."""

from __future__ import annotations

import psycopg

from joblane.showcase import bench


def test_server_cost_counts_the_wal_of_the_jobs_written(joblane_dsn):
    result = bench.enqueue_bulk(joblane_dsn, jobs=2000, per_call=500)
    wal = result.extra["wal_bytes_per_job"]
    # one jobs row, its index entries: at least a hundred bytes each, and nowhere near a page
    assert 100 < wal < 8192, result.extra
    assert result.extra.get("server_cpu_us_per_job", 0) >= 0
    with bench.ServerCost(joblane_dsn) as cost:
        with psycopg.connect(joblane_dsn, autocommit=True) as conn:
            conn.execute("CREATE TEMP TABLE nothing_logged (i int)")  # a temporary table writes no WAL rows
            conn.execute("INSERT INTO nothing_logged SELECT generate_series(1, 1000)")
    assert cost.per_job(1000)["wal_bytes_per_job"] < 60  # a logged row of one int costs more than that
