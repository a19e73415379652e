"""Batches go out together (pipelined publishes, batch POSTs), yet each row keeps its own outcome.

One message of a batch refused by the destination is retried (or failed)
alone; the rest of its batch is marked sent and not sent again.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from joblane.outbox import Relay
from joblane.outbox.sinks import HttpSink, NatsSink, RedisStreamSink
from joblane.outbox.sinks.http import Answer, classify_batch

from .conftest import outbox_rows


def relay(app, **options) -> Relay:
    return Relay(app, **{"listen": False, "lease_seconds": 5.0, **options})


def publish(app, dsn, topic: str, payloads: list, **options) -> list[int]:
    with psycopg.connect(dsn) as c, c.transaction():
        return [app.publish(c, topic, p, **options) for p in payloads]


def states(conn, app) -> dict[int, tuple[str, int, str | None]]:
    return {i: (s, a, e) for i, s, a, _, _, e in outbox_rows(conn, app)}


async def test_a_batch_post_carries_every_key_and_only_the_refused_rows_are_retried_or_failed(
        app, conn, joblane_dsn, receiver):
    answers = {"busy": {"status": 503, "error": "try later", "retry_after": 60}, "bad": 422}

    def respond(req):
        items = req.json
        return 200, {}, json.dumps([answers.get(m["payload"]["case"], 201) for m in items]).encode()

    receiver.respond = respond
    app.route("crm.", HttpSink(receiver.url + "/batch/{topic}", batch=50), backoff=lambda attempt: 0.0)
    cases = ["ok", "busy", "ok", "bad", "ok"]
    ids = publish(app, joblane_dsn, "crm.lead", [{"case": c} for c in cases], headers={"X-Trace": "t1"})
    async with relay(app) as r:
        result = await r.run_once()
        assert (result.sent, result.retried, result.failed) == (3, 1, 1)
        [post] = receiver.posts()
        assert post.path == "/batch/crm.lead" and post.headers["joblane-batch"] == "5"
        assert post.headers["content-type"] == "application/json"
        assert [m["idempotency_key"] for m in post.json] == [f"outbox:{i}" for i in ids]
        assert [m["payload"] for m in post.json] == [{"case": c} for c in cases]
        assert post.json[0]["topic"] == "crm.lead" and post.json[0]["headers"] == {"X-Trace": "t1"}
        rows = states(conn, app)
        assert [rows[i][0] for i in ids] == ["sent", "pending", "sent", "failed", "sent"]
        assert rows[ids[1]] == ("pending", 1, "HTTP 503: try later (in a batch answer)")
        assert rows[ids[3]] == ("failed", 1, "HTTP 422 (in a batch answer)")
        wait = conn.execute(f'SELECT extract(epoch FROM run_after - now()) FROM "{app.schema}".outbox'
                            " WHERE id = %s", (ids[1],)).fetchone()[0]
        assert 50 < wait <= 60, "the element's retry_after is honoured"

        conn.execute(f'UPDATE "{app.schema}".outbox SET run_after = now() WHERE id = %s', (ids[1],))
        answers.clear()
        assert (await r.run_once()).sent == 1
    again = receiver.posts()[1]
    assert [m["idempotency_key"] for m in again.json] == [f"outbox:{ids[1]}"], "only the refused row went again"
    assert [s for s, *_ in states(conn, app).values()] == ["sent", "sent", "sent", "failed", "sent"]


async def test_a_batch_post_refused_as_a_whole_retries_its_rows_and_an_ordered_key_waits_behind_them(
        app, conn, joblane_dsn, receiver):
    receiver.respond = lambda req: (503, {}, b"down") if req.path.endswith("/b") else (200, {}, b"")
    app.route("t.", HttpSink(receiver.url + "/{key}", batch=2), ordered=True)
    a = publish(app, joblane_dsn, "t.x", [{"n": n} for n in range(3)], key="a")
    b = publish(app, joblane_dsn, "t.x", [{"n": n} for n in range(2)], key="b")
    async with relay(app) as r:
        result = await r.run_once()
    # an ordered route sends one row per key at a time: the heads of a and b, then a's second, ...;
    # b's head failing holds b's second back (released), a's go on.
    assert result.claimed == 5
    rows = states(conn, app)
    assert [rows[i][0] for i in a] == ["sent", "sent", "sent"]
    assert rows[b[0]][:2] == ("pending", 1) and "HTTP 503" in rows[b[0]][2]
    assert rows[b[1]][:2] == ("pending", 0)
    assert all(len(p.json) <= 2 for p in receiver.posts())
    assert sorted(len(p.json) for p in receiver.posts() if p.path == "/a") == [1, 1, 1]


async def test_unordered_batch_posts_hold_at_most_batch_messages(app, conn, joblane_dsn, receiver):
    app.route("t.", HttpSink(receiver.url + "/in", batch=4), ordered=False)
    ids = publish(app, joblane_dsn, "t.x", [{"n": n} for n in range(10)])
    async with relay(app) as r:
        assert (await r.run_once()).sent == 10
    assert sorted(len(p.json) for p in receiver.posts()) == [2, 4, 4]
    assert sorted(m["idempotency_key"] for p in receiver.posts() for m in p.json) == sorted(f"outbox:{i}" for i in ids)


def test_batch_answers_are_read_per_element_and_a_wrong_count_retries_all():
    def answer(status: int, body: bytes) -> Answer:
        return Answer(status, "OK" if status < 300 else "Bad Request", {}, body)

    got = classify_batch(answer(200, b'[200, {"status": 429}, {"status": "x"}, true, {"error": "no"}]'), 5)
    assert [d.ok for d in got] == [True, False, False, False, False]
    assert not got[1].permanent and "unreadable status" in got[2].error and "unreadable result" in got[3].error
    assert "unreadable status" in got[4].error, "an element without a status is not taken for a delivery"
    assert all(d.ok for d in classify_batch(answer(202, b"accepted"), 3))
    wrong = classify_batch(answer(200, b"[200]"), 2)
    assert [d.ok for d in wrong] == [False, False] and "1 results for 2 messages" in wrong[0].error
    assert [d.permanent for d in classify_batch(answer(400, b"no"), 2)] == [True, True]
    with pytest.raises(ValueError):
        HttpSink("http://x/", batch=0)


async def test_one_message_jetstream_rejects_in_a_pipelined_batch_is_the_only_one_retried(
        app, conn, joblane_dsn, nats_url):
    import nats

    token = uuid.uuid4().hex[:10]
    stream, prefix = f"JLTEST_{token}", f"jltest{token}"
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{prefix}.>"], max_msg_size=512)
    try:
        app.route(prefix + ".", NatsSink(nats_url, stream=stream), backoff=lambda attempt: 0.0)
        payloads = [{"i": i} for i in range(40)]
        payloads[17] = {"i": 17, "blob": "x" * 2000}  # over the stream's max_msg_size
        ids = publish(app, joblane_dsn, f"{prefix}.e", payloads)
        async with relay(app) as r:
            result = await r.run_once()
            assert (result.sent, result.retried) == (39, 1)
            rows = states(conn, app)
            assert rows[ids[17]][:2] == ("pending", 1) and "JetStream" in rows[ids[17]][2]
            assert {rows[i][0] for i in ids if i != ids[17]} == {"sent"}
            assert (await js.stream_info(stream)).state.messages == 39
            result = await r.run_once()  # only the rejected row comes back, and is refused again
            assert (result.claimed, result.retried) == (1, 1)
        assert (await js.stream_info(stream)).state.messages == 39
        assert states(conn, app)[ids[17]][:2] == ("pending", 2)
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_one_entry_redis_refuses_in_a_pipeline_is_the_only_one_retried(app, conn, joblane_dsn, redis_url):
    import redis.asyncio as aioredis

    token = uuid.uuid4().hex[:10]
    good, bad = f"jltest:{token}:good", f"jltest:{token}:bad"
    client = aioredis.from_url(redis_url)
    await client.set(bad, "a string, not a stream")  # XADD to it answers WRONGTYPE
    try:
        app.route("", RedisStreamSink(redis_url, stream=lambda m: bad if m.key == "bad" else good),
                  ordered=False)
        ids = publish(app, joblane_dsn, "orders.placed", [{"i": i} for i in range(3)])
        [wrong] = publish(app, joblane_dsn, "orders.placed", [{"i": 3}], key="bad")
        ids += publish(app, joblane_dsn, "orders.placed", [{"i": i} for i in range(4, 6)])
        async with relay(app) as r:
            result = await r.run_once()
        assert (result.sent, result.retried) == (5, 1)
        rows = states(conn, app)
        assert rows[wrong][:2] == ("pending", 1) and "WRONGTYPE" in rows[wrong][2]
        entries = await client.xrange(good)
        assert [e[1][b"idempotency_key"].decode() for e in entries] == [f"outbox:{i}" for i in ids]
    finally:
        await client.delete(good, bad)
        await client.aclose()


def test_recording_a_batch_unnests_its_outcomes_once_and_reads_only_its_own_rows(app, conn):
    """finish_outbox: a plan that unnested the outcome arrays again for every row leased to the relay (a nested
    loop over a misjudged scan) cost up to a second per batch with batches in flight side by side; and with
    statistics taken while no relay held a row (what they say nearly always), the planner may compare every row
    of the batch with every outcome in a nested loop: 250-340 ms per 1,000 rows, with four batches in flight,
    against 10-30 ms hashed. The relay records a batch in a transaction that plans no nested loop."""
    from joblane.queries import quote_ident

    from ..helpers import run_sql

    outbox = quote_ident(app.schema) + ".outbox"
    conn.execute(f"INSERT INTO {outbox} (topic, payload, idempotency_key)"
                 " SELECT 't.x', '{}', 'k' || i FROM generate_series(1, 40000) AS i")
    conn.execute(f"ANALYZE {outbox}")  # no row is leased: the statistics say relay is always empty
    conn.execute(f"UPDATE {outbox} SET state = 'sent', sent_at = now() WHERE id <= 4000")
    ids = [r[0] for r in conn.execute(
        f"UPDATE {outbox} SET relay = 'r', lease_until = now() + interval '30 seconds', attempts = 1"
        f" WHERE id IN (SELECT id FROM {outbox} WHERE state = 'pending' ORDER BY id LIMIT 500) RETURNING id")]
    n = len(ids)
    with conn.transaction():
        setting = app.store.hash_joins_only()
        run_sql(conn, setting.sql, setting.args)
        plan = run_sql(conn, "EXPLAIN " + app.queries.finish_outbox,
                       [ids, ["sent"] * n, [1] * n, [0.0] * n, [None] * n, "r"])
        text = "\n".join(r[0] for r in plan)
        assert "Nested Loop" not in text and "Hash Join" in text, text
        assert text.count("Function Scan") == 1 and "CTE result" in text, text  # the arrays are unnested once
        assert "id = ANY" in text, text  # the outbox side yields the batch's rows only, whatever the join
    assert run_sql(conn, "SHOW enable_nestloop") == [("on",)]  # set for that transaction only


async def test_the_relay_records_a_batch_without_nested_loops_and_leaves_its_connections_as_they_were(
        app, conn, joblane_dsn, receiver, monkeypatch):
    from joblane import store

    seen: list[tuple[str, str]] = []
    records = store.records

    async def spy(c, stmt):
        rows = await records(c, stmt)
        seen.append((stmt.name, await c.fetchval("SELECT current_setting('enable_nestloop')")))
        return rows

    monkeypatch.setattr(store, "records", spy)
    app.route("crm.", HttpSink(receiver.url + "/hook"))
    ids = publish(app, joblane_dsn, "crm.lead", [{"i": i} for i in range(3)])
    async with relay(app, concurrency=1) as r:
        assert (await r.run_once()).sent == 3
        assert ("claim_outbox", "on") in seen and ("finish_outbox", "off") in seen
        async with r._pool.acquire() as c:  # a pooled connection keeps the session's setting
            assert await c.fetchval("SELECT current_setting('enable_nestloop')") == "on"
    assert [s for i, (s, *_) in states(conn, app).items() if i in ids] == ["sent"] * 3


async def test_one_message_rabbitmq_returns_in_a_batch_of_confirms_is_the_only_one_retried(
        app, conn, joblane_dsn, rabbitmq_url):
    import aio_pika

    from joblane.outbox.sinks import RabbitMQSink

    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"jltest.{uuid.uuid4().hex[:10]}", exclusive=True)
        nowhere = f"jltest.nowhere.{uuid.uuid4().hex[:10]}"  # no queue: the broker returns it (mandatory)
        app.route("", RabbitMQSink(rabbitmq_url, routing_key=lambda m: nowhere if m.key == "bad" else queue.name))
        ids = publish(app, joblane_dsn, "crm.lead", [{"i": i} for i in range(4)])
        [wrong] = publish(app, joblane_dsn, "crm.lead", [{"i": 4}], key="bad")
        ids += publish(app, joblane_dsn, "crm.lead", [{"i": i} for i in range(5, 8)])
        async with relay(app) as r:
            result = await r.run_once()
        assert (result.sent, result.retried) == (7, 1)
        rows = states(conn, app)
        assert rows[wrong][:2] == ("pending", 1) and "NO_ROUTE" in rows[wrong][2]
        got = []
        for _ in range(7):
            message = await queue.get(timeout=5)
            await message.ack()
            got.append(message.message_id)
        assert sorted(got) == sorted(f"outbox:{i}" for i in ids)
    finally:
        await connection.close()
