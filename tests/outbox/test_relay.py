"""The relay against a real local HTTP server: delivery, status codes, backoff, failure, retry, order, leases."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest
from click.testing import CliRunner

import joblane
from joblane.cli import main
from joblane.outbox import Relay
from joblane.outbox.sinks import HttpSink

from ..helpers import run_sql
from .conftest import Request, outbox_rows


def relay(app, **options) -> Relay:
    return Relay(app, **{"listen": False, "lease_seconds": 5.0, **options})


def publish(app, dsn, *messages, rollback: bool = False) -> list[int]:
    """Publish (topic, payload, options) tuples in one transaction; returns their ids."""
    with psycopg.connect(dsn) as c:
        with c.transaction() as tx:
            ids = [app.publish(c, topic, payload, **opts) for topic, payload, opts in messages]
            if rollback:
                raise psycopg.Rollback(tx)
    return ids


async def test_committed_rows_arrive_with_their_idempotency_key_and_rolled_back_ones_never(
        app, conn, joblane_dsn, receiver):
    app.route("crm.", HttpSink(receiver.url + "/hooks/{topic}"))
    publish(app, joblane_dsn, ("crm.lead_created", {"n": 0}, {}), rollback=True)
    ids = publish(app, joblane_dsn,
                  ("crm.lead_created", {"n": 1}, {}),
                  ("crm.lead_created", {"n": 2}, {"key": "lead-2", "headers": {"X-Trace": "abc"}}),
                  ("crm.lead_updated", {"n": 3}, {"idempotency_key": "lead-3-v1"}))
    async with relay(app) as r:
        result = await r.run_once()
        assert (result.claimed, result.sent) == (3, 3)
        assert (await r.run_once()).claimed == 0
    posts = sorted(receiver.posts(), key=lambda q: q.json["n"])
    assert [p.json for p in posts] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [p.key for p in posts] == [f"outbox:{ids[0]}", f"outbox:{ids[1]}", "lead-3-v1"]
    assert [p.path for p in posts] == ["/hooks/crm.lead_created", "/hooks/crm.lead_created", "/hooks/crm.lead_updated"]
    assert posts[1].headers["x-trace"] == "abc" and posts[1].headers["joblane-key"] == "lead-2"
    assert posts[0].headers["content-type"] == "application/json"
    assert [(i, s, a) for i, s, a, *_ in outbox_rows(conn, app)] == [(i, "sent", 1) for i in ids]
    assert conn.execute(f'SELECT count(*) FROM "{app.schema}".outbox WHERE sent_at IS NULL').fetchone()[0] == 0


async def test_status_codes_retry_after_and_permanent_failure(app, conn, joblane_dsn, receiver):
    answers = {
        "retry-after": (503, {"Retry-After": "120"}, b"maintenance"),
        "rate-limited": (429, {}, b"slow down"),
        "bad": (422, {}, b'{"error": "email is missing"}'),
        "redirect": (302, {"Location": "/elsewhere"}, b""),
        "created": (201, {}, b"created"),
    }
    receiver.respond = lambda req: answers[req.json["case"]]
    app.route("", HttpSink(receiver.url))
    ids = dict(zip(answers, publish(app, joblane_dsn, *[("t.case", {"case": c}, {}) for c in answers])))
    async with relay(app) as r:
        result = await r.run_once()
    assert (result.sent, result.retried, result.failed) == (1, 2, 2)
    rows = {i: (s, a, e) for i, s, a, _, _, e in outbox_rows(conn, app)}
    assert rows[ids["created"]] == ("sent", 1, None)
    assert rows[ids["bad"]] == ("failed", 1, 'HTTP 422 Unprocessable Entity: {"error": "email is missing"}')
    assert rows[ids["redirect"]][0] == "failed"
    assert rows[ids["retry-after"]] == ("pending", 1, "HTTP 503 Service Unavailable: maintenance")
    assert rows[ids["rate-limited"]][:2] == ("pending", 1)
    wait = dict(conn.execute(f'SELECT id, extract(epoch FROM run_after - now()) FROM "{app.schema}".outbox'
                             " WHERE state = 'pending'").fetchall())
    assert 100 < wait[ids["retry-after"]] <= 120, "Retry-After is honoured"
    assert 0 < wait[ids["rate-limited"]] <= 1.25, "no Retry-After: the route's backoff (1 s +-25 %)"


async def test_exhausted_rows_fail_and_outbox_retry_requeues_them(app, conn, joblane_dsn, receiver, monkeypatch):
    receiver.respond = lambda req: (500, {}, b"down")
    app.route("", HttpSink(receiver.url), max_attempts=3, backoff=lambda attempt: 0.0)
    [row] = publish(app, joblane_dsn, ("t.x", {}, {}))
    async with relay(app) as r:
        for _ in range(3):
            await r.run_once()
        assert outbox_rows(conn, app)[0][1:3] == ("failed", 3)
        assert outbox_rows(conn, app)[0][5] == "gave up after 3 attempts: HTTP 500 Internal Server Error: down"
        assert (await r.run_once()).claimed == 0, "failed rows stay failed"

        monkeypatch.setenv("DATABASE_URL", joblane_dsn)
        runner = CliRunner()
        listed = runner.invoke(main, ["--schema", app.schema, "outbox", "--state", "failed", "--json"])
        assert listed.exit_code == 0, listed.output
        assert [m["id"] for m in json.loads(listed.output)] == [row]
        bad = runner.invoke(main, ["--schema", app.schema, "outbox", "retry"])
        assert bad.exit_code == 1 and "give message ids" in bad.output
        retried = runner.invoke(main, ["--schema", app.schema, "outbox", "retry", "--all-failed", "--attempts", "2",
                                       "--json"])
        assert retried.exit_code == 0, retried.output
        assert json.loads(retried.output) == {"retried": [row], "skipped": {}}
        again = runner.invoke(main, ["--schema", app.schema, "outbox", "retry", str(row), "--json"])
        assert json.loads(again.output) == {"retried": [], "skipped": {str(row): "pending"}}

        receiver.respond = lambda req: (200, {}, b"ok")
        assert (await r.run_once()).sent == 1
    assert outbox_rows(conn, app)[0][1:3] == ("sent", 4)
    assert receiver.keys() == [f"outbox:{row}"] * 4, "every try carried the same key"


async def test_ordered_keys_arrive_in_order_despite_failures_at_the_receiver(app, conn, joblane_dsn, receiver):
    """Each key's second message fails twice; nothing behind it may overtake it, other keys go on."""
    failures = {}
    lock = threading.Lock()

    def respond(req: Request):
        body = req.json
        with lock:
            if body["seq"] == 1 and failures.get(body["key"], 0) < 2:
                failures[body["key"]] = failures.get(body["key"], 0) + 1
                return 503, {"Retry-After": "0"}, b"try again"
        return 200, {}, b"ok"

    receiver.respond = respond
    app.route("orders.", HttpSink(receiver.url), ordered=True)
    messages = [("orders.changed", {"key": k, "seq": s}, {"key": k}) for s in range(5) for k in ("a", "b", "c")]
    messages.append(("orders.changed", {"key": None, "seq": 0}, {}))
    publish(app, joblane_dsn, *messages)
    async with relay(app, batch_size=7) as r:
        for _ in range(30):
            await r.run_once()
            if not outbox_rows(conn, app, "state <> 'sent'"):
                break
    assert outbox_rows(conn, app, "state <> 'sent'") == []
    delivered: dict[str, list[int]] = {}
    for req in receiver.posts():
        delivered.setdefault(req.json["key"], []).append(req.json["seq"])
    for k in ("a", "b", "c"):
        # the failed tries of seq 1 appear twice before its success; no later seq before them
        assert delivered[k] == [0, 1, 1, 1, 2, 3, 4], (k, delivered[k])
    assert delivered[None] == [0]


