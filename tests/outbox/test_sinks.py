"""Each sink against the real broker on this machine: every committed row arrives, with its key in the dedup field."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest

from joblane.outbox import Message, Relay
from joblane.outbox.sinks import KafkaSink, NatsSink, RabbitMQSink, RedisStreamSink

from .conftest import outbox_rows


def publish_rows(app, dsn, topic: str, n: int, *, rollback_one: bool = True, **options) -> list[int]:
    with psycopg.connect(dsn) as c:
        if rollback_one:
            with pytest.raises(ZeroDivisionError):
                with c.transaction():
                    app.publish(c, topic, {"i": -1})
                    1 / 0
        with c.transaction():
            return [app.publish(c, topic, {"i": i}, **options) for i in range(n)]


async def relay_all(app) -> None:
    async with Relay(app, listen=False) as r:
        result = await r.run_once()
        assert result.claimed == result.sent, result


async def test_nats_jetstream_carries_the_key_in_nats_msg_id_and_drops_a_resend(app, conn, joblane_dsn, jetstream):
    js, stream, prefix = jetstream
    sink = NatsSink(stream=stream)
    app.route(prefix + ".", sink)
    ids = publish_rows(app, joblane_dsn, f"{prefix}.lead_created", 5, key="lead-1")
    await relay_all(app)
    info = await js.stream_info(stream)
    assert info.state.messages == 5, "the rolled-back row never arrived"
    got = [await js.get_msg(stream, seq) for seq in range(1, 6)]
    assert [m.headers["Nats-Msg-Id"] for m in got] == [f"outbox:{i}" for i in ids]
    assert [json.loads(m.data) for m in got] == [{"i": i} for i in range(5)]
    assert {m.subject for m in got} == {f"{prefix}.lead_created"}
    assert got[0].headers["Joblane-Key"] == "lead-1"
    # A relay that died before marking re-sends the same rows: JetStream keeps one copy.
    again = [Message(id=i, topic=f"{prefix}.lead_created", key="lead-1", idempotency_key=f"outbox:{i}",
                     body=b"{}", attempt=2) for i in ids]
    await sink.open()
    try:
        assert all(d.ok for d in await sink.send(again))
    finally:
        await sink.close()
    assert (await js.stream_info(stream)).state.messages == 5


async def test_nats_subject_without_a_stream_is_retried_not_marked_sent(app, conn, joblane_dsn, nats_url):
    app.route("", NatsSink(nats_url, timeout=2.0), max_attempts=5)
    publish_rows(app, joblane_dsn, f"nostream{uuid.uuid4().hex[:8]}.x", 1, rollback_one=False)
    async with Relay(app, listen=False) as r:
        result = await r.run_once()
    assert result.retried == 1
    [(_, state, attempts, _, _, error)] = outbox_rows(conn, app)
    assert (state, attempts) == ("pending", 1) and "JetStream" in error


async def test_rabbitmq_carries_the_key_in_message_id_with_confirms(app, conn, joblane_dsn, rabbitmq_url):
    import aio_pika

    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"jltest.{uuid.uuid4().hex[:10]}", exclusive=True)
        app.route("crm.", RabbitMQSink(rabbitmq_url, routing_key=queue.name))
        ids = publish_rows(app, joblane_dsn, "crm.lead_created", 5, headers={"tenant": "acme"})
        await relay_all(app)
        got = []
        for _ in range(5):
            message = await queue.get(timeout=5)
            await message.ack()
            got.append(message)
        assert await queue.get(fail=False) is None, "the rolled-back row never arrived"
        assert [m.message_id for m in got] == [f"outbox:{i}" for i in ids]
        assert [json.loads(m.body) for m in got] == [{"i": i} for i in range(5)]
        assert got[0].headers["tenant"] == "acme" and got[0].headers["Joblane-Topic"] == "crm.lead_created"
        assert got[0].delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    finally:
        await connection.close()


async def test_rabbitmq_unroutable_message_is_retried_not_lost(app, conn, joblane_dsn, rabbitmq_url):
    app.route("", RabbitMQSink(rabbitmq_url, routing_key=f"nobody.listens.{uuid.uuid4().hex}"))
    publish_rows(app, joblane_dsn, "t.x", 1, rollback_one=False)
    async with Relay(app, listen=False) as r:
        assert (await r.run_once()).retried == 1
    [(_, state, _, _, _, error)] = outbox_rows(conn, app)
    assert state == "pending" and "NO_ROUTE" in error


async def test_redis_stream_entries_carry_the_key(app, conn, joblane_dsn, redis_url):
    import redis.asyncio as aioredis

    stream = f"jltest:{uuid.uuid4().hex[:10]}"
    client = aioredis.from_url(redis_url)
    try:
        app.route("", RedisStreamSink(redis_url, stream=stream, maxlen=1000))
        ids = publish_rows(app, joblane_dsn, "orders.placed", 5, key="order-9", idempotency_key=None)
        await relay_all(app)
        entries = await client.xrange(stream)
        assert [e[1][b"idempotency_key"].decode() for e in entries] == [f"outbox:{i}" for i in ids]
        assert [json.loads(e[1][b"payload"]) for e in entries] == [{"i": i} for i in range(5)]
        assert {e[1][b"topic"] for e in entries} == {b"orders.placed"}
        assert {e[1][b"key"] for e in entries} == {b"order-9"}
    finally:
        await client.delete(stream)
        await client.aclose()
    assert {s for _, s, *_ in outbox_rows(conn, app)} == {"sent"}


def test_kafka_record_carries_the_key_in_record_key_and_header():
    """Built without a broker: what the producer is handed."""
    sink = KafkaSink("127.0.0.1:1", topic="events.{topic}")
    keyed = Message(id=7, topic="crm.lead", key="lead-7", idempotency_key="outbox:7", body=b'{"a":1}',
                    headers={"tenant": "acme"})
    plain = Message(id=8, topic="crm.lead", key=None, idempotency_key="biz-8", body=b"{}")
    record = sink.record(keyed)
    assert record["topic"] == "events.crm.lead"
    assert record["key"] == b"lead-7", "the ordering key picks the partition"
    assert record["value"] == b'{"a":1}'
    assert dict(record["headers"]) == {"tenant": b"acme", "Joblane-Topic": b"crm.lead", "Joblane-Key": b"lead-7",
                                       "Idempotency-Key": b"outbox:7"}
    assert sink.record(plain)["key"] == b"biz-8", "without a key, the idempotency key is the record key"
    assert sink.config["enable.idempotence"] is True and sink.config["acks"] == "all"


async def test_kafka_against_a_kafka_protocol_broker(app, conn, joblane_dsn, kafka_broker):
    """Tansu speaks the Kafka protocol; this is not Apache Kafka itself."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"jltest.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    app.route("", KafkaSink(kafka_broker, timeout=10.0))
    ids = publish_rows(app, joblane_dsn, topic, 5, key="lead-1")
    await relay_all(app)
    consumer = Consumer({"bootstrap.servers": kafka_broker, "group.id": "jltest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        for _ in range(100):
            m = await asyncio.to_thread(consumer.poll, 0.2)
            if m is not None and not m.error():
                got.append(m)
            if len(got) == 5:
                break
    finally:
        consumer.close()
    assert [dict(m.headers())["Idempotency-Key"].decode() for m in got] == [f"outbox:{i}" for i in ids]
    assert {m.key() for m in got} == {b"lead-1"}
    assert [json.loads(m.value()) for m in got] == [{"i": i} for i in range(5)]


# -- declare=True: the sink creates its destination ---------------------------------


async def test_nats_declare_creates_the_stream_for_the_route_and_again_after_it_is_deleted(
        app, conn, joblane_dsn, nats_url):
    import nats

    token = uuid.uuid4().hex[:10]
    prefix = f"jldecl{token}"
    sink = NatsSink(nats_url, declare=True, timeout=2.0)
    app.route(prefix + ".", sink)
    assert sink.stream_config() == (f"JOBLANE_JLDECL{token.upper()}", [f"{prefix}.>"])
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"JOBLANE_JLDECL{token.upper()}"
    try:
        ids = publish_rows(app, joblane_dsn, f"{prefix}.lead_created", 3)
        await relay_all(app)
        info = await js.stream_info(stream)
        assert info.config.subjects == [f"{prefix}.>"] and info.state.messages == 3
        assert [(await js.get_msg(stream, s)).headers["Nats-Msg-Id"] for s in (1, 2, 3)] == [f"outbox:{i}" for i in ids]
        # deleted under a running relay: the next try says so, the one after creates it again
        await js.delete_stream(stream)
        m = Message(id=99, topic=f"{prefix}.x", key=None, idempotency_key="outbox:99", body=b"{}")
        [first] = await sink.send([m])
        assert not first.ok and "no JetStream stream captures subject" in first.error
        assert [d.ok for d in await sink.send([m])] == [True]
        assert (await js.stream_info(stream)).state.messages == 1
    finally:
        await sink.close()
        try:
            await js.delete_stream(stream)
        except Exception:
            pass
        await nc.close()


async def test_nats_declare_uses_a_stream_that_already_captures_the_subjects(app, conn, joblane_dsn, jetstream):
    js, stream, prefix = jetstream
    app.route(prefix + ".", NatsSink(declare=True, stream=stream))
    publish_rows(app, joblane_dsn, f"{prefix}.lead_created", 2, rollback_one=False)
    await relay_all(app)
    info = await js.stream_info(stream)
    assert info.state.messages == 2
    assert info.config.subjects == [f"{prefix}.>"], "the stream was left as it was"


def test_nats_declare_refuses_a_route_whose_subjects_it_cannot_tell(app):
    from joblane.errors import JoblaneError

    with pytest.raises(JoblaneError, match=r"route '': cannot tell the stream's subjects .*pass subjects="):
        app.route("", NatsSink(declare=True))
    with pytest.raises(JoblaneError, match="does not end with '.'"):
        app.route("crm", NatsSink(declare=True))
    with pytest.raises(JoblaneError, match="the subject is a function"):
        app.route("crm.", NatsSink(declare=True, subject=lambda m: m.topic))
    assert app.routes == []
    templated = NatsSink(declare=True, subject="events.{topic}", stream="EVENTS")
    app.route("crm.", templated)
    assert templated.stream_config() == ("EVENTS", ["events.crm.>"])
    explicit = NatsSink(declare=True, subjects=["all.>"])
    app.route("", explicit)
    assert explicit.stream_config()[1] == ["all.>"]


async def test_rabbitmq_declare_declares_a_durable_exchange_of_the_given_type(app, conn, joblane_dsn, rabbitmq_url):
    import aio_pika

    exchange = f"jltest.decl.{uuid.uuid4().hex[:8]}"
    app.route("crm.", RabbitMQSink(rabbitmq_url, exchange=exchange, exchange_type="fanout", declare=True))
    ids = publish_rows(app, joblane_dsn, "crm.lead_created", 3, rollback_one=False)
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        async with Relay(app, listen=False) as r:  # opening the sink declares the exchange
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await queue.bind(exchange)
            assert (await r.run_once()).sent == 3
        got = [(await queue.get(timeout=5)).message_id for _ in ids]
        assert got == [f"outbox:{i}" for i in ids]
        # durable and fanout: declaring it so again is accepted, declaring it otherwise is refused
        check = await connection.channel()
        await check.declare_exchange(exchange, aio_pika.ExchangeType.FANOUT, durable=True)
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await check.declare_exchange(exchange, aio_pika.ExchangeType.FANOUT, durable=False)
    finally:
        cleanup = await connection.channel()
        await cleanup.exchange_delete(exchange)
        await connection.close()


def test_rabbitmq_declare_needs_an_exchange_name():
    with pytest.raises(ValueError, match="declare=True needs exchange="):
        RabbitMQSink(declare=True)
