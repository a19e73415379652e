"""A whole workflow while workers are killed at random: fan-out 500, fan-in 1, a batch with a callback, a signal
from a separate psql session. Exactly once and ordering are read back from the database."""

from __future__ import annotations

import random
import subprocess

import psycopg

import joblane
from joblane.queries import quote_ident
from tests.conftest import table, wait_until
from tests.flows.test_dependencies import APP, finished, flow_app, started_after_parents  # noqa: F401


def test_fan_out_fan_in_batch_and_signal_with_workers_killed(flow_app, conn, spawn_worker):
    app = flow_app
    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, name="fan", on_complete=("summary", {}))
        root = joblane.JobSpec("step", {"n": "root"})
        fan = [joblane.JobSpec("step", {"n": i, "sleep": 0.01}, after=[root], batch=batch) for i in range(500)]
        gate = joblane.JobSpec("waiter", {"key": "go"}, after=[root])
        sink = joblane.JobSpec("summary", {"batch": {}}, after=[*fan, gate])
        ids = app.enqueue_many(tx, [root, *fan, gate, sink])
        batch.seal(tx)
    root_id, fan_ids, gate_id, sink_id = ids[0], ids[1:501], ids[501], ids[502]
    env = {"TEST_LEASE": "2"}
    workers = [spawn_worker(APP, app.schema, "-c", "16", "--lease", "2", env=env) for _ in range(2)]
    rng = random.Random(17)
    for threshold in sorted(rng.sample(range(20, 450), 3)):  # kill a random worker at three random moments
        wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'runs')}").fetchone()[0] > threshold,
                   timeout=60, message="progress")
        workers.pop(rng.randrange(len(workers))).kill()
        workers.append(spawn_worker(APP, app.schema, "-c", "16", "--lease", "2", env=env))
    wait_until(lambda: app.get_job(gate_id, conn)["state"] == "waiting", timeout=60, message="the gate to wait")
    subprocess.run(["psql", app.dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c",
                    f"SELECT {quote_ident(app.schema)}.signal('go', '\"now\"')"], check=True, capture_output=True)
    wait_until(lambda: finished(conn, app, ids), timeout=90, message="the workflow")
    states = dict(conn.execute(f"SELECT id, state FROM {table(app, 'jobs')}").fetchall())
    assert {states[i] for i in ids} == {"done"}
    # the sink ran once, after its 501 parents; every child of the root after the root
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'attempts')} WHERE job_id = %s AND outcome = 'done'",
                        (sink_id,)).fetchone()[0] == 1
    assert started_after_parents(conn, app, sink_id, [*fan_ids, gate_id])
    first_fan = conn.execute(f"SELECT min(at) FROM {table(app, 'runs')} WHERE job_id = ANY(%s)",
                             (fan_ids,)).fetchone()[0]
    assert first_fan > conn.execute(f"SELECT finished_at FROM {table(app, 'jobs')} WHERE id = %s",
                                    (root_id,)).fetchone()[0]
    # one callback for the batch, created when its last job finished
    callbacks = conn.execute(f"SELECT id, payload FROM {table(app, 'jobs')} WHERE kind = 'summary' AND id <> %s",
                             (sink_id,)).fetchall()
    assert len(callbacks) == 1 and callbacks[0][1]["batch"]["done"] == 500
    assert app.get_job(gate_id, conn)["result"]["signal"] == "now"