async def test_unordered_route_does_not_hold_a_key_back(app, conn, joblane_dsn, receiver):
    receiver.respond = lambda req: (503, {"Retry-After": "60"}, b"") if req.json["seq"] == 0 else (200, {}, b"")
    app.route("", HttpSink(receiver.url))
    ids = publish(app, joblane_dsn, *[("t.x", {"seq": s}, {"key": "same"}) for s in range(3)])
    async with relay(app) as r:
        result = await r.run_once()
    assert (result.sent, result.retried) == (2, 1)
    assert [s for _, s, *_ in outbox_rows(conn, app)] == ["pending", "sent", "sent"]
    assert ids


async def test_a_failed_row_holds_its_key_until_retried(app, conn, joblane_dsn, receiver):
    receiver.respond = lambda req: (400, {}, b"rejected") if req.json["seq"] == 0 else (200, {}, b"")
    app.route("", HttpSink(receiver.url), ordered=True)
    ids = publish(app, joblane_dsn, *[("t.x", {"seq": s}, {"key": "k"}) for s in range(3)],
                  ("t.x", {"seq": 9}, {"key": "other"}))
    async with relay(app) as r:
        first = await r.run_once()
        assert (first.failed, first.released, first.sent) == (1, 2, 1)
        assert (await r.run_once()).claimed == 0, "rows behind a failed row wait"
        assert [a for _, _, a, *_ in outbox_rows(conn, app)] == [1, 0, 0, 1], "released rows keep their attempts"
        receiver.respond = lambda req: (200, {}, b"")
        assert app.retry_outbox(ids=[ids[0]]) == [ids[0]]
        await r.run_once()
    assert [s for _, s, *_ in outbox_rows(conn, app)] == ["sent"] * 4
    seqs = [q.json["seq"] for q in receiver.posts()]
    # key k in order (its first try of 0 failed); the other key is independent of it
    assert [s for s in seqs if s != 9] == [0, 0, 1, 2] and seqs.count(9) == 1


async def test_an_expired_lease_is_taken_over_and_a_live_one_is_not(app, conn, joblane_dsn, receiver):
    app.route("", HttpSink(receiver.url))
    dead, alive = publish(app, joblane_dsn, ("t.x", {"n": 1}, {}), ("t.x", {"n": 2}, {}))
    conn.execute(f'UPDATE "{app.schema}".outbox SET attempts = 1, relay = %s,'
                 " lease_until = now() + CASE WHEN id = %s THEN interval '-1 second' ELSE interval '1 hour' END",
                 ("killed-relay", dead))
    async with relay(app) as r:
        result = await r.run_once()
    assert result.ids == {"sent": [dead]}
    assert receiver.keys() == [f"outbox:{dead}"]
    rows = conn.execute(f'SELECT id, state, attempts, relay FROM "{app.schema}".outbox ORDER BY id').fetchall()
    assert rows == [(dead, "sent", 2, None), (alive, "pending", 1, "killed-relay")]


async def test_an_outcome_after_the_lease_moved_on_is_not_recorded(app, conn, joblane_dsn, receiver):
    """A slow relay's result for a row another relay took over must not overwrite it."""
    release = threading.Event()

    def respond(req):
        release.wait(10)
        return 500, {}, b"late failure"

    receiver.respond = respond
    app.route("", HttpSink(receiver.url))
    [row] = publish(app, joblane_dsn, ("t.x", {}, {}))
    async with relay(app, lease_seconds=30) as slow:
        task = asyncio.create_task(slow.run_once())
        await asyncio.sleep(0.3)
        # the lease "expires" and another relay delivers the row
        conn.execute(f'UPDATE "{app.schema}".outbox SET lease_until = now() - interval \'1 second\'')
        receiver.respond = lambda req: (200, {}, b"")
        async with relay(app) as fast:
            assert (await fast.run_once()).sent == 1
        release.set()
        result = await task
    assert result.stale == 1 and result.retried == 0
    assert outbox_rows(conn, app)[0][1:3] == ("sent", 2)


async def test_read_back_finds_the_record_and_does_not_send_it_again(app, conn, joblane_dsn, receiver):
    """The destination creates the record but the answer is lost (503): the retry looks before it sends."""
    receiver.respond = lambda req: (503, {"Retry-After": "0"}, b"response lost")
    app.route("", HttpSink(receiver.url + "/records", find_url=lambda m: f"{receiver.url}/records/{m.idempotency_key}"))
    ids = publish(app, joblane_dsn, ("t.x", {"n": 1}, {}), ("t.x", {"n": 2}, {}))
    async with relay(app) as r:
        assert (await r.run_once()).retried == 2
        del receiver.records[f"outbox:{ids[1]}"]  # this one really was not created
        receiver.respond = lambda req: (201, {}, b"created")
        result = await r.run_once()
    assert (result.sent, result.found) == (2, 1)
    assert sorted(receiver.keys()) == [f"outbox:{ids[0]}", f"outbox:{ids[1]}", f"outbox:{ids[1]}"], \
        "the found record was not posted again"
    assert [s for _, s, *_ in outbox_rows(conn, app)] == ["sent", "sent"]


async def test_longest_prefix_routes_and_unrouted_topics_stay_pending(app, conn, joblane_dsn, receiver):
    app.route("crm.", HttpSink(receiver.url + "/crm"))
    app.route("crm.audit.", HttpSink(receiver.url + "/audit"))
    with pytest.raises(joblane.JoblaneError, match="routed twice"):
        app.route("crm.", HttpSink(receiver.url))
    publish(app, joblane_dsn, ("crm.lead", {}, {}), ("crm.audit.login", {}, {}), ("billing.invoice", {}, {}))
    async with relay(app) as r:
        assert (await r.run_once()).sent == 2
    assert sorted(p.path for p in receiver.posts()) == ["/audit", "/crm"]
    assert [s for _, s, *_ in outbox_rows(conn, app)] == ["sent", "sent", "pending"]


async def test_two_relays_side_by_side_send_each_row_once(app, conn, joblane_dsn, receiver):
    app.route("", HttpSink(receiver.url))
    ids = publish(app, joblane_dsn, *[("t.bulk", {"i": i}, {"key": f"k{i % 7}"}) for i in range(300)])
    relays = [relay(app, batch_size=20, concurrency=2, poll_interval=0.05) for _ in range(2)]
    runs = [asyncio.create_task(r.run(install_signals=False)) for r in relays]
    deadline = time.monotonic() + 30
    while outbox_rows(conn, app, "state <> 'sent'") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for r in relays:
        r.request_stop()
    stats = await asyncio.gather(*runs)
    assert outbox_rows(conn, app, "state <> 'sent'") == []
    keys = receiver.keys()
    assert sorted(keys) == sorted(f"outbox:{i}" for i in ids), "every row exactly once"
    assert all(s["sent"] > 0 for s in stats), f"both relays took part: {stats}"


async def test_a_notification_wakes_an_idle_relay(app, conn, joblane_dsn, receiver):
    app.route("", HttpSink(receiver.url))
    r = Relay(app, listen=True, poll_interval=60.0, jitter=0.0)
    run = asyncio.create_task(r.run(install_signals=False))
    await r.started.wait()
    await asyncio.sleep(0.5)  # the first (empty) claim is done; the relay now waits a minute
    [row] = publish(app, joblane_dsn, ("t.x", {}, {}))
    deadline = time.monotonic() + 20
    while not receiver.posts() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    r.request_stop()
    await run
    assert receiver.keys() == [f"outbox:{row}"], "delivered long before the next poll"


async def test_the_relay_reaches_its_rows_through_the_primary_key_however_many_were_sent(
        app, conn, joblane_dsn, receiver):
    """Sent rows stay for a week, so the outbox grows far beyond what is pending.

    The claim leases the rows it picked through the primary key (a join let
    the planner hash the whole table, sent rows included, on every claim),
    and the recording of a batch's outcomes finds them through it too. A
    prepared statement's generic plan, made without the batch's arrays,
    compared every row with every outcome (150 ms for 1,000 rows), so the
    relay's connections plan each statement for its arguments; behind
    PgBouncer nothing is prepared, which gives the same.
    """
    from joblane import store

    app.route("bench.", HttpSink(receiver.url))
    outbox = f'"{app.schema}".outbox'
    conn.execute(f"INSERT INTO {outbox} (topic, payload, state, attempts, sent_at)"
                 " SELECT 'bench.old', '{}', 'sent', 1, now() FROM generate_series(1, 20000)")
    ids = [r[0] for r in conn.execute(
        f"INSERT INTO {outbox} (topic, payload) SELECT 'bench.new', jsonb_build_object('n', i)"
        " FROM generate_series(1, 600) AS i RETURNING id").fetchall()]
    conn.execute(f"ANALYZE {outbox}")
    conn.commit()
    claim = app.store.claim_outbox(200, ["bench."], [False], "r-plan", 30.0)
    with conn.transaction(force_rollback=True):  # the claim is a function: what it scanned, from this transaction
        run_sql(conn, claim.sql, claim.args)
        scans = conn.execute("SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid = %s::regclass",
                             (outbox,)).fetchone()
    assert scans[0] == 0 and scans[1] > 0, scans
    async with relay(app, batch_size=200) as r:
        for _ in range(7):  # more batches than PostgreSQL plans before it may keep a generic plan (five)
            await r.run_once()
        async with r._pool.acquire() as c:
            assert await c.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
            finish = app.store.finish_outbox([1], ["sent"], [1], [0.0], [None], "nobody")
            assert await store.records(c, finish) == []  # runs on the relay's connection, changes nothing
    assert sorted(receiver.keys()) == sorted(f"outbox:{i}" for i in ids)
    assert conn.execute(f"SELECT count(*) FROM {outbox} WHERE state <> 'sent'").fetchone()[0] == 0


def _rows_read(conn, app) -> int:
    """Rows this transaction has read from the outbox and its indexes so far (heap fetches and index entries)."""
    return conn.execute(
        "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid))::bigint"
        "  FROM pg_class AS c WHERE c.oid = %s::regclass"
        "    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)",
        (f'"{app.schema}".outbox', f'"{app.schema}".outbox')).fetchone()[0]


def test_a_claim_over_a_big_backlog_of_few_ordered_keys_reads_what_it_claims_not_the_backlog(app, conn):
    """With few keys, a walk over every ready row for each key's first one read the whole backlog on every
    claim (892 ms per claim of 1,000 over 100,000 rows of 100 keys): the backlog of a destination that was
    down drained more slowly the bigger it was. Keys are walked one probe each, rows without a key apart."""
    outbox = f'"{app.schema}".outbox'
    conn.execute(f"INSERT INTO {outbox} (topic, key, payload) SELECT 'orders.changed', 'k' || (i % 10),"
                 " jsonb_build_object('i', i) FROM generate_series(1, 20000) AS i")
    conn.execute(f"INSERT INTO {outbox} (topic, payload) SELECT 'orders.changed', jsonb_build_object('i', i)"
                 " FROM generate_series(1, 50) AS i")
    conn.execute(f"ANALYZE {outbox}")
    with conn.transaction():
        before = _rows_read(conn, app)
        rows = run_sql(conn, *_claim(app, 100, ordered=True))
        read = _rows_read(conn, app) - before
        *claimed, stop = rows
        assert len(claimed) == 100 and stop[0] is None
        assert read < 2000, f"read {read} rows for a claim of 100 over 20,050"  # 740 now; 281,150 before
        by_key: dict = {}
        for r in claimed:
            by_key.setdefault(r[2], []).append(r[0])
        first = dict(conn.execute(f"SELECT key, array_agg(id ORDER BY id) FROM {outbox} GROUP BY key").fetchall())
        for key, ids in by_key.items():  # each key gives the start of its run, in order; rows without a key the oldest
            assert sorted(ids) == first[key][:len(ids)], key


def _claim(app, limit: int, *, ordered: bool) -> tuple[str, tuple]:
    claim = app.store.claim_outbox(limit, ["orders."], [ordered], "r-test", 30.0)
    return claim.sql, claim.args


async def test_every_key_gets_its_turn_behind_keys_that_cannot_move(app, conn, joblane_dsn, receiver):
    """Keys whose first row failed hold their rows; the walk goes on from where the last claim stopped, so a
    key behind many of them is reached, and a row without a key goes with the first batch."""
    outbox = f'"{app.schema}".outbox'
    conn.execute(f"INSERT INTO {outbox} (topic, key, payload, state, attempts, last_error)"
                 " SELECT 'orders.changed', 'a' || lpad(i::text, 2, '0'), '{}', 'failed', 1, 'no'"
                 " FROM generate_series(1, 30) AS i")
    conn.execute(f"INSERT INTO {outbox} (topic, key, payload) SELECT 'orders.changed', 'a' || lpad(i::text, 2, '0'),"
                 " jsonb_build_object('seq', s) FROM generate_series(1, 30) AS i, generate_series(1, 5) AS s")
    app.route("orders.", HttpSink(receiver.url), ordered=True)
    late = publish(app, joblane_dsn, *[("orders.changed", {"seq": s}, {"key": "z"}) for s in range(3)],
                   ("orders.changed", {"seq": 0}, {}))
    async with relay(app, batch_size=10) as r:
        first = await r.run_once()
        assert late[3] in first.ids.get("sent", []), "the row without a key goes at once"
        for _ in range(5):  # 30 keys that cannot move, 10 a claim: z within four claims
            if (await r.run_once()).sent:
                break
    assert [s for _, s, *_ in outbox_rows(conn, app, "id = ANY(%s)", (late,))] == ["sent"] * 4
    assert [q.json["seq"] for q in receiver.posts() if q.json.get("seq") is not None][1:] == [0, 1, 2]
    assert outbox_rows(conn, app, "key LIKE 'a%%' AND state = 'sent'") == []


async def test_relays_side_by_side_keep_each_keys_order(app, conn, joblane_dsn, receiver):
    """Two relays, four keys of 40 rows each, a tenth of the tries refused: each key arrives in order."""
    import random

    rng = random.Random(7)
    lock = threading.Lock()

    def respond(req: Request):
        with lock:
            refuse = rng.random() < 0.1
        return (503, {"Retry-After": "0"}, b"busy") if refuse else (200, {}, b"ok")

    receiver.respond = respond
    app.route("orders.", HttpSink(receiver.url), ordered=True, backoff=lambda attempt: 0.0, max_attempts=100)
    publish(app, joblane_dsn, *[("orders.changed", {"key": k, "seq": s}, {"key": k})
                                for s in range(40) for k in ("a", "b", "c", "d")])

    async def drain(r: Relay) -> None:
        for _ in range(500):
            if not outbox_rows(conn, app, "state <> 'sent'"):
                return
            await r.run_once()

    async with relay(app, batch_size=7) as one, relay(app, batch_size=5) as two:
        await asyncio.gather(drain(one), drain(two))
    assert outbox_rows(conn, app, "state <> 'sent'") == []
    seqs: dict[str, list[int]] = {}
    for req in receiver.posts():
        seqs.setdefault(req.json["key"], []).append(req.json["seq"])
    for key, got in seqs.items():  # a refused try goes again before anything after it
        assert got == sorted(got) and sorted(set(got)) == list(range(40)), (key, got)


async def test_a_relay_without_workers_turns_the_ring_and_empties_its_slots(app, conn, joblane_dsn, receiver):
    """An outbox served by relays alone: the relay's rotator turns the ring of entries and empties the slots
    its claims have passed, and every row still arrives once."""
    app.route("", HttpSink(receiver.url))
    r = relay(app, batch_size=50, poll_interval=0.05, ring_turn_seconds=0.5)
    run = asyncio.create_task(r.run(install_signals=False))
    ids: list[int] = []
    for i in range(12):
        ids += publish(app, joblane_dsn, *[("t.ring", {"i": i, "j": j}, {}) for j in range(20)])
        await asyncio.sleep(0.3)
    deadline = time.monotonic() + 30
    while outbox_rows(conn, app, "state <> 'sent'") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    r.request_stop()
    await run
    assert sorted(receiver.keys()) == sorted(f"outbox:{i}" for i in ids), "every row exactly once"
    cleared = conn.execute(f'SELECT count(*) FROM "{app.schema}".ready_turns WHERE cleared_at IS NOT NULL').fetchone()[0]
    assert cleared >= 2, f"the relay's rotator emptied {cleared} slots"
    with pytest.raises(joblane.JoblaneError, match="ring_turn_seconds"):
        relay(app, ring_turn_seconds=0)


async def test_one_publish_wakes_one_claim_and_a_burst_goes_out_in_few(app, conn, joblane_dsn, receiver):
    """Both loops of a relay wake on a publish's notification; the first claims after a short gather and the
    other, seeing a claim begun since, claims nothing. A burst of publishes goes out in a few claims."""
    app.route("", HttpSink(receiver.url))
    r = Relay(app, listen=True, poll_interval=60.0, jitter=0.0, concurrency=2, gather_seconds=0.05)
    run = asyncio.create_task(r.run(install_signals=False))
    await asyncio.wait_for(r.started.wait(), 30)
    await asyncio.sleep(0.5)
    base = r.stats["claims"]
    ids = []
    for i in range(10):  # one at a time, each delivered before the next
        ids += publish(app, joblane_dsn, ("t.one", {"i": i}, {}))
        await asyncio.sleep(0.3)
    one_by_one = r.stats["claims"] - base
    base = r.stats["claims"]
    burst = publish(app, joblane_dsn, *[("t.burst", {"i": i}, {}) for i in range(40)])
    for i in range(40):
        burst += publish(app, joblane_dsn, ("t.burst", {"j": i}, {}))
    deadline = time.monotonic() + 20
    while outbox_rows(conn, app, "state <> 'sent'") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    bursts = r.stats["claims"] - base
    r.request_stop()
    await run
    assert sorted(receiver.keys()) == sorted(f"outbox:{i}" for i in ids + burst), "every row exactly once"
    assert one_by_one <= 14, f"{one_by_one} claims for 10 publishes one at a time (two loops woken by each)"
    assert bursts <= 12, f"{bursts} claims for a burst of 41 commits"
    with pytest.raises(joblane.JoblaneError, match="gather_seconds"):
        Relay(app, gather_seconds=2)
